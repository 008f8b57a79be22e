//! The loader against the golden tiny-v4-small checkpoints (real on-disk format, made by
//! an independent Python writer).
#![allow(clippy::unwrap_used)]

use dsv4_engine::model::checkpoint::{expected_tensors, Checkpoint, StoredAs};
use dsv4_engine::model::{ExpertFormat, LinearFormat};
use std::path::PathBuf;

/// `<workspace>/tests/data/tiny-v4-small`, else `<workspace>/../shared/golden/tiny-v4-small`.
fn golden_dir() -> Option<PathBuf> {
    let ws = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        ws.join("tests/data/tiny-v4-small"),
        ws.join("../shared/golden/tiny-v4-small"),
    ];
    let found = candidates
        .into_iter()
        .find(|p| p.join("bf16/config.json").is_file());
    if found.is_none() {
        eprintln!("SKIP: golden tiny-v4-small set not found (tests/data or ../shared/golden)");
    }
    found
}

fn open(variant: &str) -> Option<Checkpoint> {
    let dir = golden_dir()?.join(variant);
    match Checkpoint::open(&dir) {
        Ok(c) => Some(c),
        Err(e) => panic!("opening {}: {e}", dir.display()),
    }
}

/// Every tensor in the index is one the config implies, and every implied one is there.
fn assert_exact_match(ckpt: &Checkpoint) {
    assert!(
        ckpt.unexpected_tensors().is_empty(),
        "unexpected: {:?}",
        ckpt.unexpected_tensors()
    );
    let n: usize = expected_tensors(ckpt.config())
        .iter()
        .map(|t| t.stored().len())
        .sum();
    assert_eq!(n, ckpt.tensor_names().len());
    assert_eq!(Some(ckpt.total_bytes()), ckpt.index_total_size());
}

#[test]
fn golden_bf16_opens_and_matches_the_expected_list() {
    let Some(ckpt) = open("bf16") else { return };
    assert_eq!(ckpt.config().linear_format, LinearFormat::Bf16);
    assert_eq!(ckpt.config().expert_format, ExpertFormat::Bf16);
    assert_exact_match(&ckpt);
    assert_eq!(ckpt.tensor_names().len(), 263);
    let w = ckpt.load_f32("layers.0.attn.wq_a.weight").unwrap();
    assert_eq!(
        (w.shape.as_slice(), w.stored),
        (&[64usize, 32][..], StoredAs::Bf16)
    );
    let e = ckpt.load_f32("layers.2.ffn.experts.3.w2.weight").unwrap();
    assert_eq!(e.shape, vec![32, 64]);
    let ape = ckpt.load_f32("layers.1.attn.compressor.ape").unwrap();
    assert_eq!(
        (ape.shape.as_slice(), ape.stored),
        (&[4usize, 256][..], StoredAs::F32)
    );
    assert!(w
        .data
        .iter()
        .chain(&e.data)
        .chain(&ape.data)
        .all(|v| v.is_finite()));
}

#[test]
fn golden_quant_opens_and_dequantises() {
    let Some(ckpt) = open("quant") else { return };
    assert_eq!(
        ckpt.config().linear_format,
        LinearFormat::Fp8 { block: 128 }
    );
    assert_eq!(ckpt.config().expert_format, ExpertFormat::Fp4);
    assert_exact_match(&ckpt);
    assert_eq!(ckpt.tensor_names().len(), 427);
    let w = ckpt.load_f32("layers.1.attn.wo_a.weight").unwrap();
    assert_eq!(
        (w.shape.as_slice(), w.stored),
        (&[64usize, 256][..], StoredAs::Fp8)
    );
    let e = ckpt.load_f32("mtp.0.ffn.experts.7.w2.weight").unwrap();
    assert_eq!(
        (e.shape.as_slice(), e.stored),
        (&[32usize, 64][..], StoredAs::Fp4)
    );
    assert!(w.data.iter().chain(&e.data).all(|v| v.is_finite()));
    assert!(e.data.iter().any(|&v| v != 0.0));
    let (shape, ids) = ckpt.load_i64("layers.0.ffn.gate.tid2eid").unwrap();
    assert_eq!(shape, vec![4096, 2]);
    assert!(ids.iter().all(|&i| (0..8).contains(&i)));
}

/// Shard 1 is byte-identical in both variants, and the FP8 weights are the quantised BF16
/// master: dequantised values stay close to the bf16 ones (relative RMS error ~0.03).
#[test]
fn golden_quant_is_close_to_bf16_master() {
    let (Some(b), Some(q)) = (open("bf16"), open("quant")) else {
        return;
    };
    for name in [
        "embed.weight",
        "layers.3.attn.compressor.ape",
        "layers.1.ffn.gate.weight",
    ] {
        assert_eq!(
            b.raw(name).unwrap().bytes,
            q.raw(name).unwrap().bytes,
            "{name}"
        );
    }
    for (name, tol) in [
        ("layers.3.attn.wq_b.weight", 0.05),
        ("layers.3.ffn.experts.0.w1.weight", 0.2),
    ] {
        let (x, y) = (
            b.load_f32(name).unwrap().data,
            q.load_f32(name).unwrap().data,
        );
        let num: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
        let den: f32 = x.iter().map(|a| a * a).sum();
        let rel = (num / den).sqrt();
        assert!(rel < tol, "{name}: relative RMS error {rel}");
    }
}

/// Values computed independently (plain Python decode of the same bytes).
#[test]
fn golden_quant_dequant_matches_an_independent_decode() {
    let Some(q) = open("quant") else { return };
    let w = q.load_f32("layers.1.attn.wo_a.weight").unwrap().data;
    assert_eq!(&w[..3], &[0.046875, -0.05859375, -11.0 / 4096.0]);
    assert_eq!(w[200], -0.0625);
    let abs: f64 = w.iter().map(|v| f64::from(v.abs())).sum();
    assert!((abs - 816.1759490966797).abs() < 1e-9, "{abs}");
    let e = q.load_f32("mtp.0.ffn.experts.7.w2.weight").unwrap().data;
    assert_eq!(&e[..3], &[-0.25, -0.09375, 0.0625]);
    assert_eq!(e[45], 0.09375);
    let abs: f64 = e.iter().map(|v| f64::from(v.abs())).sum();
    assert_eq!(abs, 199.0);
}

/// The published DeepSeek-V4-Flash config implies exactly the published index: 69,187
/// tensors and `metadata.total_size` = 159,609,485,896 bytes (spec §4).
#[test]
fn real_flash_config_implies_the_published_index_totals() {
    use dsv4_engine::model::synth::SynthSpec;
    let mut ratios = vec![0, 0];
    ratios.extend((2..42).map(|i| if i % 2 == 0 { 4 } else { 128 }));
    ratios.extend([4, 0]);
    let spec = SynthSpec {
        vocab_size: 129_280,
        hidden_size: 4096,
        num_hidden_layers: 43,
        num_nextn_predict_layers: 1,
        num_attention_heads: 64,
        head_dim: 512,
        qk_rope_head_dim: 64,
        q_lora_rank: 1024,
        o_groups: 8,
        o_lora_rank: 1024,
        sliding_window: 128,
        compress_ratios: ratios,
        index_n_heads: 64,
        index_head_dim: 128,
        index_topk: 512,
        n_routed_experts: 256,
        num_experts_per_tok: 6,
        moe_intermediate_size: 2048,
        num_hash_layers: 3,
        hc_mult: 4,
        ..SynthSpec::tiny_default()
    }
    .with_quantized(true);
    let cfg = spec.model_config().unwrap();
    let stored: Vec<_> = expected_tensors(&cfg)
        .iter()
        .flat_map(|t| t.stored())
        .collect();
    assert_eq!(stored.len(), 69_187);
    let bytes: usize = stored
        .iter()
        .map(|t| t.shape.iter().product::<usize>() * t.dtype.size())
        .sum();
    assert_eq!(bytes, 159_609_485_896);
}
