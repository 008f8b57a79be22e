//! The GPU runner on a BF16-stored checkpoint (every linear and routed expert in BF16: the golden
//! set's `bf16/` variant), teacher-forced over the 363-token prompt plus 40 decode steps: against the
//! CPU reference in both numerics, against the independent implementation's golden logits, and graph
//! replay against eager. The batched prefill reads FP8/FP4 weights only, so the prompt runs as decode
//! steps here. SKIPs (passes with a message) without a CUDA GPU. `DSV4_TEST_DATA` overrides
//! `<workspace>/tests/data`.

mod gpu_model_util;

use dsv4_engine::api::Numerics;
use gpu_model_util::*;

/// Reference numerics against the CPU reference (the runner's own gate) and against the golden
/// `logits.npy` (the README's bf16-engine gate: median cosine >= 0.999, argmax agreement >= 0.75).
#[test]
fn golden_bf16_matches_cpu_reference() {
    let Some(case) = golden_bf16_or_skip() else {
        return;
    };
    let gpu = run_gpu(&case, Numerics::Reference, true);
    let cpu = run_cpu(&case, Numerics::Reference);
    check_reference_gate("golden bf16 Reference vs CPU", &gpu, &cpu);
    let set = data_dir()
        .expect("data dir")
        .join("tiny-v4-small/golden/bf16");
    let golden = read_npy_rows(&set.join("logits.npy"));
    check_bf16_engine_gate("golden bf16 logits.npy", &gpu, &golden);
}

/// Official numerics on BF16 weights: no activation quantisation before the (BF16) GEMMs, only the KV
/// Q8 and indexer Hadamard + Q4 simulations (golden README, "Official numerics"); the README's smoke
/// gate against the golden official logits and against the CPU reference's official numerics.
#[test]
fn golden_bf16_official_matches_cpu_reference() {
    let Some(case) = golden_bf16_or_skip() else {
        return;
    };
    let gpu = run_gpu(&case, Numerics::Official, true);
    let set = data_dir()
        .expect("data dir")
        .join("tiny-v4-small/golden/bf16");
    check_official(
        "golden bf16 official logits",
        &gpu,
        &read_npy_rows(&set.join("logits_official.npy")),
    );
    check_official(
        "golden bf16 CPU official",
        &gpu,
        &run_cpu(&case, Numerics::Official),
    );
}

/// CUDA-graph replay of the decode steps is bit-identical to eager launches, in both numerics.
#[test]
fn bf16_graph_replay_equals_eager() {
    let Some(case) = golden_bf16_or_skip() else {
        return;
    };
    let short = case.truncated(60, 20);
    for numerics in [Numerics::Official, Numerics::Reference] {
        let eager = run_gpu(&short, numerics, false);
        let graph = run_gpu(&short, numerics, true);
        assert_bits(
            &format!("bf16 {numerics:?}: graph replay vs eager"),
            &graph,
            &eager,
        );
    }
}
