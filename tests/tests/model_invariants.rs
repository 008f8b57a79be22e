//! Invariants of the CPU reference that must hold for any configuration: cached decode equals a
//! cache-free forward, chunked prefill equals one prefill, batching does not change results,
//! and a snapshot restores the exact state.

use dsv4_engine::api::Numerics;
use dsv4_engine::reference::{BatchItem, ForwardOptions, Model};
use dsv4_tests::{golden_set, max_abs_diff};

/// Pseudo-random token ids in `[0, vocab)`.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

fn all_logits(model: &Model, ids: &[u32]) -> Vec<f32> {
    let mut st = model.new_state();
    let opts = ForwardOptions { all_logits: true };
    model
        .forward(
            &mut [BatchItem {
                state: &mut st,
                tokens: ids,
            }],
            opts,
        )
        .remove(0)
        .logits
}

/// Feeds `ids` in chunks of the given sizes (cycled), returning every position's logits.
fn chunked_logits(model: &Model, ids: &[u32], chunks: &[usize]) -> Vec<f32> {
    let mut st = model.new_state();
    let opts = ForwardOptions { all_logits: true };
    let mut out = Vec::new();
    let mut start = 0;
    for &c in chunks.iter().cycle() {
        if start >= ids.len() {
            break;
        }
        let end = (start + c).min(ids.len());
        let item = BatchItem {
            state: &mut st,
            tokens: &ids[start..end],
        };
        out.extend(model.forward(&mut [item], opts).remove(0).logits);
        start = end;
    }
    out
}

pub fn check_invariants(model: &Model, len: usize) {
    let vocab = model.cfg.vocab_size;
    let ids = tokens(len, vocab, 7);
    let whole = all_logits(model, &ids);
    for chunks in [vec![1], vec![200, 1], vec![3, 17, 64], vec![4]] {
        let got = chunked_logits(model, &ids, &chunks);
        let diff = max_abs_diff(&got, &whole);
        assert!(diff <= 1e-4, "chunks {chunks:?}: max |d| {diff}");
    }
    check_batch_and_snapshot(model, &ids, &whole);
}

fn check_batch_and_snapshot(model: &Model, ids: &[u32], whole: &[f32]) {
    let vocab = model.cfg.vocab_size;
    let other = tokens(ids.len() / 2 + 3, vocab, 11);
    let other_whole = all_logits(model, &other);
    // Batch two sequences of different lengths in one call, then decode both together.
    let split = ids.len() - 5;
    let (mut a, mut b) = (model.new_state(), model.new_state());
    let osplit = other.len() - 5;
    let opts = ForwardOptions { all_logits: true };
    model.forward(
        &mut [
            BatchItem {
                state: &mut a,
                tokens: &ids[..split],
            },
            BatchItem {
                state: &mut b,
                tokens: &other[..osplit],
            },
        ],
        opts,
    );
    let snap = a.snapshot();
    for step in 0..5 {
        let out = model.forward(
            &mut [
                BatchItem {
                    state: &mut a,
                    tokens: &ids[split + step..split + step + 1],
                },
                BatchItem {
                    state: &mut b,
                    tokens: &other[osplit + step..osplit + step + 1],
                },
            ],
            opts,
        );
        let (ra, rb) = ((split + step) * vocab, (osplit + step) * vocab);
        assert!(
            max_abs_diff(&out[0].logits, &whole[ra..ra + vocab]) <= 1e-4,
            "batch a {step}"
        );
        assert!(
            max_abs_diff(&out[1].logits, &other_whole[rb..rb + vocab]) <= 1e-4,
            "batch b {step}"
        );
    }
    // Rewind and continue with a different token: must equal a fresh run of that sequence.
    a.restore(&snap);
    let mut alt = ids[..split].to_vec();
    alt.push((ids[split] + 1) % vocab as u32);
    let fresh = all_logits(model, &alt);
    let got = model.forward(
        &mut [BatchItem {
            state: &mut a,
            tokens: &alt[split..],
        }],
        opts,
    );
    let last = (alt.len() - 1) * vocab;
    assert!(
        max_abs_diff(&got[0].logits, &fresh[last..]) <= 1e-4,
        "restore"
    );
}

#[test]
fn golden_model_invariants_both_numerics() {
    let Some(set) = golden_set("tiny-v4-small") else {
        return;
    };
    for numerics in [Numerics::Reference, Numerics::Official] {
        let model = Model::load(&set.join("quant"), numerics).expect("load");
        // 403 tokens: crosses an HCA window (128) three times and many CSA windows.
        check_invariants(&model, 403);
    }
}

#[test]
fn short_prompts_shorter_than_a_window() {
    let Some(set) = golden_set("tiny-v4-small") else {
        return;
    };
    let model = Model::load(&set.join("bf16"), Numerics::Reference).expect("load");
    for len in [1, 2, 3, 5, 12] {
        let ids = tokens(len, model.cfg.vocab_size, len as u64);
        let whole = all_logits(&model, &ids);
        let got = chunked_logits(&model, &ids, &[1]);
        assert!(max_abs_diff(&got, &whole) <= 1e-4, "len {len}");
    }
}

mod synthetic {
    use super::check_invariants;
    use dsv4_engine::api::Numerics;
    use dsv4_engine::model::synth::{write_checkpoint, SynthSpec};
    use dsv4_engine::reference::Model;

    fn build(spec: &SynthSpec, numerics: Numerics) -> (tempfile::TempDir, Model) {
        let dir = tempfile::tempdir().expect("tempdir");
        write_checkpoint(dir.path(), spec).expect("write checkpoint");
        let model = Model::load(dir.path(), numerics).expect("load");
        (dir, model)
    }

    /// Other head counts, head dims, windows, ratios, expert counts and stream counts than the
    /// golden set, in both formats and both numerics.
    fn variants() -> Vec<SynthSpec> {
        let base = SynthSpec::tiny_default();
        let mut wide = base.clone();
        wide.num_attention_heads = 8;
        wide.head_dim = 64;
        wide.qk_rope_head_dim = 32;
        wide.o_groups = 4;
        wide.o_lora_rank = 32;
        wide.sliding_window = 8;
        wide.compress_ratios = vec![4, 8, 0, 16, 4];
        wide.num_hidden_layers = 4;
        wide.num_hash_layers = 1;
        wide.index_n_heads = 2;
        wide.index_head_dim = 64;
        wide.index_topk = 5;
        wide.n_routed_experts = 4;
        wide.num_experts_per_tok = 3;
        wide.hc_mult = 2;
        wide.seed = 3;
        let mut no_mtp = base.clone().with_quantized(true);
        no_mtp.num_nextn_predict_layers = 0;
        no_mtp.compress_ratios = vec![0, 4, 128, 4, 4];
        no_mtp.sliding_window = 32;
        no_mtp.index_topk = 3;
        no_mtp.seed = 9;
        vec![base.with_quantized(true), wide, no_mtp]
    }

    #[test]
    fn invariants_hold_on_other_configurations() {
        for (i, spec) in variants().into_iter().enumerate() {
            let numerics = if i % 2 == 0 {
                Numerics::Official
            } else {
                Numerics::Reference
            };
            let (_dir, model) = build(&spec, numerics);
            check_invariants(&model, 150);
        }
    }
}
