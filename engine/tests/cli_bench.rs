//! `dsv4 bench` without a GPU: a clear one-line error and a failing status, never a panic. (With a GPU the
//! bench itself runs, which takes minutes and is not a test: the case is skipped there.)

use std::process::Command;

#[test]
fn bench_without_a_gpu_fails_with_the_reason() {
    if matches!(
        dsv4_engine::gpu::probe_gpu(),
        dsv4_engine::gpu::GpuProbe::Available(_)
    ) {
        eprintln!("SKIP: a GPU is present (this case checks the no-GPU error)");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .args([
            "bench",
            "--batches",
            "1",
            "--contexts",
            "4096",
            "--prefill",
            "0",
        ])
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("run dsv4");
    assert!(!out.status.success(), "bench succeeded without a GPU");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dsv4 bench needs a GPU: no usable CUDA GPU"),
        "stderr: {err}"
    );
    assert!(!err.contains("using the CPU backend"), "stderr: {err}");
    assert!(!err.contains("panicked"), "stderr: {err}");
}
