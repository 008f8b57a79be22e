//! A rank's tensor-parallel share of a block, built from the rank's loaded shares.
//!
//! The reference attention runs on a rank-local config (the rank's heads) through
//! `attention::forward_heads`, which stops before the output projection; the grouped output
//! projection is done here, split by group. The MoE is reused unchanged by replacing the
//! experts the rank does not hold with zero experts of width one (they add exactly `+0.0`).

use super::plan::{GroupShare, RankPlan};
use super::source::RankSource;
use crate::model::checkpoint::CheckpointError;
use crate::model::ModelConfig;
use crate::reference::weights::{
    BlockWeights, ExpertWeights, Linear, Loader, MoeWeights, TensorSource,
};

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
pub fn zero_expert(d: usize) -> ExpertWeights {
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

/// Rank `rank`'s share of block `layer` in tensor mode, read from its loaded shares: the
/// reference builder for everything replicated and for the rows the source already cut
/// (`wq_b`, sinks, shared-expert rows), the split output projection and expert set here.
pub fn tensor_block(
    l: &Loader<'_, RankSource>,
    cfg: &ModelConfig,
    rank: &RankPlan,
    layer: usize,
) -> Result<(BlockWeights, OutProjection), CheckpointError> {
    let p = cfg.block_prefix(layer);
    let attn_p = format!("{p}attn.");
    let out = out_projection(l.src, cfg, rank, &attn_p)?;
    let attn = l.attention_with(cfg, layer, &attn_p, Vec::new(), unused_projection())?;
    let block = BlockWeights {
        hc_attn: l.hc(&format!("{p}hc_attn"))?,
        hc_ffn: l.hc(&format!("{p}hc_ffn"))?,
        attn_norm: l.vec(&format!("{p}attn_norm.weight"))?,
        ffn_norm: l.vec(&format!("{p}ffn_norm.weight"))?,
        attn,
        moe: moe(l, cfg, rank, layer, &format!("{p}ffn."))?,
    };
    Ok((block, out))
}

/// `wo_a` comes as one part per touched group (its heads' columns), `wo_b` as the owned
/// groups' columns.
fn out_projection(
    src: &RankSource,
    cfg: &ModelConfig,
    rank: &RankPlan,
    p: &str,
) -> Result<OutProjection, CheckpointError> {
    let d = cfg.head_dim;
    let wo_a = src.take_parts(&format!("{p}wo_a.weight"))?;
    if wo_a.len() != rank.groups.len() {
        return Err(CheckpointError::Tensor {
            file: format!("<rank {} shares>", rank.rank),
            tensor: format!("{p}wo_a.weight"),
            message: format!("{} parts for {} groups", wo_a.len(), rank.groups.len()),
        });
    }
    let groups = rank
        .groups
        .iter()
        .zip(wo_a)
        .map(|(g, t)| {
            let offset = (g.heads.start - rank.heads.start) * d;
            // High precision whatever its storage (spec §4.4), as the unsplit model.
            let l = Linear {
                w: t.data,
                out: t.rows,
                inp: t.cols,
                act_quant: false,
            };
            (g.clone(), offset, l)
        })
        .collect();
    let wo_b_name = format!("{p}wo_b.weight");
    let wo_b = if src.holds(&wo_b_name) {
        Some(src.f32(&wo_b_name)?)
    } else {
        None
    };
    let wo_b_act_quant = wo_b.as_ref().is_some_and(|t| t.stored.is_quantized());
    let wo_b = wo_b.map(|t| Linear {
        out: t.shape.first().copied().unwrap_or(0),
        inp: t.shape.get(1).copied().unwrap_or(0),
        w: t.data,
        // The caller quantises the whole latent row first, as the unsplit model does.
        act_quant: false,
    });
    Ok(OutProjection {
        groups,
        wo_b,
        wo_b_act_quant,
    })
}

/// The held experts (zero experts in place of the others) and the shared expert's rows.
fn moe(
    l: &Loader<'_, RankSource>,
    cfg: &ModelConfig,
    rank: &RankPlan,
    layer: usize,
    p: &str,
) -> Result<MoeWeights, CheckpointError> {
    let d = cfg.hidden_size;
    let experts = (0..cfg.n_routed_experts)
        .map(|e| {
            if rank.experts.contains(&e) {
                l.expert(&format!("{p}experts.{e}"))
            } else {
                Ok(zero_expert(d))
            }
        })
        .collect::<Result<_, _>>()?;
    let shared = if rank.shared_rows.is_empty() {
        zero_expert(d)
    } else {
        l.expert(&format!("{p}shared_experts"))?
    };
    l.moe_with(cfg, layer, p, experts, shared)
}
