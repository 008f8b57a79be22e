//! The GPU model on the `tiny-v4` golden set (the real 129280-token vocabulary, so the head and the
//! device argmax run at full width): against the CPU reference (which CI checks against the
//! golden logits) with the GPU model tests' reference gate and, when the set's `golden/quant/logits.npy` is present, against the independent
//! implementation's logits with the golden README's bf16-engine gate. The set is read from
//! `DSV4_GOLDEN_V4` or `../shared/golden/tiny-v4`; SKIPs without it or without a GPU.
mod gpu_model_util;

use dsv4_engine::api::Numerics;
use dsv4_engine::gpu::{probe_gpu, GpuProbe};
use gpu_model_util::*;
use std::path::PathBuf;

fn golden_set() -> Option<PathBuf> {
    let dir = match std::env::var_os("DSV4_GOLDEN_V4") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/tiny-v4"),
    };
    dir.join("quant/config.json").exists().then_some(dir)
}

#[test]
fn tiny_v4_quant_matches_cpu_and_golden() {
    if let GpuProbe::Unavailable(why) = probe_gpu() {
        eprintln!("SKIP: {why}");
        return;
    }
    let Some(set) = golden_set() else {
        eprintln!(
            "SKIP: tiny-v4 golden set not found (DSV4_GOLDEN_V4 or ../shared/golden/tiny-v4)"
        );
        return;
    };
    let case = Case::golden(&set);
    let gpu = run_gpu(&case, Numerics::Reference, true);
    check_reference_gate(
        "tiny-v4 vs CPU reference",
        &gpu,
        &run_cpu(&case, Numerics::Reference),
    );
    let logits = set.join("golden/quant/logits.npy");
    if logits.exists() {
        let (agree, cos, _) = compare(&gpu, &read_npy_rows(&logits));
        eprintln!("tiny-v4 vs golden logits: argmax {agree:.3}, median cosine {cos:.6}");
        assert!(
            agree >= 0.75 && cos >= 0.999,
            "bf16-engine gate: {agree} / {cos}"
        );
    } else {
        eprintln!("(golden logits.npy absent: compared with the CPU reference only)");
    }
}
