//! `dsv4 bench` without a GPU: a clear one-line error and a failing status, never a panic. (With a GPU the
//! bench itself runs, which takes minutes and is not a test: the case is skipped there.)

use std::process::{Command, Output};

/// `dsv4 bench ARGS` without backtraces (the error output is what the cases read).
fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .arg("bench")
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("run dsv4")
}

#[test]
fn bench_without_a_gpu_fails_with_the_reason() {
    if matches!(
        dsv4_engine::gpu::probe_gpu(),
        dsv4_engine::gpu::GpuProbe::Available(_)
    ) {
        eprintln!("SKIP: a GPU is present (this case checks the no-GPU error)");
        return;
    }
    let out = bench(&["--batches", "1", "--contexts", "4096", "--prefill", "0"]);
    assert!(!out.status.success(), "bench succeeded without a GPU");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dsv4 bench needs a GPU: no usable CUDA GPU"),
        "stderr: {err}"
    );
    assert!(!err.contains("using the CPU backend"), "stderr: {err}");
    assert!(!err.contains("panicked"), "stderr: {err}");
}

/// Settings the bench cannot time are rejected up front, with or without a GPU, naming the value: a batch
/// above the 64 rows of a decode step (it used to be skipped silently), none at all, zero timed steps.
#[test]
fn bench_rejects_settings_it_cannot_time() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--batches", "1,100"],
            "--batches: 100 rows is outside 1..=64",
        ),
        (&["--batches", "0"], "--batches: 0 rows is outside 1..=64"),
        (&["--steps", "0"], "--steps: time at least one step"),
    ];
    for (args, want) in cases {
        let out = bench(&[args, &["--prefill", "0"]].concat());
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: stderr: {err}");
        assert!(!err.contains("panicked"), "{args:?}: stderr: {err}");
    }
}
