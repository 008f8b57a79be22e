//! Batched prefill on the GPU: the tokens of one or more sequences (each a contiguous chunk at its current
//! position; decode rows are chunks of one) go through every block in one pass per layer, with tensor-core
//! GEMMs over all rows, the FP4 routed experts grouped per expert, and the attention, compressors and indexer
//! over all queries at once (see attn.rs). Each sequence's attention state (window ring, compressed caches,
//! compressor states) ends exactly where the same tokens fed as decode steps leave it, so decode continues
//! from a prefilled sequence unchanged.
//!
//! Not graph-captured: the host plans each call (plan.rs) from positions it knows, and uploads the plan with
//! two copies. Buffers are allocated once for `max_tokens` rows ([`PrefillWs`]).

mod attn;
pub(crate) mod feed;
mod gemm;
mod moe;
mod plan;
pub(crate) mod tp;
mod ws;

pub(crate) use plan::Plan;
pub use ws::PrefillWs;

use super::attention::{AttnLayer, AttnState};
use super::model::{hc_head, hc_pre, GpuModel, HcBufs, HcWorkspace, Mixer, Post};
use super::weights::BlockDev;
use super::RunnerError;
use crate::api::Numerics;
use crate::model::ModelConfig;
use attn::Call;
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::PfWeights;
use dsv4_kernels::{bf16, GpuContext, HC_STREAMS};

/// One sequence's part of a prefill call: `tokens` fed from position `pos` into state slot `slot`.
#[derive(Debug, Clone, Copy)]
pub struct PrefillSeg<'a> {
    pub slot: usize,
    pub pos: usize,
    pub tokens: &'a [u32],
}

/// Whether the prefill kernels run this model here: head dims with a kernel instance that fits the device's
/// shared memory, GEMM inner dims in whole 16-byte chunks (FP4 experts: 32 values). Otherwise prefill chunks
/// run as decode steps.
pub fn supported(ctx: &GpuContext, cfg: &ModelConfig) -> bool {
    let (d, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let g_in = cfg.num_attention_heads * cfg.head_dim / cfg.o_groups.max(1);
    let fp8_k = [d, cfg.q_lora_rank, g_in, cfg.o_groups * cfg.o_lora_rank, i];
    ctx.kernels
        .prefill
        .supports(cfg.head_dim, cfg.index_head_dim)
        && fp8_k.iter().all(|k| k % 16 == 0)
        && d % 32 == 0
        && i % 32 == 0
        && cfg.n_routed_experts <= dsv4_kernels::prefill::PF_GROUP_MAX_EXPERTS
}

/// One attention block over one call on its own (tests compare it with decode steps on the same inputs): `a`
/// bf16 `[rows, hidden]` are the segments' normalised block inputs in call order; returns the block output
/// `[rows, hidden]`, leaving `state` as the same tokens fed as decode steps would.
pub fn prefill_attention(
    ctx: &GpuContext,
    layer: &AttnLayer,
    state: &mut AttnState,
    ws: &mut PrefillWs,
    segs: &[PrefillSeg<'_>],
    a: &[bf16],
    numerics: Numerics,
) -> Result<Vec<bf16>, RunnerError> {
    let s = ctx.stream.clone();
    let plan = Plan::build(&s, &layer.cfg, ws, segs, state.max_context)?;
    let n = plan.rows * layer.cfg.hidden_size;
    if a.len() != n {
        return Err(RunnerError::Unsupported(format!(
            "prefill_attention: {} inputs for {} rows",
            a.len(),
            plan.rows
        )));
    }
    s.memcpy_htod(a, &mut ws.io.a.slice_mut(..n))?;
    let c = Call {
        ctx,
        s: &s,
        plan: &plan,
        official: numerics == Numerics::Official,
        wbf: ws.wbf_scratch(&s),
    };
    attn::attention(&c, layer, state, ws, &mut |_| Ok(()))?;
    let mut out = vec![bf16::ZERO; n];
    s.memcpy_dtoh(&ws.io.attn_out.slice(..n), &mut out)?;
    s.synchronize()?;
    Ok(out)
}

/// Called after each stage with its name (the bench records an event there); normally a no-op.
pub type PrefillHook<'a> = &'a mut dyn FnMut(&'static str) -> Result<(), RunnerError>;

impl GpuModel {
    /// Feeds every segment's tokens (distinct slots), then runs the HC head, head and argmax on each
    /// segment's last row into rows 0..segs.len() of the decode workspace: read them with
    /// [`GpuModel::read_next`] / [`GpuModel::read_logits`].
    pub fn prefill(
        &mut self,
        ws: &mut PrefillWs,
        segs: &[PrefillSeg<'_>],
    ) -> Result<(), RunnerError> {
        self.prefill_with(ws, segs, &mut |_| Ok(()))
    }

    /// [`GpuModel::prefill`] calling `hook` after each stage.
    pub fn prefill_with(
        &mut self,
        ws: &mut PrefillWs,
        segs: &[PrefillSeg<'_>],
        hook: PrefillHook<'_>,
    ) -> Result<(), RunnerError> {
        if segs.len() > self.ws.max_rows {
            return Err(RunnerError::TooManyRows {
                rows: segs.len(),
                max: self.ws.max_rows,
            });
        }
        let plan = self.prefill_blocks(ws, segs, hook)?;
        last_rows_to(&self.ctx, &self.cfg, &plan, ws, &mut self.ws.io.x)?;
        self.head_rows(segs.len())?;
        hook("head")
    }

    /// Feeds the segments and returns the logits of every row, `[rows, vocab]` f32 in call order (tests
    /// compare every position with the CPU reference). Allocates the logits buffer per call.
    pub fn prefill_all_logits(
        &mut self,
        ws: &mut PrefillWs,
        segs: &[PrefillSeg<'_>],
    ) -> Result<Vec<f32>, RunnerError> {
        let plan = self.prefill_blocks(ws, segs, &mut |_| Ok(()))?;
        let (ctx, cfg, w) = (&self.ctx, &self.cfg, &self.weights);
        let (rows, v, d) = (plan.rows, cfg.vocab_size, cfg.hidden_size);
        hc_head(ctx, cfg, ws, rows, &w.hc_head, &w.norm, Post::None)?;
        let s = &ctx.stream;
        let mut logits: CudaSlice<f32> = s.alloc_zeros(rows * v)?;
        let job = gemm::Job::bf16(
            s,
            gemm::at(&ws.io.a, s, 0),
            &w.head,
            gemm::at_mut(&mut logits, s, 0),
            v,
        );
        gemm::dense(ctx, s, PfWeights::Bf16, rows, d, false, &[job])?;
        Ok(s.clone_dtoh(&logits)?)
    }

    /// Embedding and every block over the call's rows; returns the plan (rows, last rows).
    fn prefill_blocks(
        &mut self,
        ws: &mut PrefillWs,
        segs: &[PrefillSeg<'_>],
        hook: PrefillHook<'_>,
    ) -> Result<Plan, RunnerError> {
        let max_context = self.states.first().map_or(0, |st| st.max_context);
        let (ctx, cfg, w) = (&self.ctx, &self.cfg, &self.weights);
        let plan = plan_call(ctx, cfg, ws, segs, max_context)?;
        embed(ctx, cfg, &plan, ws, &w.embed)?;
        hook("embed")?;
        let blocks = Blocks {
            blocks: &w.blocks,
            states: &mut self.states,
            numerics: self.numerics,
        };
        run_blocks(ctx, cfg, &plan, blocks, ws, hook)?;
        Ok(plan)
    }
}

/// Lays the segments out as the call's rows on `ws` (uploads the per-row arrays) for states of
/// `max_context` tokens.
pub(crate) fn plan_call(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    ws: &mut PrefillWs,
    segs: &[PrefillSeg<'_>],
    max_context: usize,
) -> Result<Plan, RunnerError> {
    Plan::build(&ctx.stream, cfg, ws, segs, max_context)
}

/// The residual streams of the call's rows from the embedding table (a runner holding it).
pub(crate) fn embed(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    plan: &Plan,
    ws: &mut PrefillWs,
    table: &CudaSlice<bf16>,
) -> Result<(), RunnerError> {
    let s = &ctx.stream;
    ctx.launch_embed_streams(
        s,
        plan.rows,
        cfg.hidden_size,
        &ws.tokens,
        table,
        &mut ws.io.x,
    )?;
    Ok(())
}

/// Consecutive blocks of the model and their attention states (the whole model on one GPU, a rank's
/// layers in the layer split).
pub(crate) struct Blocks<'a> {
    pub blocks: &'a [BlockDev],
    pub states: &'a mut [AttnState],
    pub numerics: Numerics,
}

/// Every block of `b` over the call's rows of the residual streams `ws.io.x`, in place: the per-block prefill
/// of both runners.
pub(crate) fn run_blocks(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    plan: &Plan,
    b: Blocks<'_>,
    ws: &mut PrefillWs,
    hook: PrefillHook<'_>,
) -> Result<(), RunnerError> {
    let s = ctx.stream.clone();
    let (rows, d, k) = (plan.rows, cfg.hidden_size, cfg.num_experts_per_tok);
    let official = b.numerics == Numerics::Official;
    let c = Call {
        ctx,
        s: &s,
        plan,
        official,
        wbf: ws.wbf_scratch(&s),
    };
    // HCPost as its own launch here (the prefill workspace has no scratch streams to fuse it into the
    // next HCPre; one launch is negligible next to the 8K-row work).
    let (attn, ffn) = (Mixer::Attn { quant: false }, Mixer::Ffn { quant: official });
    for (blk, state) in b.blocks.iter().zip(b.states.iter_mut()) {
        let none = Post::None;
        hc_pre(ctx, cfg, ws, rows, &blk.hc_attn, &blk.attn_norm, attn, none)?;
        hook("hc_pre.attn")?;
        attn::attention(&c, &blk.attn, state, ws, hook)?;
        ctx.launch_hc_post(&s, rows, d, &mut ws.io.x, &ws.io.mix, &ws.io.attn_out)?;
        hook("hc_post.attn")?;
        hc_pre(ctx, cfg, ws, rows, &blk.hc_ffn, &blk.ffn_norm, ffn, none)?;
        hook("hc_pre.ffn")?;
        moe::forward(&c, cfg, &blk.moe, ws, hook)?;
        let (yr, ys) = (&ws.moe.ex.y_routed, &ws.moe.ex.y_shared);
        ctx.launch_hc_post_moe(&s, rows, d, k, &mut ws.io.x, &ws.io.mix, yr, ys)?;
        hook("hc_post.ffn")?;
    }
    Ok(())
}

/// Copies each segment's last row of residual streams into rows 0..segs of `x` (a decode workspace's
/// streams, where the head reads them).
pub(crate) fn last_rows_to(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    plan: &Plan,
    ws: &PrefillWs,
    x: &mut CudaSlice<bf16>,
) -> Result<(), RunnerError> {
    let s = &ctx.stream;
    let width = HC_STREAMS * cfg.hidden_size;
    for (j, &r) in plan.last_rows.iter().enumerate() {
        let src = ws.io.x.slice(r * width..(r + 1) * width);
        s.memcpy_dtod(&src, &mut x.slice_mut(j * width..(j + 1) * width))?;
    }
    Ok(())
}

impl HcWorkspace for PrefillWs {
    fn hc_bufs(&mut self) -> HcBufs<'_> {
        HcBufs {
            x: &mut self.io.x,
            // No scratch streams: prefill runs each HCPost as its own launch.
            x_post: None,
            hc_ws: &mut self.io.hc_ws,
            mix: &mut self.io.mix,
            a: &mut self.io.a,
            aq: &mut self.io.aq,
            xq: None,
            codes: None,
            attn_out: &self.io.attn_out,
            y_routed: &self.moe.ex.y_routed,
            y_shared: &self.moe.ex.y_shared,
        }
    }
}
