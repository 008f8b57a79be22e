//! One block in tensor mode. The residual streams, mHC mixing and norms are replicated on
//! every rank (they cost `n·D` per token and would otherwise need their own collectives);
//! the simulation computes them once. Attention and MoE run per rank on the rank's share
//! and meet in all-reduces.

use super::collective::{Collective, CollectiveError};
use super::slice::OutProjection;
use super::split_model::{reduce, SplitModel};
use crate::api::Numerics;
use crate::model::ModelConfig;
use crate::reference::attention::{self, BlockCtx, Segment};
use crate::reference::mhc::{hc_post, hc_pre, HcMix};
use crate::reference::moe;
use crate::reference::ops::rmsnorm_rows;
use crate::reference::quant::fake_quant_fp8;
use crate::reference::rope::Rope;
use crate::reference::state::LayerState;
use crate::reference::weights::{BlockWeights, HcParams, ACT_QUANT_BLOCK};
use std::ops::Range;

/// One rank's share of one block (main layer or MTP) and the states of the batch's items.
pub(super) struct RankLayer<'a> {
    /// The rank-local attention config (its heads).
    pub cfg: &'a ModelConfig,
    pub block: &'a BlockWeights,
    pub out: &'a OutProjection,
    /// Groups whose `wo_b` columns the rank multiplies.
    pub owned: Range<usize>,
    pub states: Vec<&'a mut LayerState>,
}

/// Runs one block split over `ranks` on `streams` `[T, n, D]` in place.
pub(super) fn block<C: Collective<Buf = [f32]>>(
    m: &SplitModel<C>,
    rope: &Rope,
    ranks: &mut [RankLayer<'_>],
    streams: &mut [f32],
    tokens: &[u32],
    segs: &[Segment],
) -> Result<(), CollectiveError> {
    let (cfg, n, d) = (&m.cfg, m.cfg.hc_mult, m.cfg.hidden_size);
    // Replicated parts are identical on every rank: take rank 0's copy.
    let w0 = ranks
        .first()
        .map(|r| r.block)
        .ok_or(CollectiveError::WrongRankCount {
            world: m.plan.world(),
            got: 0,
        })?;
    let (mut a, mix) = collapse(m, &w0.hc_attn, streams);
    rmsnorm_rows(&mut a, &w0.attn_norm, cfg.rms_norm_eps);
    let attn_out = attention_all_ranks(m, rope, ranks, &a, segs)?;
    hc_post(&attn_out, streams, &mix, n, d);

    let (mut x, mix) = collapse(m, &w0.hc_ffn, streams);
    rmsnorm_rows(&mut x, &w0.ffn_norm, cfg.rms_norm_eps);
    let parts = ranks
        .iter()
        .map(|r| moe::forward(cfg, &r.block.moe, &x, tokens, m.numerics).0)
        .collect();
    let ffn_out = reduce(&m.collective, parts)?;
    hc_post(&ffn_out, streams, &mix, n, d);
    Ok(())
}

fn collapse<C: Collective<Buf = [f32]>>(
    m: &SplitModel<C>,
    hc: &HcParams,
    streams: &[f32],
) -> (Vec<f32>, Vec<HcMix>) {
    let c = &m.cfg;
    hc_pre(
        hc,
        streams,
        c.hc_mult,
        c.hidden_size,
        c.rms_norm_eps,
        c.hc_eps,
        c.hc_sinkhorn_iters,
    )
}

/// Per rank: its heads through the reference attention, its groups' `wo_a`; then (when the
/// plan says so) the latents summed; then each rank's `wo_b` columns, summed.
fn attention_all_ranks<C: Collective<Buf = [f32]>>(
    m: &SplitModel<C>,
    rope: &Rope,
    ranks: &mut [RankLayer<'_>],
    a: &[f32],
    segs: &[Segment],
) -> Result<Vec<f32>, CollectiveError> {
    let rows = a.len() / m.cfg.hidden_size;
    let exchange = m.plan.exchange_latent;
    let mut latents = Vec::with_capacity(ranks.len());
    for rank in ranks.iter_mut() {
        let ctx = BlockCtx {
            cfg: rank.cfg,
            rope,
            numerics: m.numerics,
        };
        let heads = attention::forward_heads(&ctx, &rank.block.attn, a, segs, &mut rank.states);
        latents.push(latent(m, rank.out, &heads, rows, exchange));
    }
    if exchange {
        latents = vec_of(reduce(&m.collective, latents)?, ranks.len());
    }
    let lora = m.cfg.o_lora_rank;
    let parts = ranks
        .iter()
        .zip(&latents)
        .map(|(rank, u)| {
            let cols = if exchange {
                rank.owned.start * lora..rank.owned.end * lora
            } else {
                0..rank.owned.len() * lora
            };
            wo_b_partial(m, rank.out, u, rows, cols)
        })
        .collect();
    reduce(&m.collective, parts)
}

/// Every rank holds the same summed buffer after an all-reduce; the simulation copies it.
fn vec_of(sum: Vec<f32>, ranks: usize) -> Vec<Vec<f32>> {
    vec![sum; ranks]
}

/// `[rows, width]` latents `wo_a[g](o_g)` of the rank's groups: full width (all groups, zero
/// where the rank has no heads) for an exchange, else just the owned groups.
fn latent<C: Collective<Buf = [f32]>>(
    m: &SplitModel<C>,
    out: &OutProjection,
    heads: &[f32],
    rows: usize,
    exchange: bool,
) -> Vec<f32> {
    let lora = m.cfg.o_lora_rank;
    let first_owned = out.groups.first().map_or(0, |(g, _, _)| g.group);
    let groups = if exchange {
        m.cfg.o_groups
    } else {
        out.groups.len()
    };
    let width = groups * lora;
    let mut u = vec![0.0f32; rows * width];
    let hw = heads.len() / rows.max(1);
    for (g, offset, wa) in &out.groups {
        let input: Vec<f32> = heads
            .chunks(hw)
            .flat_map(|r| r[*offset..offset + wa.inp].iter().copied())
            .collect();
        let ug = wa.forward(&input, m.numerics);
        let col = if exchange {
            g.group
        } else {
            g.group - first_owned
        } * lora;
        for (dst, src) in u.chunks_mut(width).zip(ug.chunks(lora)) {
            dst[col..col + lora].copy_from_slice(src);
        }
    }
    u
}

/// The rank's `wo_b` columns applied to its slice `cols` of the latent rows (activation
/// quantisation on the whole row first, as the unsplit model does).
fn wo_b_partial<C: Collective<Buf = [f32]>>(
    m: &SplitModel<C>,
    out: &OutProjection,
    u: &[f32],
    rows: usize,
    cols: std::ops::Range<usize>,
) -> Vec<f32> {
    let d = m.cfg.hidden_size;
    let Some(wo_b) = &out.wo_b else {
        return vec![0.0; rows * d];
    };
    let width = u.len() / rows.max(1);
    let quant = m.numerics == Numerics::Official && out.wo_b_act_quant;
    let mut x = Vec::with_capacity(rows * cols.len());
    let mut row_buf = vec![0.0f32; width];
    for row in u.chunks(width) {
        row_buf.copy_from_slice(row);
        if quant {
            fake_quant_fp8(&mut row_buf, ACT_QUANT_BLOCK);
        }
        x.extend_from_slice(&row_buf[cols.clone()]);
    }
    wo_b.forward(&x, m.numerics)
}
