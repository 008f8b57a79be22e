//! Synthetic checkpoints of many shapes and formats: they open, every tensor loads, values
//! are sane, writing is deterministic, and quantised variants round-trip to the same master.
#![allow(clippy::unwrap_used)]

use dsv4_engine::model::checkpoint::{Checkpoint, Dtype, StoredAs};
use dsv4_engine::model::synth::{write_checkpoint, SynthSpec};
use dsv4_engine::model::{ExpertFormat, LinearFormat};
use std::path::Path;

/// A small model with nothing in common with the tiny default: other head counts, head
/// dims, window, HCA ratios 8 and 16, 4 experts top-3, 2 mHC streams, MTP with a CSA entry.
fn odd_spec() -> SynthSpec {
    SynthSpec {
        vocab_size: 300,
        hidden_size: 96,
        num_hidden_layers: 4,
        num_nextn_predict_layers: 1,
        num_attention_heads: 8,
        head_dim: 64,
        qk_rope_head_dim: 32,
        q_lora_rank: 96,
        o_groups: 4,
        o_lora_rank: 48,
        sliding_window: 32,
        compress_ratios: vec![4, 8, 16, 0, 4],
        index_n_heads: 2,
        index_head_dim: 32,
        index_topk: 4,
        n_routed_experts: 4,
        num_experts_per_tok: 3,
        moe_intermediate_size: 160,
        num_hash_layers: 1,
        hc_mult: 2,
        seed: 11,
        shards: 3,
        ..SynthSpec::tiny_default()
    }
}

/// Opens `dir`, checks the tensor list is exactly the expected one, loads every tensor and
/// checks it is finite with the right logical shape; returns the checkpoint.
fn open_and_load_all(dir: &Path) -> Checkpoint {
    let ckpt = Checkpoint::open(dir).unwrap();
    assert!(ckpt.unexpected_tensors().is_empty());
    assert_eq!(Some(ckpt.total_bytes()), ckpt.index_total_size());
    let cfg = ckpt.config().clone();
    for name in ckpt.tensor_names() {
        let raw = ckpt.raw(name).unwrap();
        match raw.dtype {
            Dtype::F8_E8M0 => continue,
            Dtype::I64 => {
                let (shape, ids) = ckpt.load_i64(name).unwrap();
                assert_eq!(shape, vec![cfg.vocab_size, cfg.num_experts_per_tok]);
                let n = cfg.n_routed_experts as i64;
                for row in ids.chunks(cfg.num_experts_per_tok) {
                    assert!(row.iter().all(|&e| (0..n).contains(&e)), "{name}");
                    let mut r = row.to_vec();
                    r.dedup();
                    assert_eq!(r.len(), row.len(), "{name}: repeated expert in a row");
                }
            }
            _ => {
                let t = ckpt.load_f32(name).unwrap();
                assert_eq!(t.data.len(), t.shape.iter().product::<usize>());
                assert!(t.data.iter().all(|v| v.is_finite()), "{name}");
            }
        }
    }
    ckpt
}

fn mean(v: &[f32]) -> f32 {
    v.iter().sum::<f32>() / v.len() as f32
}

fn rms(v: &[f32]) -> f32 {
    (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt()
}

#[test]
fn tiny_default_bf16_opens_with_sane_values() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &SynthSpec::tiny_default()).unwrap();
    let ckpt = open_and_load_all(dir.path());
    assert_eq!(ckpt.config().linear_format, LinearFormat::Bf16);
    let norm = ckpt.load_f32("layers.0.attn_norm.weight").unwrap();
    assert!((mean(&norm.data) - 1.0).abs() < 0.05);
    // Linear weights ~ N(0, 1/fan_in): wq_b has fan-in q_lora_rank = 128.
    let wq_b = ckpt.load_f32("layers.4.attn.wq_b.weight").unwrap();
    assert!((rms(&wq_b.data) * 128f32.sqrt() - 1.0).abs() < 0.05);
    assert!(rms(&ckpt.load_f32("layers.2.attn.attn_sink").unwrap().data) < 0.3);
    assert!(
        ckpt.contains("layers.2.ffn.gate.tid2eid") && !ckpt.contains("layers.3.ffn.gate.tid2eid")
    );
}

#[test]
fn quantized_three_shards_round_trips_to_the_bf16_master() {
    let (db, dq) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let spec = SynthSpec {
        shards: 3,
        ..SynthSpec::tiny_default()
    };
    write_checkpoint(db.path(), &spec).unwrap();
    write_checkpoint(dq.path(), &spec.clone().with_quantized(true)).unwrap();
    let (b, q) = (open_and_load_all(db.path()), open_and_load_all(dq.path()));
    assert_eq!(q.config().expert_format, ExpertFormat::Fp4);
    // Same seed, same names: the same master values; BF16 rounds them, FP8/FP4 quantise them.
    for (name, stored, tol) in [
        ("layers.3.attn.wo_a.weight", StoredAs::Fp8, 0.04),
        ("mtp.0.e_proj.weight", StoredAs::Fp8, 0.04),
        ("layers.1.ffn.experts.5.w2.weight", StoredAs::Fp4, 0.15),
    ] {
        let (x, y) = (b.load_f32(name).unwrap(), q.load_f32(name).unwrap());
        assert_eq!((x.shape.clone(), y.stored), (y.shape.clone(), stored));
        let diff: Vec<f32> = x.data.iter().zip(&y.data).map(|(a, b)| a - b).collect();
        let rel = rms(&diff) / rms(&x.data);
        assert!(rel < tol && rel > 0.0, "{name}: relative RMS error {rel}");
    }
}

#[test]
fn odd_shapes_open_in_bf16_and_both_quantized_formats() {
    for (quantized, fp8_experts) in [(false, false), (true, false), (true, true)] {
        let dir = tempfile::tempdir().unwrap();
        let spec = SynthSpec {
            quantized,
            fp8_experts,
            ..odd_spec()
        };
        write_checkpoint(dir.path(), &spec).unwrap();
        let ckpt = open_and_load_all(dir.path());
        let ape = ckpt.load_f32("layers.2.attn.compressor.ape").unwrap();
        assert_eq!(ape.shape, vec![16, 64]);
        assert_eq!(
            ckpt.load_f32("mtp.0.attn.compressor.ape").unwrap().shape,
            vec![4, 128]
        );
        let w2 = ckpt.load_f32("layers.0.ffn.experts.3.w2.weight").unwrap();
        assert_eq!(w2.shape, vec![96, 160]);
        let want = match (quantized, fp8_experts) {
            (false, _) => StoredAs::Bf16,
            (true, false) => StoredAs::Fp4,
            (true, true) => StoredAs::Fp8,
        };
        assert_eq!(w2.stored, want);
    }
}

#[test]
fn no_mtp_one_shard_opens() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        num_nextn_predict_layers: 0,
        compress_ratios: vec![128, 4],
        num_hidden_layers: 2,
        num_hash_layers: 0,
        shards: 1,
        ..odd_spec()
    };
    write_checkpoint(dir.path(), &spec).unwrap();
    let ckpt = open_and_load_all(dir.path());
    assert!(ckpt.tensor_names().iter().all(|n| !n.starts_with("mtp.")));
    assert!(ckpt.tensor_names().iter().all(|n| !n.ends_with("tid2eid")));
}

#[test]
fn writing_is_deterministic_per_seed() {
    let spec = SynthSpec {
        vocab_size: 200,
        ..odd_spec()
    }
    .with_quantized(true);
    let (d1, d2, d3) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write_checkpoint(d1.path(), &spec).unwrap();
    write_checkpoint(d2.path(), &spec).unwrap();
    write_checkpoint(
        d3.path(),
        &SynthSpec {
            seed: 12,
            ..spec.clone()
        },
    )
    .unwrap();
    for f in [
        "config.json",
        "model.safetensors.index.json",
        "model-00002-of-00003.safetensors",
    ] {
        let a = std::fs::read(d1.path().join(f)).unwrap();
        assert_eq!(a, std::fs::read(d2.path().join(f)).unwrap(), "{f}");
    }
    let shard = "model-00003-of-00003.safetensors";
    let a = std::fs::read(d1.path().join(shard)).unwrap();
    assert_ne!(a, std::fs::read(d3.path().join(shard)).unwrap());
}

#[test]
fn spec_round_trips_through_its_config() {
    let spec = odd_spec().with_quantized(true);
    let cfg = spec.model_config().unwrap();
    assert_eq!(
        SynthSpec::from_config(&cfg, spec.seed, spec.shards).unwrap(),
        spec
    );
    let json = spec.config_json();
    assert_eq!(
        json["quantization_config"]["weight_block_size"],
        serde_json::json!([128, 128])
    );
    assert_eq!(json["expert_dtype"], "fp4");
    assert!(SynthSpec::tiny_default()
        .config_json()
        .get("quantization_config")
        .is_none());
}

#[test]
fn invalid_specs_are_rejected_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let bad_ratios = SynthSpec {
        compress_ratios: vec![0, 4],
        ..SynthSpec::tiny_default()
    };
    let e = write_checkpoint(dir.path(), &bad_ratios).unwrap_err();
    assert!(e.to_string().contains("compress_ratios"), "{e}");
    let too_many_shards = SynthSpec {
        shards: 100_000,
        ..SynthSpec::tiny_default()
    };
    assert!(write_checkpoint(dir.path(), &too_many_shards).is_err());
}
