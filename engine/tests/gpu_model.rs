//! The GPU model against the CPU reference on tiny FP8/FP4 checkpoints (the golden one, the synthetic tiny
//! config and one of awkward dimensions), teacher-forced over a prefill plus decode steps; graph replay against
//! eager; batches of 3 and 6 against each sequence alone.
//! SKIPs (passes with a message) without a CUDA GPU. `DSV4_TEST_DATA` overrides `<workspace>/tests/data`.

mod gpu_model_util;

use dsv4_engine::api::Numerics;
use dsv4_engine::backend::{Backend, SeqId, Work};
use dsv4_engine::gpu::GpuBackend;
use dsv4_engine::model::synth::SynthSpec;
use gpu_model_util::*;

fn check_case(case: &Case, numerics: Numerics) {
    let gpu = run_gpu(case, numerics, true);
    let cpu = run_cpu(case, numerics);
    check_reference_gate(&format!("{} {numerics:?}", case.name), &gpu, &cpu);
}

#[test]
fn golden_quant_matches_cpu_reference() {
    let Some(case) = golden_or_skip() else {
        return;
    };
    check_case(&case, Numerics::Reference);
    // The golden README's bf16-engine gate against the independent implementation's logits.
    let set = data_dir()
        .expect("data dir")
        .join("tiny-v4-small/golden/quant");
    let gpu_ref = run_gpu(&case, Numerics::Reference, true);
    let golden = read_npy_rows(&set.join("logits.npy"));
    check_bf16_engine_gate("golden logits.npy", &gpu_ref, &golden);
    let gpu_off = run_gpu(&case, Numerics::Official, true);
    check_official(
        "golden official logits",
        &gpu_off,
        &read_npy_rows(&set.join("logits_official.npy")),
    );
    check_official(
        "CPU official",
        &gpu_off,
        &run_cpu(&case, Numerics::Official),
    );
}

#[test]
fn synthetic_quant_matches_cpu_reference() {
    if !gpu_or_skip() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let case = Case::synthetic(tmp.path(), 150, 40);
    check_case(&case, Numerics::Reference);
    let gpu_off = run_gpu(&case, Numerics::Official, true);
    check_official(
        "synthetic, CPU official",
        &gpu_off,
        &run_cpu(&case, Numerics::Official),
    );
}

/// Dimensions unlike the tiny config's and the real model's, awkward for the kernels: 6 heads of 192 (a
/// partial 16-head group of the split attention), 3 output groups of 2 heads, hidden 384 (three FP8 blocks),
/// a 24-token window, CSA / HCA (ratio 16; 8 in the MTP block) / window layers in another order, 12 experts
/// top-3 behind one hash layer, a 256-wide expert, an indexer of 2 heads of 64 keeping 12 entries.
fn awkward_spec() -> SynthSpec {
    let mut spec = SynthSpec::tiny_default().with_quantized(true);
    spec.hidden_size = 384;
    spec.num_hidden_layers = 4;
    spec.num_attention_heads = 6;
    spec.head_dim = 192;
    spec.q_lora_rank = 256;
    spec.o_groups = 3;
    spec.o_lora_rank = 128;
    spec.sliding_window = 24;
    spec.compress_ratios = vec![4, 16, 0, 4, 8];
    spec.index_n_heads = 2;
    spec.index_head_dim = 64;
    spec.index_topk = 12;
    spec.n_routed_experts = 12;
    spec.num_experts_per_tok = 3;
    spec.moe_intermediate_size = 256;
    spec.num_hash_layers = 1;
    spec.seed = 23;
    spec
}

#[test]
fn other_dimensions_match_cpu_reference() {
    if !gpu_or_skip() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let case = Case::synthetic_spec(tmp.path(), &awkward_spec(), 90, 30);
    check_case(&case, Numerics::Reference);
    check_official(
        "awkward dimensions, CPU official",
        &run_gpu(&case, Numerics::Official, true),
        &run_cpu(&case, Numerics::Official),
    );
}

#[test]
fn graph_replay_equals_eager() {
    let Some(case) = golden_or_skip() else {
        return;
    };
    let short = case.truncated(60, 20);
    let eager = run_gpu(&short, Numerics::Official, false);
    let graph = run_gpu(&short, Numerics::Official, true);
    assert_bits("graph replay vs eager", &graph, &eager);
}

fn feed_all(b: &mut GpuBackend, seqs: &[SeqId], prompts: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let work: Vec<Work<'_>> = seqs
        .iter()
        .zip(prompts)
        .map(|(&seq, p)| Work { seq, tokens: p })
        .collect();
    b.forward(&work).expect("forward")
}

/// A batch gives each sequence the bits it gets alone: 3 rows (the mixer's 2-3-row split, the shared expert
/// forked before the gate) and 6 (the 4-7-row split).
#[test]
fn batches_equal_each_alone() {
    let Some(case) = golden_or_skip() else {
        return;
    };
    let ids = &case.prompt;
    let three: Vec<Vec<u32>> = vec![
        ids[..50].to_vec(),
        ids[50..83].to_vec(),
        ids[100..171].to_vec(),
    ];
    // 190 prompt rows in all: below the 256 rows from which a prefill call takes the wgmma GEMMs and the tiled
    // mixer (other kernels than a sequence alone gets, so other bits).
    let six: Vec<Vec<u32>> = [
        (0, 30),
        (40, 75),
        (100, 120),
        (140, 180),
        (210, 225),
        (250, 300),
    ]
    .iter()
    .map(|&(a, b)| ids[a..b].to_vec())
    .collect();
    check_batch_against_alone(&case, &three);
    check_batch_against_alone(&case, &six);
}

fn check_batch_against_alone(case: &Case, prompts: &[Vec<u32>]) {
    let n = prompts.len();
    let mut batched = gpu_backend(case, Numerics::Official, true);
    let seqs: Vec<SeqId> = (0..n).map(|_| batched.create_seq().expect("seq")).collect();
    let together = feed_all(&mut batched, &seqs, prompts);
    let step: Vec<Vec<u32>> = together.iter().map(|l| vec![argmax(l) as u32]).collect();
    let together2 = feed_all(&mut batched, &seqs, &step);
    for i in 0..n {
        let mut alone = gpu_backend(case, Numerics::Official, true);
        let s = alone.create_seq().expect("seq");
        let a1 = feed_all(&mut alone, &[s], &prompts[i..i + 1]);
        let a2 = feed_all(&mut alone, &[s], &step[i..i + 1]);
        for (x, y) in [(&a1[0], &together[i]), (&a2[0], &together2[i])] {
            assert!(
                bits_equal(x, y),
                "sequence {i}: batch differs from alone (max |d| {})",
                max_diff(x, y)
            );
        }
    }
}

/// Thousands of decode steps (the window ring wraps ~25 times, hundreds of CSA and several HCA
/// windows close) stay as close to the CPU reference as the first ones: no drift in the caches.
#[test]
fn long_run_stays_with_the_cpu_reference() {
    let Some(case) = golden_or_skip() else {
        return;
    };
    let case = case.extended(3000, 4096);
    let mut gpu = gpu_backend_with_context(&case, Numerics::Reference, true, 4096);
    let got = teacher_forced(&mut gpu, &case);
    let want = run_cpu(&case, Numerics::Reference);
    let (agree, median, _) = compare(&got, &want);
    let tail = got.len() - 500;
    let (tail_agree, tail_median, _) = compare(&got[tail..], &want[tail..]);
    eprintln!(
        "{} rows: argmax agreement {agree:.3}, median cosine {median:.6}; last 500: {tail_agree:.3}, {tail_median:.6}",
        got.len()
    );
    assert!(
        agree >= 0.95 && median >= 0.999,
        "whole run: {agree} / {median}"
    );
    assert!(
        tail_agree >= 0.95 && tail_median >= 0.999,
        "last 500 rows: {tail_agree} / {tail_median}"
    );
}
