//! The tensor list a config implies (spec §4.1-4.3): every name, dtype and shape, so that
//! `open` can check a checkpoint completely and the synthetic writer can produce one.

use super::dtype::Dtype;
use crate::model::config::{ExpertFormat, LinearFormat, ModelConfig};
use crate::model::config_check::CSA_RATIO;

/// Block size of FP8 expert weights (the official lossless FP4->FP8 conversion).
const EXPERT_FP8_BLOCK: usize = 128;
/// FP4 scales cover this many consecutive inputs of a row.
pub const FP4_GROUP: usize = 32;

/// How a logical tensor is stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// One tensor of this dtype with the logical shape.
    Plain(Dtype),
    /// `X.weight` F8_E4M3 `[out, in]` + `X.scale` F8_E8M0 `[ceil(out/b), ceil(in/b)]`.
    Fp8 { block: usize },
    /// `X.weight` I8 `[out, in/2]` + `X.scale` F8_E8M0 `[out, in/32]`.
    Fp4,
}

/// What a tensor is for; the synthetic writer picks an initialisation from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Embedding,
    /// A projection `[out, in]` applied as `x . W^T`.
    Linear,
    Norm,
    HcFn,
    HcBase,
    HcScale,
    AttnSink,
    GateBias,
    Tid2eid,
    Ape,
}

/// One logical tensor: the name of its main stored tensor (`X.weight` for quantised ones),
/// the logical (dequantised) shape and how it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub storage: Storage,
    pub role: Role,
}

/// One stored safetensors tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

/// `X.weight` -> `X.scale`; any other name just gets `.scale` appended.
pub fn scale_name(weight_name: &str) -> String {
    match weight_name.strip_suffix(".weight") {
        Some(stem) => format!("{stem}.scale"),
        None => format!("{weight_name}.scale"),
    }
}

impl ExpectedTensor {
    /// The tensors this occupies on disk (one, or weight + scale).
    pub fn stored(&self) -> Vec<StoredTensor> {
        let (out, inp) = match self.shape.as_slice() {
            [o, i] => (*o, *i),
            _ => (0, 0),
        };
        let one = |dtype, shape: Vec<usize>| StoredTensor {
            name: self.name.clone(),
            dtype,
            shape,
        };
        let scale = |shape| StoredTensor {
            name: scale_name(&self.name),
            dtype: Dtype::F8_E8M0,
            shape,
        };
        match self.storage {
            Storage::Plain(d) => vec![one(d, self.shape.clone())],
            Storage::Fp8 { block } => vec![
                one(Dtype::F8_E4M3, self.shape.clone()),
                scale(vec![out.div_ceil(block), inp.div_ceil(block)]),
            ],
            Storage::Fp4 => vec![
                one(Dtype::I8, vec![out, inp / 2]),
                scale(vec![out, inp / FP4_GROUP]),
            ],
        }
    }
}

/// Collects the list; `linear`/`expert` are the storages of the two quantisable classes.
struct Builder {
    out: Vec<ExpectedTensor>,
    linear: Storage,
    expert: Storage,
}

impl Builder {
    fn push(&mut self, name: String, shape: Vec<usize>, storage: Storage, role: Role) {
        self.out.push(ExpectedTensor {
            name,
            shape,
            storage,
            role,
        });
    }
    fn bf16(&mut self, name: String, shape: Vec<usize>, role: Role) {
        self.push(name, shape, Storage::Plain(Dtype::BF16), role);
    }
    fn f32(&mut self, name: String, shape: Vec<usize>, role: Role) {
        self.push(name, shape, Storage::Plain(Dtype::F32), role);
    }
    /// A quantisable non-expert projection `X.weight` `[out, in]`.
    fn linear(&mut self, stem: String, out: usize, inp: usize) {
        let s = self.linear;
        self.push(format!("{stem}.weight"), vec![out, inp], s, Role::Linear);
    }
    fn expert(&mut self, stem: String, out: usize, inp: usize) {
        let s = self.expert;
        self.push(format!("{stem}.weight"), vec![out, inp], s, Role::Linear);
    }
}

/// Every tensor the config implies, globals first, then block by block (MTP last).
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<ExpectedTensor> {
    let linear = match cfg.linear_format {
        LinearFormat::Bf16 => Storage::Plain(Dtype::BF16),
        LinearFormat::Fp8 { block } => Storage::Fp8 { block },
    };
    let expert = match cfg.expert_format {
        ExpertFormat::Bf16 => Storage::Plain(Dtype::BF16),
        ExpertFormat::Fp4 => Storage::Fp4,
        ExpertFormat::Fp8 => Storage::Fp8 {
            block: EXPERT_FP8_BLOCK,
        },
    };
    let mut b = Builder {
        out: Vec::new(),
        linear,
        expert,
    };
    globals(&mut b, cfg, "");
    for layer in 0..cfg.num_blocks() {
        block(&mut b, cfg, layer);
    }
    b.out
}

/// `embed`/`head` (main model only) or the MTP extras; both have norm + hc_head.
fn globals(b: &mut Builder, cfg: &ModelConfig, prefix: &str) {
    let (v, d, hc) = (cfg.vocab_size, cfg.hidden_size, cfg.hc_mult);
    if prefix.is_empty() {
        b.bf16("embed.weight".into(), vec![v, d], Role::Embedding);
        b.bf16("head.weight".into(), vec![v, d], Role::Linear);
    } else {
        b.linear(format!("{prefix}e_proj"), d, d);
        b.linear(format!("{prefix}h_proj"), d, d);
        b.bf16(format!("{prefix}enorm.weight"), vec![d], Role::Norm);
        b.bf16(format!("{prefix}hnorm.weight"), vec![d], Role::Norm);
    }
    b.bf16(format!("{prefix}norm.weight"), vec![d], Role::Norm);
    b.f32(format!("{prefix}hc_head_fn"), vec![hc, hc * d], Role::HcFn);
    b.f32(format!("{prefix}hc_head_base"), vec![hc], Role::HcBase);
    b.f32(format!("{prefix}hc_head_scale"), vec![1], Role::HcScale);
}

fn block(b: &mut Builder, cfg: &ModelConfig, layer: usize) {
    let p = cfg.block_prefix(layer);
    let (d, mix, flat) = (cfg.hidden_size, cfg.hc_mix(), cfg.hc_mult * cfg.hidden_size);
    for site in ["attn", "ffn"] {
        b.f32(format!("{p}hc_{site}_fn"), vec![mix, flat], Role::HcFn);
        b.f32(format!("{p}hc_{site}_base"), vec![mix], Role::HcBase);
        b.f32(format!("{p}hc_{site}_scale"), vec![3], Role::HcScale);
        b.bf16(format!("{p}{site}_norm.weight"), vec![d], Role::Norm);
    }
    attention(b, cfg, &p);
    let ratio = cfg.compress_ratios.get(layer).copied().unwrap_or(0);
    if ratio != 0 {
        let c = if ratio == CSA_RATIO { 2 } else { 1 };
        compressor(
            b,
            &format!("{p}attn.compressor."),
            ratio,
            c * cfg.head_dim,
            d,
        );
        b.bf16(
            format!("{p}attn.compressor.norm.weight"),
            vec![cfg.head_dim],
            Role::Norm,
        );
    }
    if ratio == CSA_RATIO {
        indexer(b, cfg, &p);
    }
    moe(b, cfg, &p, cfg.is_hash_layer(layer));
    if layer >= cfg.num_hidden_layers {
        globals(b, cfg, &p);
    }
}

fn attention(b: &mut Builder, cfg: &ModelConfig, p: &str) {
    let (d, h, hd) = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim);
    let (ql, og, ol) = (cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank);
    b.f32(format!("{p}attn.attn_sink"), vec![h], Role::AttnSink);
    b.linear(format!("{p}attn.wq_a"), ql, d);
    b.bf16(format!("{p}attn.q_norm.weight"), vec![ql], Role::Norm);
    b.linear(format!("{p}attn.wq_b"), h * hd, ql);
    b.linear(format!("{p}attn.wkv"), hd, d);
    b.bf16(format!("{p}attn.kv_norm.weight"), vec![hd], Role::Norm);
    // o_groups is validated non-zero and to divide the head count.
    b.linear(format!("{p}attn.wo_a"), og * ol, h * hd / og.max(1));
    b.linear(format!("{p}attn.wo_b"), d, og * ol);
}

/// Compressor projections and positional bias; `width` = c * head width.
fn compressor(b: &mut Builder, p: &str, ratio: usize, width: usize, d: usize) {
    b.bf16(format!("{p}wkv.weight"), vec![width, d], Role::Linear);
    b.bf16(format!("{p}wgate.weight"), vec![width, d], Role::Linear);
    b.f32(format!("{p}ape"), vec![ratio, width], Role::Ape);
}

fn indexer(b: &mut Builder, cfg: &ModelConfig, p: &str) {
    let (d, ih, ihd) = (cfg.hidden_size, cfg.index_n_heads, cfg.index_head_dim);
    b.linear(format!("{p}attn.indexer.wq_b"), ih * ihd, cfg.q_lora_rank);
    b.bf16(
        format!("{p}attn.indexer.weights_proj.weight"),
        vec![ih, d],
        Role::Linear,
    );
    let cp = format!("{p}attn.indexer.compressor.");
    compressor(b, &cp, CSA_RATIO, 2 * ihd, d);
    b.bf16(format!("{cp}norm.weight"), vec![ihd], Role::Norm);
}

fn moe(b: &mut Builder, cfg: &ModelConfig, p: &str, hash: bool) {
    let (d, e, inter) = (
        cfg.hidden_size,
        cfg.n_routed_experts,
        cfg.moe_intermediate_size,
    );
    b.bf16(format!("{p}ffn.gate.weight"), vec![e, d], Role::Linear);
    if hash {
        let shape = vec![cfg.vocab_size, cfg.num_experts_per_tok];
        b.push(
            format!("{p}ffn.gate.tid2eid"),
            shape,
            Storage::Plain(Dtype::I64),
            Role::Tid2eid,
        );
    } else {
        b.f32(format!("{p}ffn.gate.bias"), vec![e], Role::GateBias);
    }
    for x in 0..e {
        b.expert(format!("{p}ffn.experts.{x}.w1"), inter, d);
        b.expert(format!("{p}ffn.experts.{x}.w2"), d, inter);
        b.expert(format!("{p}ffn.experts.{x}.w3"), inter, d);
    }
    b.linear(format!("{p}ffn.shared_experts.w1"), inter, d);
    b.linear(format!("{p}ffn.shared_experts.w2"), d, inter);
    b.linear(format!("{p}ffn.shared_experts.w3"), inter, d);
}
