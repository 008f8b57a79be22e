//! `dsv4 encode` reproduces every chat-encoding example to the id.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn encode_command_reproduces_the_examples() {
    let cases =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/chat-encoding-examples.json");
    let out = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .arg("encode")
        .arg("--cases")
        .arg(&cases)
        .output()
        .expect("run dsv4 encode");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json output");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cases).expect("read cases"))
            .expect("cases json");
    let (got, want) = (
        got.as_array().expect("array"),
        want.as_array().expect("array"),
    );
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g["name"], w["name"]);
        assert_eq!(g["rendered"], w["rendered"], "{}", w["name"]);
        assert_eq!(g["ids"], w["ids"], "{}", w["name"]);
    }
}

#[test]
fn generate_runs_on_the_demo_model() {
    let cache = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .env("DSV4_CACHE_DIR", cache.path())
        .args([
            "generate",
            "--prompt",
            "Hello",
            "--max-tokens",
            "5",
            "--temperature",
            "0",
        ])
        .output()
        .expect("run dsv4 generate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("noise"),
        "the demo model must say its replies are noise: {err}"
    );
    assert!(err.contains("5 generated"), "{err}");
}
