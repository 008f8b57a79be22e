//! The tensor split's parts of a prefill call, on one rank (the prefill side of `gpu::attention::rank` and
//! the split MoE of `gpu::multi::rank`): the rank's heads through the stages of one GPU, its touched groups'
//! `wo_a` into f32 latents, its owned groups' `wo_b` columns into an f32 partial `[rows, hidden]`; the MoE
//! routed as unsplit (replicated), then only the rank's experts and shared-expert rows, summed into the
//! partial. The caller all-reduces the latents (with an exchange) and the partials between the parts.

use super::attn::{self, Call};
use super::moe;
use super::plan::Plan;
use super::{PrefillHook, PrefillWs};
use crate::api::Numerics;
use crate::gpu::attention::rank::RankOut;
use crate::gpu::attention::{dptr, dptr_mut, AttnState};
use crate::gpu::model::{hc_pre, Mixer, Post};
use crate::gpu::weights::BlockDev;
use crate::gpu::RunnerError;
use crate::model::ModelConfig;
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, GpuContext};
use std::ops::Range;

/// A rank's buffers of the split parts, for `max_tokens` rows.
pub struct TpPrefillWs {
    /// f32 latents `[groups, rows, o_lora_rank]` (every group of the model when exchanging).
    pub lat: CudaSlice<f32>,
    u: CudaSlice<bf16>,
    cols: CudaSlice<bf16>,
    /// The rank's f32 partial `[rows, hidden]` of the attention or MoE output (all-reduced in place).
    pub part: CudaSlice<f32>,
    /// The call's expert ids as ids of the rank's experts (-1: another rank's).
    local: CudaSlice<i32>,
}

impl TpPrefillWs {
    pub fn new(
        ctx: &GpuContext,
        cfg: &ModelConfig,
        max_tokens: usize,
    ) -> Result<Self, RunnerError> {
        let t = max_tokens.max(1);
        let s = &ctx.stream;
        let lat = t * cfg.o_groups * cfg.o_lora_rank;
        Ok(TpPrefillWs {
            lat: s.alloc_zeros(lat)?,
            u: s.alloc_zeros(lat)?,
            cols: s.alloc_zeros(lat)?,
            part: s.alloc_zeros(t * cfg.hidden_size)?,
            local: s.alloc_zeros(t * cfg.num_experts_per_tok)?,
        })
    }
}

/// What every part needs besides buffers: the device, the planned call (on this rank's workspace), the
/// full model config (replicated parts) and the numerics.
pub struct TpCall<'a> {
    pub ctx: &'a GpuContext,
    pub plan: &'a Plan,
    pub cfg: &'a ModelConfig,
    pub numerics: Numerics,
    /// The rank workspace's wgmma weight scratch (`PrefillWs::wbf_scratch`), as the unsplit call's.
    pub wbf: Option<(u64, usize)>,
}

impl TpCall<'_> {
    fn with<T>(&self, f: impl FnOnce(&Call<'_>) -> T) -> T {
        let s = self.ctx.stream.clone();
        f(&Call {
            ctx: self.ctx,
            s: &s,
            plan: self.plan,
            official: self.numerics == Numerics::Official,
            wbf: self.wbf,
        })
    }
}

/// HCPre and norm, the rank's heads (`blk.attn` holds them) updating `state`, and its touched groups'
/// `wo_a` into `tp.lat` (zeros elsewhere when exchanging: the caller then sums the latents over ranks).
pub fn attn_heads(
    tc: &TpCall<'_>,
    blk: &BlockDev,
    out: &RankOut,
    state: &mut AttnState,
    ws: &mut PrefillWs,
    tp: &mut TpPrefillWs,
    hook: PrefillHook<'_>,
) -> Result<(), RunnerError> {
    let (ctx, cfg, rows) = (tc.ctx, tc.cfg, tc.plan.rows);
    let (mixer, norm) = (Mixer::Attn { quant: false }, &blk.attn_norm);
    hc_pre(ctx, cfg, ws, rows, &blk.hc_attn, norm, mixer, Post::None)?;
    hook("hc_pre.attn")?;
    tc.with(|c| attn::heads(c, &blk.attn, state, ws, hook))?;
    let lora = cfg.o_lora_rank;
    let slots: Vec<usize> = if out.exchange {
        let n = out.exchange_len(rows, lora);
        ctx.stream.memset_zeros(&mut tp.lat.slice_mut(..n))?;
        out.groups.clone()
    } else {
        (0..out.groups.len()).collect()
    };
    let lat = dptr_mut(&mut tp.lat, &ctx.stream);
    tc.with(|c| attn::wo_a(c, &blk.attn, ws, lat, &slots))
}

/// The owned groups' `wo_b` columns of the (summed, when exchanging) latents into `tp.part` (zeros when
/// the rank owns no group).
pub fn attn_project(
    tc: &TpCall<'_>,
    out: &RankOut,
    tp: &mut TpPrefillWs,
) -> Result<(), RunnerError> {
    let (ctx, s) = (tc.ctx, &tc.ctx.stream);
    let (rows, lora, d) = (tc.plan.rows, tc.cfg.o_lora_rank, tc.cfg.hidden_size);
    let Some(wo_b) = &out.wo_b else {
        s.memset_zeros(&mut tp.part.slice_mut(..rows * d))?;
        return Ok(());
    };
    let groups = if out.exchange {
        out.total_groups
    } else {
        out.owned.len()
    };
    let (lat, u) = (dptr(&tp.lat, s), dptr_mut(&mut tp.u, s));
    tc.with(|c| attn::regroup(c, tc.cfg, lat, groups, u))?;
    let x = if out.exchange {
        let cols = out.owned.start * lora..out.owned.end * lora;
        ctx.launch_gather_cols_bf16(s, rows, groups * lora, cols, &tp.u, &mut tp.cols)?;
        dptr(&tp.cols, s)
    } else {
        dptr(&tp.u, s)
    };
    let job = super::gemm::Job::new(
        s,
        x,
        &wo_b.w,
        &wo_b.scale,
        dptr_mut(&mut tp.part, s),
        wo_b.n,
    );
    tc.with(|c| super::gemm::fp8(c, rows, wo_b.k, false, &[job]))
}

/// HCPost with the summed partial as the sub-block output (bf16 of the f32 sum, as unsplit).
pub fn post(tc: &TpCall<'_>, ws: &mut PrefillWs, tp: &TpPrefillWs) -> Result<(), RunnerError> {
    let (ctx, rows, d) = (tc.ctx, tc.plan.rows, tc.cfg.hidden_size);
    let part = &tp.part;
    ctx.launch_hc_post_moe(
        &ctx.stream,
        rows,
        d,
        0,
        &mut ws.io.x,
        &ws.io.mix,
        part,
        part,
    )?;
    Ok(())
}

/// HCPre and norm, the routing (replicated), the rank's `experts` (global ids; its bank holds exactly
/// these) and, with `shared`, its shared-expert rows, summed into `tp.part`.
#[allow(clippy::too_many_arguments)]
pub fn moe(
    tc: &TpCall<'_>,
    blk: &BlockDev,
    experts: Range<usize>,
    shared: bool,
    ws: &mut PrefillWs,
    tp: &mut TpPrefillWs,
    hook: PrefillHook<'_>,
) -> Result<(), RunnerError> {
    let (ctx, cfg, s) = (tc.ctx, tc.cfg, &tc.ctx.stream);
    let (rows, k, d) = (tc.plan.rows, cfg.num_experts_per_tok, cfg.hidden_size);
    let quant = tc.numerics == Numerics::Official;
    let mixer = Mixer::Ffn { quant };
    hc_pre(
        ctx,
        cfg,
        ws,
        rows,
        &blk.hc_ffn,
        &blk.ffn_norm,
        mixer,
        Post::None,
    )?;
    hook("hc_pre.ffn")?;
    tc.with(|c| moe::route(c, cfg, &blk.moe, ws))?;
    ctx.launch_moe_localize(s, rows * k, experts.clone(), &ws.moe.ids, &mut tp.local)?;
    if !experts.is_empty() {
        let (ids, n) = (dptr(&tp.local, s), experts.len());
        tc.with(|c| -> Result<(), RunnerError> {
            let grouping = moe::group(c, cfg, ws, ids, n)?;
            moe::routed(c, cfg, &blk.moe.bank, ws, grouping, n)
        })?;
    }
    hook("moe.routed")?;
    if shared {
        tc.with(|c| moe::shared(c, &blk.moe, cfg.swiglu_limit, ws))?;
    }
    let m = &ws.moe;
    let sh = shared.then_some(&m.ex.y_shared);
    ctx.launch_moe_rank_sum(s, rows, k, d, &m.ex.y_routed, &tp.local, sh, &mut tp.part)?;
    hook("moe.shared")
}
