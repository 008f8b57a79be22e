//! A rank's tensor-parallel share of a block, cut out of the full dequantised weights.
//!
//! The reference attention runs on a rank-local config (the rank's heads) through
//! `attention::forward_heads`, which stops before the output projection; the grouped output
//! projection is done here, split by group. The MoE is reused unchanged by replacing the
//! experts the rank does not hold with zero experts of width one (they add exactly `+0.0`).

use super::plan::{GroupShare, RankPlan};
use crate::model::ModelConfig;
use crate::reference::weights::{
    AttentionWeights, BlockWeights, ExpertWeights, Linear, MoeWeights,
};
use std::ops::Range;

/// The rank's part of the grouped output projection `wo_b(concat_g wo_a[g](o_g))`.
#[derive(Debug, Clone)]
pub struct OutProjection {
    /// Per touched group: its share, the offset of its heads in the rank's head outputs,
    /// and the `wo_a[g]` columns of those heads.
    pub groups: Vec<(GroupShare, usize, Linear)>,
    /// `wo_b` columns of the owned groups, run without activation quantisation (the caller
    /// quantises the whole latent row first, as the unsplit model does).
    pub wo_b: Option<Linear>,
    pub wo_b_act_quant: bool,
}

/// Columns `cols` of a `[out, in]` weight.
pub fn columns(l: &Linear, cols: Range<usize>) -> Linear {
    let w =
        l.w.chunks(l.inp)
            .flat_map(|row| row[cols.clone()].iter().copied())
            .collect();
    Linear {
        w,
        out: l.out,
        inp: cols.len(),
        act_quant: l.act_quant,
    }
}

/// A `0 x 0` map standing in for the output projection, which `forward_heads` never uses.
fn unused_projection() -> Linear {
    Linear {
        w: Vec::new(),
        out: 0,
        inp: 0,
        act_quant: false,
    }
}

/// A SwiGLU expert of width one with zero weights: contributes exactly `+0.0`.
fn zero_expert(d: usize) -> ExpertWeights {
    let zeros = |out, inp| Linear {
        w: vec![0.0; out * inp],
        out,
        inp,
        act_quant: false,
    };
    ExpertWeights {
        w1: zeros(1, d),
        w2: zeros(d, 1),
        w3: zeros(1, d),
    }
}

/// The config the reference attention sees on a rank: its heads as one output group.
pub fn rank_attention_config(cfg: &ModelConfig, rank: &RankPlan) -> ModelConfig {
    let mut c = cfg.clone();
    c.num_attention_heads = rank.heads.len();
    c.o_groups = 1;
    c.o_lora_rank = rank.heads.len() * cfg.head_dim;
    c
}

/// The rank's share of block `full`: sliced attention and MoE, plus its output projection.
pub fn tensor_block(
    cfg: &ModelConfig,
    full: &BlockWeights,
    rank: &RankPlan,
) -> (BlockWeights, OutProjection) {
    let block = BlockWeights {
        hc_attn: full.hc_attn.clone(),
        hc_ffn: full.hc_ffn.clone(),
        attn_norm: full.attn_norm.clone(),
        ffn_norm: full.ffn_norm.clone(),
        attn: attention(cfg, &full.attn, &rank.heads),
        moe: moe(cfg, &full.moe, rank),
    };
    (block, out_projection(cfg, &full.attn, rank))
}

fn attention(cfg: &ModelConfig, a: &AttentionWeights, heads: &Range<usize>) -> AttentionWeights {
    let d = cfg.head_dim;
    let width = heads.len() * d;
    AttentionWeights {
        wq_a: a.wq_a.clone(),
        q_norm: a.q_norm.clone(),
        wq_b: a.wq_b.rows(heads.start * d, width),
        wkv: a.wkv.clone(),
        kv_norm: a.kv_norm.clone(),
        wo_a: Vec::new(),
        wo_b: unused_projection(),
        sink: a.sink[heads.clone()].to_vec(),
        compressor: a.compressor.clone(),
        indexer: a.indexer.clone(),
    }
}

fn out_projection(cfg: &ModelConfig, a: &AttentionWeights, rank: &RankPlan) -> OutProjection {
    let (d, lora) = (cfg.head_dim, cfg.o_lora_rank);
    let per_group = cfg.num_attention_heads / cfg.o_groups;
    let groups = rank
        .groups
        .iter()
        .map(|g| {
            let first = g.group * per_group;
            let cols = (g.heads.start - first) * d..(g.heads.end - first) * d;
            let offset = (g.heads.start - rank.heads.start) * d;
            (g.clone(), offset, columns(&a.wo_a[g.group], cols))
        })
        .collect();
    let owned = &rank.owned_groups;
    let wo_b = (!owned.is_empty()).then(|| {
        let mut l = columns(&a.wo_b, owned.start * lora..owned.end * lora);
        l.act_quant = false;
        l
    });
    OutProjection {
        groups,
        wo_b,
        wo_b_act_quant: a.wo_b.act_quant,
    }
}

fn moe(cfg: &ModelConfig, m: &MoeWeights, rank: &RankPlan) -> MoeWeights {
    let d = cfg.hidden_size;
    let experts = m
        .experts
        .iter()
        .enumerate()
        .map(|(e, w)| {
            if rank.experts.contains(&e) {
                w.clone()
            } else {
                zero_expert(d)
            }
        })
        .collect();
    let s = &rank.shared_rows;
    let shared = if s.is_empty() {
        zero_expert(d)
    } else {
        ExpertWeights {
            w1: m.shared.w1.rows(s.start, s.len()),
            w3: m.shared.w3.rows(s.start, s.len()),
            w2: columns(&m.shared.w2, s.clone()),
        }
    };
    MoeWeights {
        gate: m.gate.clone(),
        bias: m.bias.clone(),
        tid2eid: m.tid2eid.clone(),
        experts,
        shared,
    }
}
