use super::header::write_test_shard;
use super::*;
use std::fs;

/// Writes a small fake DeepSeek-V4 checkpoint: config, index and two shard headers.
fn write_fake_checkpoint(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "model_type": "deepseek_v4",
        "num_hidden_layers": 3,
        "head_dim": 64,
        "index_head_dim": 32,
        "sliding_window": 16,
        "compress_ratios": [0, 4, 128, 0],
        "expert_dtype": "fp4",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"},
    });
    fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let index = serde_json::json!({"weight_map": {
        "embed.weight": "model-00001.safetensors",
        "layers.0.attn.wq_a.weight": "model-00001.safetensors",
        "layers.0.ffn.experts.0.w1.weight": "model-00002.safetensors",
    }});
    fs::write(dir.join(INDEX), index.to_string()).unwrap();
    write_test_shard(
        &dir.join("model-00001.safetensors"),
        &[
            ("embed.weight", "BF16", 256),
            ("layers.0.attn.wq_a.weight", "F8_E4M3", 128),
        ],
    );
    write_test_shard(
        &dir.join("model-00002.safetensors"),
        &[
            ("layers.0.ffn.experts.0.w1.weight", "I8", 64),
            ("s", "F8_E8M0", 8),
        ],
    );
}

const INDEX: &str = "model.safetensors.index.json";

#[test]
fn finds_a_valid_checkpoint_in_a_parent_folder() {
    let root = tempfile::tempdir().unwrap();
    write_fake_checkpoint(&root.path().join("dsv4-small"));
    let found = scan_folders(&[root.path().to_path_buf()]);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, "dsv4-small");
    let summary = found[0].result.as_ref().unwrap();
    assert_eq!(summary.layers, 3);
    assert_eq!(summary.shards, 2);
    assert_eq!(summary.weights_bytes, 256 + 128 + 64 + 8);
    assert_eq!(summary.formats_text(), "bf16 + fp8 + fp4");
    assert!(summary.size_on_disk > summary.weights_bytes);
    assert_eq!(summary.cache.compress_ratios, vec![0, 4, 128, 0]);
}

#[test]
fn a_listed_checkpoint_folder_is_scanned_directly() {
    let root = tempfile::tempdir().unwrap();
    write_fake_checkpoint(root.path());
    let found = scan_folders(&[root.path().to_path_buf()]);
    assert_eq!(found.len(), 1);
    assert!(found[0].result.is_ok());
}

#[test]
fn foreign_models_are_listed_with_their_type() {
    let root = tempfile::tempdir().unwrap();
    let llama = root.path().join("llama");
    fs::create_dir_all(&llama).unwrap();
    fs::write(llama.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let found = scan_folders(&[root.path().to_path_buf()]);
    assert_eq!(found[0].result, Err(ScanProblem::Foreign("llama".into())));
}

#[test]
fn broken_checkpoints_are_listed_with_the_reason() {
    let root = tempfile::tempdir().unwrap();
    let no_index = root.path().join("a-no-index");
    write_fake_checkpoint(&no_index);
    fs::remove_file(no_index.join(INDEX)).unwrap();

    let missing_shard = root.path().join("b-missing-shard");
    write_fake_checkpoint(&missing_shard);
    fs::remove_file(missing_shard.join("model-00002.safetensors")).unwrap();

    let bad_header = root.path().join("c-bad-header");
    write_fake_checkpoint(&bad_header);
    fs::write(bad_header.join("model-00001.safetensors"), [0xff; 12]).unwrap();

    let bad_config = root.path().join("d-bad-config");
    write_fake_checkpoint(&bad_config);
    fs::write(bad_config.join("config.json"), "{ nope").unwrap();

    let found = scan_folders(&[root.path().to_path_buf()]);
    let reasons: Vec<String> = found
        .iter()
        .map(|m| m.result.as_ref().unwrap_err().to_string())
        .collect();
    assert_eq!(found.len(), 4, "{reasons:?}");
    assert!(reasons[0].contains("index") && reasons[0].contains("missing"));
    assert!(reasons[1].contains("model-00002") && reasons[1].contains("missing"));
    assert!(reasons[2].contains("model-00001") && reasons[2].contains("header"));
    assert!(reasons[3].contains("config.json"));
}

#[test]
fn empty_and_missing_folders_are_reported() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("nowhere");
    let found = scan_folders(&[root.path().to_path_buf(), missing]);
    assert_eq!(found[0].result, Err(ScanProblem::NothingFound));
    assert_eq!(found[1].result, Err(ScanProblem::NotAFolder));
}

#[test]
fn estimate_uses_the_checkpoint_config() {
    let root = tempfile::tempdir().unwrap();
    write_fake_checkpoint(root.path());
    let summary = inspect_checkpoint(root.path()).unwrap();
    // ratio 4: (64 + 32) * 2 / 4 = 48; ratio 128: 64 * 2 / 128 = 1.
    assert_eq!(estimate::cache_bytes_per_token(&summary.cache), 49.0);
    let needed = estimate::memory_needed(summary.weights_bytes, &summary.cache, 1000);
    assert!(needed > summary.weights_bytes + 49_000);
}
