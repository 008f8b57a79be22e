//! Per-layer activations, compressed caches and MTP logits of the CPU reference against the
//! golden `activations.safetensors` / `mtp.safetensors` (reference numerics).

use dsv4_engine::api::Numerics;
use dsv4_engine::reference::{BatchItem, Model, Probe};
use dsv4_tests::{argmax, golden_set, max_abs_diff, read_safetensors_f32, read_tokens};
use std::collections::HashMap;
use std::path::Path;

#[derive(Default)]
struct Recorder(HashMap<String, Vec<f32>>);

impl Probe for Recorder {
    fn record(&mut self, name: &str, data: &[f32]) {
        self.0.insert(name.to_string(), data.to_vec());
    }
}

/// Router choices must match as sets, except where the golden top-k gap says the choice is a
/// near tie that a correct implementation may break differently.
fn check_router(name: &str, got: &[f32], want: &[f32], gap: Option<&[f32]>, k: usize) {
    for (t, (g, w)) in got.chunks(k).zip(want.chunks(k)).enumerate() {
        let mut g = g.to_vec();
        let mut w = w.to_vec();
        g.sort_by(f32::total_cmp);
        w.sort_by(f32::total_cmp);
        let near_tie = gap.is_some_and(|gap| gap[t] < 1e-4);
        assert!(
            g == w || near_tie,
            "{name} position {t}: experts {g:?} vs {w:?}"
        );
    }
}

fn check_variant(set: &Path, variant: &str) {
    let model = Model::load(&set.join(variant), Numerics::Reference).expect("load model");
    let golden = set.join("golden").join(variant);
    let tokens = read_tokens(&golden.join("tokens.json")).expect("tokens");
    let want = read_safetensors_f32(&golden.join("activations.safetensors")).expect("activations");
    let mut state = model.new_state();
    let mut rec = Recorder::default();
    let streams = model.forward_streams(
        &mut [BatchItem {
            state: &mut state,
            tokens: &tokens.all_ids,
        }],
        Some(&mut rec),
    );
    let k = model.cfg.num_experts_per_tok;
    let mut compared = 0;
    for (name, got) in &rec.0 {
        let Some((_, w)) = want.get(name) else {
            continue;
        };
        if name.ends_with("router_experts") {
            let gap_name = name.replace("router_experts", "router_topk_gap");
            let gap = want.get(&gap_name).map(|(_, g)| g.as_slice());
            check_router(name, got, w, gap, k);
        } else {
            let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let diff = max_abs_diff(got, w);
            assert!(
                diff <= 1e-4 * scale,
                "{variant} {name}: max |d| {diff} vs max |ref| {scale}"
            );
        }
        compared += 1;
    }
    assert!(
        compared >= 8 * model.cfg.num_hidden_layers,
        "only {compared} activations compared"
    );
    check_compressed(&model, &state, &want, variant);
    check_mtp(&model, &streams, &tokens.all_ids, &golden, variant);
}

fn check_compressed(
    model: &Model,
    state: &dsv4_engine::reference::SeqState,
    want: &HashMap<String, (Vec<usize>, Vec<f32>)>,
    variant: &str,
) {
    let mut checked = 0;
    for (layer, ls) in state.layers.iter().enumerate() {
        let Some((shape, w)) = want.get(&format!("layers.{layer}.compressed_kv")) else {
            continue;
        };
        assert_eq!(
            ls.compressed.len(),
            w.len(),
            "layer {layer}: entries {shape:?}"
        );
        let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(&ls.compressed, w);
        assert!(
            diff <= 1e-4 * scale,
            "{variant} layer {layer} compressed_kv: {diff}"
        );
        checked += 1;
    }
    let compressed_layers = (0..model.cfg.num_hidden_layers)
        .filter(|&l| model.cfg.compress_ratios[l] != 0)
        .count();
    assert_eq!(checked, compressed_layers);
}

fn check_mtp(model: &Model, streams: &[f32], all_ids: &[u32], golden: &Path, variant: &str) {
    let want = read_safetensors_f32(&golden.join("mtp.safetensors")).expect("mtp");
    let mut st = model.new_mtp_state().expect("model has an MTP block");
    let logits = model
        .mtp_forward(&mut st, streams, &all_ids[1..])
        .expect("mtp logits");
    let vocab = model.cfg.vocab_size;
    let rows = all_ids.len() - 1;
    let (_, argmax_want) = &want["mtp_argmax"];
    for t in 0..rows {
        let row = &logits[t * vocab..(t + 1) * vocab];
        assert_eq!(argmax(row) as f32, argmax_want[t], "{variant} MTP row {t}");
    }
    let (_, last) = &want["mtp_logits_last"];
    let tail = &logits[(rows - 4) * vocab..rows * vocab];
    let diff = max_abs_diff(tail, last);
    assert!(diff <= 1e-3, "{variant} MTP last logits: max |d| {diff}");
}

#[test]
fn small_bf16_activations_and_mtp_match_golden() {
    if let Some(set) = golden_set("tiny-v4-small") {
        check_variant(&set, "bf16");
    }
}

#[test]
fn small_quant_activations_and_mtp_match_golden() {
    if let Some(set) = golden_set("tiny-v4-small") {
        check_variant(&set, "quant");
    }
}

#[test]
fn real_vocab_activations_and_mtp_match_golden() {
    if let Some(set) = golden_set("tiny-v4") {
        check_variant(&set, "bf16");
        check_variant(&set, "quant");
    }
}
