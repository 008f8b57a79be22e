//! The `official` numerics (activation fake-quantisation) against the golden official outputs:
//! quantizers bit-exact, each layer teacher-forced on the stored streams, logits as a smoke test
//! (the golden README explains why only these gates separate mistakes from rounding noise).

use dsv4_engine::api::Numerics;
use dsv4_engine::reference::quant::{fake_quant_fp4, fake_quant_fp8, hadamard};
use dsv4_engine::reference::{BatchItem, ForwardOptions, Model};
use dsv4_tests::{argmax, golden_set, read_npy_f32, read_safetensors_f32, read_tokens};
use std::path::Path;

fn assert_bit_exact(name: &str, got: &[f32], want: &[f32]) {
    let bad = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    assert_eq!(bad, 0, "{name}: {bad} elements differ");
}

#[test]
fn quantizers_are_bit_exact() {
    let Some(set) = golden_set("tiny-v4-small") else {
        return;
    };
    let cases =
        read_safetensors_f32(&set.join("golden/quantizer_cases.safetensors")).expect("cases");
    let apply = |input: &str, width: usize, f: &dyn Fn(&mut [f32])| -> Vec<f32> {
        let mut v = cases[input].1.clone();
        v.chunks_mut(width).for_each(f);
        v
    };
    let q8 = |block: usize| move |r: &mut [f32]| fake_quant_fp8(r, block);
    assert_bit_exact(
        "q8_block128",
        &apply("q8_in", 256, &q8(128)),
        &cases["q8_block128"].1,
    );
    assert_bit_exact(
        "q8_block64",
        &apply("q8_in", 256, &q8(64)),
        &cases["q8_block64"].1,
    );
    let q4 = |r: &mut [f32]| fake_quant_fp4(r, 32);
    assert_bit_exact(
        "q4_block32",
        &apply("q4_in", 128, &q4),
        &cases["q4_block32"].1,
    );
    assert_bit_exact(
        "had128",
        &apply("q4_in", 128, &hadamard),
        &cases["had128"].1,
    );
    let had_q4 = |r: &mut [f32]| {
        hadamard(r);
        fake_quant_fp4(r, 32);
    };
    assert_bit_exact(
        "had_q4_block32",
        &apply("q4_in", 128, &had_q4),
        &cases["had_q4_block32"].1,
    );
}

/// Fraction of positions whose largest |difference| exceeds 1e-3 of the reference's max.
fn off_fraction(got: &[f32], want: &[f32], width: usize) -> f32 {
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let off = got
        .chunks(width)
        .zip(want.chunks(width))
        .filter(|(g, w)| g.iter().zip(*w).any(|(a, b)| (a - b).abs() > 1e-3 * scale))
        .count();
    off as f32 / (got.len() / width) as f32
}

fn check_layers(set: &Path, variant: &str) {
    let model = Model::load(&set.join(variant), Numerics::Official).expect("load model");
    let golden = set.join("golden").join(variant);
    let tokens = read_tokens(&golden.join("tokens.json")).expect("tokens");
    let streams =
        read_safetensors_f32(&golden.join("official_streams.safetensors")).expect("streams");
    let layers = model.cfg.num_hidden_layers;
    let width = model.cfg.hc_mult * model.cfg.hidden_size;
    for layer in 0..layers {
        let mut x = streams[&format!("layers.{layer}.input_streams")].1.clone();
        model.run_block(layer, &mut x, &tokens.all_ids);
        let next = if layer + 1 < layers {
            format!("layers.{}.input_streams", layer + 1)
        } else {
            "final_streams".to_string()
        };
        let frac = off_fraction(&x, &streams[&next].1, width);
        assert!(
            frac <= 0.4,
            "{variant} layer {layer}: {frac} of positions off"
        );
    }
}

fn check_logits_smoke(set: &Path, variant: &str) {
    let model = Model::load(&set.join(variant), Numerics::Official).expect("load model");
    let golden = set.join("golden").join(variant);
    let tokens = read_tokens(&golden.join("tokens.json")).expect("tokens");
    let (shape, want) = read_npy_f32(&golden.join("logits_official.npy")).expect("logits");
    let vocab = shape[1];
    let mut state = model.new_state();
    let mut rows = Vec::new();
    let mut feed = |t: &[u32]| {
        let mut b = [BatchItem {
            state: &mut state,
            tokens: t,
        }];
        rows.push(
            model
                .forward(&mut b, ForwardOptions::default())
                .remove(0)
                .logits,
        );
    };
    feed(&tokens.prompt_ids);
    tokens.decode_fed_ids.iter().for_each(|&t| feed(&[t]));
    let mut diffs = Vec::new();
    let mut agree = 0;
    for (r, row) in rows.iter().enumerate() {
        let w = &want[r * vocab..(r + 1) * vocab];
        diffs.push(dsv4_tests::max_abs_diff(row, w));
        agree += usize::from(argmax(row) == argmax(w));
    }
    diffs.sort_by(f32::total_cmp);
    let median = diffs[diffs.len() / 2];
    let agreement = agree as f32 / rows.len() as f32;
    assert!(median <= 1.0, "{variant}: median row max |dlogit| {median}");
    assert!(agreement >= 0.7, "{variant}: argmax agreement {agreement}");
}

#[test]
fn small_official_layers_within_noise() {
    if let Some(set) = golden_set("tiny-v4-small") {
        check_layers(&set, "bf16");
        check_layers(&set, "quant");
    }
}

#[test]
fn small_official_logits_smoke() {
    if let Some(set) = golden_set("tiny-v4-small") {
        check_logits_smoke(&set, "bf16");
        check_logits_smoke(&set, "quant");
    }
}
