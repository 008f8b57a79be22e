//! The CPU reference model against the golden teacher-forced logits (reference numerics):
//! every row within 1e-3 and the same greedy token on every row.

use dsv4_engine::api::Numerics;
use dsv4_engine::reference::{BatchItem, ForwardOptions, Model};
use dsv4_tests::{argmax, golden_set, max_abs_diff, read_npy_f32, read_tokens};
use std::path::Path;

/// Prefill the prompt, then feed each decode id with the cache: one logits row per call.
fn teacher_forced(model: &Model, prompt: &[u32], fed: &[u32]) -> Vec<Vec<f32>> {
    let mut state = model.new_state();
    let mut rows = Vec::new();
    let mut feed = |tokens: &[u32]| {
        let mut batch = [BatchItem {
            state: &mut state,
            tokens,
        }];
        model
            .forward(&mut batch, ForwardOptions::default())
            .remove(0)
            .logits
    };
    rows.push(feed(prompt));
    for &t in fed {
        rows.push(feed(&[t]));
    }
    rows
}

fn check_variant(set: &Path, variant: &str) {
    let model = Model::load(&set.join(variant), Numerics::Reference).expect("load model");
    let golden = set.join("golden").join(variant);
    let tokens = read_tokens(&golden.join("tokens.json")).expect("tokens");
    let (shape, want) = read_npy_f32(&golden.join("logits.npy")).expect("logits");
    let vocab = shape[1];
    let got = teacher_forced(&model, &tokens.prompt_ids, &tokens.decode_fed_ids);
    assert_eq!(got.len(), shape[0]);
    let mut worst = 0.0f32;
    for (r, row) in got.iter().enumerate() {
        let want_row = &want[r * vocab..(r + 1) * vocab];
        let diff = max_abs_diff(row, want_row);
        worst = worst.max(diff);
        assert!(diff <= 1e-3, "{variant} row {r}: max |dlogit| {diff}");
        assert_eq!(
            argmax(row),
            argmax(want_row),
            "{variant} row {r}: greedy id differs"
        );
    }
    eprintln!(
        "{} {variant}: {} rows, worst max |dlogit| {worst:.3e}",
        set.display(),
        got.len()
    );
}

#[test]
fn small_bf16_logits_match_golden() {
    if let Some(set) = golden_set("tiny-v4-small") {
        check_variant(&set, "bf16");
    }
}

#[test]
fn small_quant_logits_match_golden() {
    if let Some(set) = golden_set("tiny-v4-small") {
        check_variant(&set, "quant");
    }
}

#[test]
fn real_vocab_bf16_logits_match_golden() {
    if let Some(set) = golden_set("tiny-v4") {
        check_variant(&set, "bf16");
    }
}

#[test]
fn real_vocab_quant_logits_match_golden() {
    if let Some(set) = golden_set("tiny-v4") {
        check_variant(&set, "quant");
    }
}
