//! Every malformed-checkpoint case gives a typed error whose message names the file and,
//! where there is one, the tensor, with what was expected and what was found.
#![allow(clippy::unwrap_used)]

use dsv4_engine::model::checkpoint::{Checkpoint, CheckpointError};
use dsv4_engine::model::synth::{write_checkpoint, SynthSpec};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

const INDEX: &str = "model.safetensors.index.json";

/// A small quantised model in 2 shards: FP8 linears, FP4 experts, one hash layer, one CSA.
fn small(dir: &Path) {
    let spec = SynthSpec {
        vocab_size: 64,
        hidden_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        head_dim: 64,
        qk_rope_head_dim: 32,
        q_lora_rank: 64,
        o_groups: 1,
        o_lora_rank: 32,
        compress_ratios: vec![0, 4, 0],
        index_n_heads: 2,
        index_head_dim: 32,
        n_routed_experts: 4,
        moe_intermediate_size: 64,
        num_hash_layers: 1,
        hc_mult: 2,
        shards: 2,
        ..SynthSpec::tiny_default()
    }
    .with_quantized(true);
    write_checkpoint(dir, &spec).unwrap();
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    small(dir.path());
    dir
}

fn open_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("opened a broken checkpoint"),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The shard file (full path) that the index assigns `tensor` to.
fn shard_of(dir: &Path, tensor: &str) -> PathBuf {
    let idx = read_json(&dir.join(INDEX));
    dir.join(idx["weight_map"][tensor].as_str().unwrap())
}

/// Splits a safetensors file into (header JSON, data bytes).
fn split(path: &Path) -> (Map<String, Value>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice::<Value>(&bytes[8..8 + n]).unwrap();
    (header.as_object().unwrap().clone(), bytes[8 + n..].to_vec())
}

fn join(path: &Path, header: &Map<String, Value>, data: &[u8]) {
    let head = serde_json::to_vec(header).unwrap();
    let mut out = (head.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&head);
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// Rewrites one header entry of the shard holding `tensor`.
fn edit_entry(dir: &Path, tensor: &str, f: impl FnOnce(&mut Value)) {
    let path = shard_of(dir, tensor);
    let (mut header, data) = split(&path);
    f(header.get_mut(tensor).unwrap());
    join(&path, &header, &data);
}

/// Overwrites byte `k` of `tensor`'s data.
fn poke(dir: &Path, tensor: &str, k: usize, value: u8) {
    let path = shard_of(dir, tensor);
    let (header, mut data) = split(&path);
    let start = header[tensor]["data_offsets"][0].as_u64().unwrap() as usize;
    data[start + k] = value;
    join(&path, &header, &data);
}

fn edit_index(dir: &Path, f: impl FnOnce(&mut Map<String, Value>)) {
    let mut idx = read_json(&dir.join(INDEX));
    f(idx["weight_map"].as_object_mut().unwrap());
    std::fs::write(dir.join(INDEX), idx.to_string()).unwrap();
}

#[test]
fn missing_tensor_names_the_index_and_tensor() {
    let dir = setup();
    edit_index(dir.path(), |m| {
        m.remove("layers.0.attn.wkv.scale");
    });
    let msg = open_err(dir.path());
    assert_mentions(
        &msg,
        &[
            INDEX,
            "`layers.0.attn.wkv.scale`",
            "missing",
            "F8_E8M0 [1, 1]",
        ],
    );
}

#[test]
fn wrong_shape_names_shard_tensor_and_both_shapes() {
    let dir = setup();
    let name = "layers.1.attn_norm.weight";
    edit_entry(dir.path(), name, |e| e["shape"] = json!([1, 64]));
    let msg = open_err(dir.path());
    let shard = shard_of(dir.path(), name);
    let file = shard.file_name().unwrap().to_str().unwrap();
    assert_mentions(
        &msg,
        &[
            file,
            "`layers.1.attn_norm.weight`",
            "wrong shape",
            "expected BF16 [64]",
            "found BF16 [1, 64]",
        ],
    );
}

#[test]
fn wrong_dtype_names_shard_tensor_and_both_dtypes() {
    let dir = setup();
    let name = "layers.0.attn.attn_sink";
    edit_entry(dir.path(), name, |e| e["dtype"] = json!("I32"));
    let msg = open_err(dir.path());
    assert_mentions(
        &msg,
        &[
            "model-0000",
            "`layers.0.attn.attn_sink`",
            "wrong dtype",
            "expected F32 [2]",
            "found I32 [2]",
        ],
    );
}

#[test]
fn quantised_weight_stored_as_bf16_is_a_dtype_error() {
    let dir = setup();
    let name = "layers.1.attn.wq_a.weight";
    edit_entry(dir.path(), name, |e| {
        e["dtype"] = json!("BF16");
        e["shape"] = json!([64, 32]);
    });
    let msg = open_err(dir.path());
    assert_mentions(
        &msg,
        &[
            "`layers.1.attn.wq_a.weight`",
            "expected F8_E4M3 [64, 64]",
            "found BF16 [64, 32]",
        ],
    );
}

#[test]
fn truncated_shard_names_the_shard_and_the_cut_tensor() {
    let dir = setup();
    let path = dir.path().join("model-00002-of-00002.safetensors");
    let (header, data) = split(&path);
    let last = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .max_by_key(|(_, v)| v["data_offsets"][1].as_u64().unwrap())
        .map(|(k, _)| k.clone())
        .unwrap();
    // Cut 2 bytes: only the last tensor (4 bytes or more) loses data.
    join(&path, &header, &data[..data.len() - 2]);
    let msg = open_err(dir.path());
    assert_mentions(
        &msg,
        &[
            "model-00002-of-00002.safetensors",
            &format!("`{last}`"),
            "truncated",
        ],
    );
}

#[test]
fn shard_named_in_index_but_absent() {
    let dir = setup();
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let msg = open_err(dir.path());
    assert_mentions(
        &msg,
        &[
            "model-00002-of-00002.safetensors",
            "tensor `",
            "does not exist",
        ],
    );
}

#[test]
fn index_entry_absent_from_shard_header() {
    let dir = setup();
    edit_index(dir.path(), |m| {
        m.insert(
            "layers.0.ghost".into(),
            json!("model-00001-of-00002.safetensors"),
        );
    });
    let msg = open_err(dir.path());
    assert_mentions(
        &msg,
        &[
            "model-00001-of-00002.safetensors",
            "`layers.0.ghost`",
            "absent from its header",
        ],
    );
}

#[test]
fn malformed_index_json() {
    let dir = setup();
    std::fs::write(dir.path().join(INDEX), "{\"weight_map\": {").unwrap();
    assert_mentions(&open_err(dir.path()), &[INDEX, "malformed index JSON"]);
}

#[test]
fn malformed_header_json() {
    let dir = setup();
    let path = dir.path().join("model-00001-of-00002.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = b'x';
    std::fs::write(&path, bytes).unwrap();
    assert_mentions(
        &open_err(dir.path()),
        &[
            "model-00001-of-00002.safetensors",
            "malformed safetensors header JSON",
        ],
    );
}

#[test]
fn header_entry_with_inconsistent_offsets_names_the_tensor() {
    let dir = setup();
    let name = "layers.0.hc_attn_base";
    edit_entry(dir.path(), name, |e| {
        let begin = e["data_offsets"][0].as_u64().unwrap();
        e["data_offsets"] = json!([begin, begin + 3]);
    });
    assert_mentions(
        &open_err(dir.path()),
        &["`layers.0.hc_attn_base`", "needs 32"],
    );
}

#[test]
fn header_length_past_the_end_of_file() {
    let dir = setup();
    let path = dir.path().join("model-00002-of-00002.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    assert_mentions(
        &open_err(dir.path()),
        &["model-00002-of-00002.safetensors", "header length"],
    );
}

#[test]
fn malformed_config_json() {
    let dir = setup();
    std::fs::write(dir.path().join("config.json"), "{\"vocab_size\": 64,").unwrap();
    let msg = open_err(dir.path());
    assert_mentions(&msg, &["config.json", "malformed JSON"]);
}

#[test]
fn missing_config_key() {
    let dir = setup();
    let path = dir.path().join("config.json");
    let mut cfg = read_json(&path);
    cfg.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let msg = open_err(dir.path());
    assert_mentions(&msg, &["config.json", "`hidden_size`", "missing"]);
}

#[test]
fn missing_config_file() {
    let dir = setup();
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    assert_mentions(&open_err(dir.path()), &["config.json"]);
}

#[test]
fn fp8_nan_code_fails_at_load() {
    let dir = setup();
    let name = "layers.1.attn.wo_b.weight";
    poke(dir.path(), name, 5, 0xFF);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let msg = ckpt.load_f32(name).unwrap_err().to_string();
    assert_mentions(
        &msg,
        &[
            "model-0000",
            "`layers.1.attn.wo_b.weight`",
            "element 5",
            "NaN",
        ],
    );
}

#[test]
fn ue8m0_nan_scale_fails_at_load() {
    let dir = setup();
    poke(dir.path(), "layers.0.ffn.experts.2.w1.scale", 3, 255);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let msg = ckpt
        .load_f32("layers.0.ffn.experts.2.w1.weight")
        .unwrap_err()
        .to_string();
    assert_mentions(
        &msg,
        &["`layers.0.ffn.experts.2.w1.scale`", "element 3", "NaN"],
    );
}

#[test]
fn tid2eid_out_of_range_fails_at_load() {
    let dir = setup();
    let name = "layers.0.ffn.gate.tid2eid";
    poke(dir.path(), name, 8 * 7, 4); // element 7 = 4 = n_routed_experts
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let msg = ckpt.load_i64(name).unwrap_err().to_string();
    assert_mentions(
        &msg,
        &["`layers.0.ffn.gate.tid2eid`", "element 7 = 4", "[0, 4)"],
    );
}

#[test]
fn unknown_names_and_wrong_loaders_are_errors() {
    let dir = setup();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let e = ckpt.load_f32("layers.9.nope").unwrap_err();
    assert!(matches!(e, CheckpointError::Tensor { .. }));
    assert_mentions(&e.to_string(), &[INDEX, "`layers.9.nope`"]);
    let msg = ckpt
        .load_f32("layers.0.ffn.gate.tid2eid")
        .unwrap_err()
        .to_string();
    assert_mentions(&msg, &["`layers.0.ffn.gate.tid2eid`", "I64"]);
    let msg = ckpt
        .load_i64("layers.0.attn.attn_sink")
        .unwrap_err()
        .to_string();
    assert_mentions(
        &msg,
        &["`layers.0.attn.attn_sink`", "expected I64, found F32"],
    );
    assert!(ckpt.load_f32("layers.0.attn.wkv.scale").is_err());
}

#[test]
fn extra_tensors_are_allowed_and_reported() {
    let dir = setup();
    let extra = dir.path().join("extra.safetensors");
    let mut header = Map::new();
    header.insert(
        "extra.bias".into(),
        json!({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}),
    );
    let data: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    join(&extra, &header, &data);
    edit_index(dir.path(), |m| {
        m.insert("extra.bias".into(), json!("extra.safetensors"));
    });
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.unexpected_tensors(), ["extra.bias".to_string()]);
    assert_eq!(ckpt.load_f32("extra.bias").unwrap().data, vec![1.5, -2.0]);
}
