//! One rank's weights, built from its loaded shares through the reference weight builder
//! ([`Loader`] over a [`RankSource`]): whole blocks in layer mode, the rank's share of every
//! block (MTP included) in tensor mode. Nothing unsplit is ever assembled.

use super::plan::{RankPlan, SplitMode, SplitPlan};
use super::slice::{rank_attention_config, tensor_block, OutProjection};
use super::source::RankSource;
use crate::model::checkpoint::CheckpointError;
use crate::model::ModelConfig;
pub use crate::reference::weights::MtpHead;
use crate::reference::weights::{BlockWeights, HcParams, Linear, Loader};
use std::ops::Range;

/// One rank's weights.
pub struct RankModel {
    pub rank: usize,
    /// Main layers held (`blocks[i]` is layer `layers.start + i`).
    pub layers: Range<usize>,
    /// The config the reference attention sees on this rank (tensor mode: its heads).
    pub attn_cfg: ModelConfig,
    pub blocks: Vec<BlockWeights>,
    /// Tensor mode: the rank's output projection per layer (empty in layer mode).
    pub out: Vec<OutProjection>,
    /// The rank's (share of the) MTP block.
    pub mtp: Option<MtpBlock>,
}

pub struct MtpBlock {
    pub block: BlockWeights,
    /// Tensor mode: the rank's output projection of the MTP attention.
    pub out: Option<OutProjection>,
}

/// The vocabulary side: HC head, final norm, head.
#[derive(Debug, Clone)]
pub struct HeadSide {
    pub head: Linear,
    pub norm: Vec<f32>,
    pub hc_head: HcParams,
}

/// What a rank holds beyond its blocks. Replicated on every rank in tensor mode; the
/// simulation keeps the first copy of each.
pub struct RankGlobals {
    pub embed: Option<Vec<f32>>,
    pub head: Option<HeadSide>,
    pub mtp: Option<MtpHead>,
}

/// Builds rank `src.rank()` of `plan`, using every tensor its shares hold.
pub fn build_rank(
    plan: &SplitPlan,
    src: RankSource,
) -> Result<(RankModel, RankGlobals), CheckpointError> {
    let (cfg, rp) = (&plan.cfg, &plan.ranks[src.rank()]);
    let l = Loader { src: &src };
    let mut blocks = Vec::with_capacity(rp.layers.len());
    let mut out = Vec::new();
    for layer in rp.layers.clone() {
        let (b, o) = block(&l, plan, rp, layer)?;
        blocks.push(b);
        out.extend(o);
    }
    let mtp = if rp.mtp {
        let (block, out) = block(&l, plan, rp, cfg.num_hidden_layers)?;
        Some(MtpBlock { block, out })
    } else {
        None
    };
    let globals = RankGlobals {
        embed: rp.embed.then(|| l.vec("embed.weight")).transpose()?,
        head: rp.head.then(|| head_side(&l)).transpose()?,
        mtp: rp.mtp.then(|| l.mtp_head(cfg)).transpose()?,
    };
    let attn_cfg = match plan.mode {
        SplitMode::Layer => cfg.clone(),
        SplitMode::Tensor => rank_attention_config(cfg, rp),
    };
    src.finish()?;
    let model = RankModel {
        rank: rp.rank,
        layers: rp.layers.clone(),
        attn_cfg,
        blocks,
        out,
        mtp,
    };
    Ok((model, globals))
}

fn block(
    l: &Loader<'_, RankSource>,
    plan: &SplitPlan,
    rp: &RankPlan,
    layer: usize,
) -> Result<(BlockWeights, Option<OutProjection>), CheckpointError> {
    match plan.mode {
        SplitMode::Layer => Ok((l.block(&plan.cfg, layer)?, None)),
        SplitMode::Tensor => {
            let (b, o) = tensor_block(l, &plan.cfg, rp, layer)?;
            Ok((b, Some(o)))
        }
    }
}

fn head_side(l: &Loader<'_, RankSource>) -> Result<HeadSide, CheckpointError> {
    Ok(HeadSide {
        head: l.linear_plain("head")?,
        norm: l.vec("norm.weight")?,
        hc_head: l.hc("hc_head")?,
    })
}
