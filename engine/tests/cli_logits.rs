//! `dsv4 logits` end to end on the tiny golden checkpoint: the .npy it writes has the golden
//! shape and values.

use std::path::PathBuf;
use std::process::Command;

fn golden() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-v4-small");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: tests/data/tiny-v4-small missing");
        None
    }
}

/// Float32 payload of an .npy file (header skipped) and its header text.
fn read_npy(path: &std::path::Path) -> (String, Vec<f32>) {
    let b = std::fs::read(path).expect("read npy");
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = String::from_utf8_lossy(&b[10..10 + hlen]).to_string();
    let data = b[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (header, data)
}

#[test]
fn logits_command_reproduces_golden_rows() {
    let Some(set) = golden() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out.npy");
    let status = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .args(["logits", "--model"])
        .arg(set.join("bf16"))
        .arg("--tokens")
        .arg(set.join("golden/bf16/tokens.json"))
        .arg("--out")
        .arg(&out)
        .status()
        .expect("run dsv4");
    assert!(status.success());
    let (header, got) = read_npy(&out);
    assert!(header.contains("'shape': (41, 4096)"), "{header}");
    let (_, want) = read_npy(&set.join("golden/bf16/logits.npy"));
    let diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff <= 1e-3, "max |dlogit| {diff}");
}

#[test]
fn logits_command_reports_a_bad_model_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("t.json");
    std::fs::write(&tokens, r#"{"prompt_ids": [1, 2]}"#).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_dsv4"))
        .args(["logits", "--model", "/nonexistent/model", "--tokens"])
        .arg(&tokens)
        .args(["--out", "/tmp/never.npy"])
        .output()
        .expect("run dsv4");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.json"), "stderr: {err}");
}
