//! One decode step on the device for `rows` rows (each a sequence slot feeding one token at its
//! position): embed -> per block (HCPre+norm -> attention -> HCPost -> HCPre+norm -> MoE -> HCPost)
//! -> HCHead+norm -> head -> argmax. Each HCPost runs fused into the HCPre that follows it (the block's
//! ffn mixer, the next block's attention mixer, the HC head): see [`Post`]. Everything is enqueued on
//! `ctx.stream` (the MoE's shared expert on the workspace's side stream, joined back) with no host sync,
//! no allocation and per-step values read from device buffers, so the step can be captured as a graph.

use super::attention::{self, q8_engaged, AttnState, DecodeIn};
use super::moe::{self, Hook};
use super::weights::{BlockDev, HcDev, ModelWeightsDev};
use super::workspace::{CodesOf, HcCodeBufs, Workspace};
use super::RunnerError;
use crate::api::Numerics;
use crate::model::ModelConfig;
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{
    bf16, GemvOut, GemvWeights, GpuContext, HcCodes, HcPost, HcPostF, HcPre, Q8Kernel,
};
use std::sync::OnceLock;

/// Host values of one step; `tokens`, `slots` and `positions` have one entry per row.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    pub tokens: &'a [i32],
    pub slots: &'a [i32],
    pub positions: &'a [i32],
}

pub struct GpuModel {
    pub ctx: GpuContext,
    pub cfg: ModelConfig,
    pub weights: ModelWeightsDev,
    /// One per main block, each with `seq_slots + 1` slots (the last takes padding rows).
    pub states: Vec<AttnState>,
    pub ws: Workspace,
    pub numerics: Numerics,
    pub seq_slots: usize,
    /// Host staging for the padded step inputs (reused: no per-step allocation).
    staging: [Vec<i32>; 3],
}

impl GpuModel {
    pub fn new(
        ctx: GpuContext,
        cfg: ModelConfig,
        weights: ModelWeightsDev,
        numerics: Numerics,
        seq_slots: usize,
        max_rows: usize,
        max_context: usize,
    ) -> Result<Self, RunnerError> {
        let states = (0..cfg.num_hidden_layers)
            .map(|l| AttnState::new(&ctx, &cfg, l, seq_slots + 1, max_context))
            .collect::<Result<Vec<_>, _>>()?;
        let ws = Workspace::new(&ctx, &cfg, max_rows)?;
        let staging = [vec![0; max_rows], vec![0; max_rows], vec![0; max_rows]];
        Ok(GpuModel {
            ctx,
            cfg,
            weights,
            states,
            ws,
            numerics,
            seq_slots,
            staging,
        })
    }

    /// The slot that padding rows write to (never a sequence's).
    pub fn pad_slot(&self) -> usize {
        self.seq_slots
    }

    /// Copies a step's inputs to the device, padded to `rows` (>= the input's rows) with harmless rows.
    pub fn upload(&mut self, input: &StepInput<'_>, rows: usize) -> Result<(), RunnerError> {
        let n = input.tokens.len();
        if rows > self.ws.max_rows || n > rows {
            return Err(RunnerError::TooManyRows {
                rows,
                max: self.ws.max_rows,
            });
        }
        let pad = [0, self.pad_slot() as i32, 0];
        let srcs = [input.tokens, input.slots, input.positions];
        for ((buf, src), p) in self.staging.iter_mut().zip(srcs).zip(pad) {
            buf[..n].copy_from_slice(src);
            buf[n..rows].iter_mut().for_each(|v| *v = p);
        }
        let s = &self.ctx.stream;
        let ws = &mut self.ws;
        s.memcpy_htod(&self.staging[0][..rows], &mut ws.tokens.slice_mut(..rows))?;
        s.memcpy_htod(
            &self.staging[1][..rows],
            &mut ws.meta.slots.slice_mut(..rows),
        )?;
        s.memcpy_htod(
            &self.staging[2][..rows],
            &mut ws.meta.positions.slice_mut(..rows),
        )?;
        Ok(())
    }

    /// Enqueues one step over `rows` rows of the uploaded inputs (capturable).
    pub fn step(&mut self, rows: usize) -> Result<(), RunnerError> {
        self.step_with(rows, &mut |_, _| Ok(()))
    }

    /// [`Self::step`] calling `hook` after each op (per-op timing in `dsv4 bench --profile`).
    pub fn step_with(&mut self, rows: usize, hook: Hook<'_>) -> Result<(), RunnerError> {
        if rows == 0 || rows > self.ws.max_rows {
            return Err(RunnerError::TooManyRows {
                rows,
                max: self.ws.max_rows,
            });
        }
        let (ctx, cfg, w, ws) = (&self.ctx, &self.cfg, &self.weights, &mut self.ws);
        let d = cfg.hidden_size;
        ctx.launch_embed_streams(&ctx.stream, rows, d, &ws.tokens, &w.embed, &mut ws.io.x)?;
        hook("embed", ws)?;
        let mut post = Post::None;
        for (blk, state) in w.blocks.iter().zip(self.states.iter_mut()) {
            post = run_block(ctx, cfg, blk, state, ws, rows, self.numerics, post, hook)?;
        }
        hc_head(ctx, cfg, ws, rows, &w.hc_head, &w.norm, post)?;
        hook("hc_head", ws)?;
        head(ctx, cfg, &w.head, ws, rows)?;
        hook("head", ws)
    }

    /// HC head, head and argmax of rows 0..rows of the workspace streams (a prefill copies each sequence's
    /// last row there), for [`Self::read_next`] / [`Self::read_logits`].
    pub(crate) fn head_rows(&mut self, rows: usize) -> Result<(), RunnerError> {
        let (ctx, cfg, w, ws) = (&self.ctx, &self.cfg, &self.weights, &mut self.ws);
        hc_head(ctx, cfg, ws, rows, &w.hc_head, &w.norm, Post::None)?;
        head(ctx, cfg, &w.head, ws, rows)
    }

    /// The greedy tokens of the last step's rows (one device-to-host copy: the step's one sync).
    pub fn read_next(&mut self, rows: usize) -> Result<Vec<i32>, RunnerError> {
        let mut out = vec![0i32; rows];
        self.ctx
            .stream
            .memcpy_dtoh(&self.ws.next.slice(..rows), &mut out)?;
        self.ctx.stream.synchronize()?;
        Ok(out)
    }

    /// The last step's logits of `row` (f32 [vocab]).
    pub fn read_logits(&self, row: usize) -> Result<Vec<f32>, RunnerError> {
        let v = self.cfg.vocab_size;
        let mut out = vec![0f32; v];
        let src = self.ws.logits.slice(row * v..(row + 1) * v);
        self.ctx.stream.memcpy_dtoh(&src, &mut out)?;
        self.ctx.stream.synchronize()?;
        Ok(out)
    }
}

/// One block on `ws.io.x` (HCPre+norm -> attention -> HCPost -> HCPre+norm -> MoE -> HCPost), the unsplit
/// model's and a layer-split rank's. `post`: the previous block's pending HCPost (fused into this block's
/// attention mixer). Returns this block's own pending HCPost (the MoE's): the caller fuses it into the next
/// HCPre or applies it with [`flush_post`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_block(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    blk: &BlockDev,
    state: &mut AttnState,
    ws: &mut Workspace,
    rows: usize,
    numerics: Numerics,
    post: Post,
    hook: Hook<'_>,
) -> Result<Post, RunnerError> {
    // Official numerics with an FP8 wq_a: the mixer also writes the attention's FP8 input copy.
    let quant = numerics == Numerics::Official && blk.attn.wq_a.act_quant();
    let (hc, norm) = (&blk.hc_attn, &blk.attn_norm);
    hc_pre(ctx, cfg, ws, rows, hc, norm, Mixer::Attn { quant }, post)?;
    hook("hc_pre.attn", ws)?;
    let inp = DecodeIn {
        xq_ready: quant,
        codes: ws.codes.of(CodesOf::Attn, &ctx.stream),
        ..DecodeIn::new(&ws.meta, rows, &ws.io.a)
    };
    let (sc, out) = (&mut ws.attn, &mut ws.io.attn_out);
    attention::decode(ctx, &ctx.stream, &blk.attn, state, &inp, sc, out, numerics)?;
    hook("attention", ws)?;
    let ffn = Mixer::Ffn {
        quant: numerics == Numerics::Official,
    };
    hc_pre(
        ctx,
        cfg,
        ws,
        rows,
        &blk.hc_ffn,
        &blk.ffn_norm,
        ffn,
        Post::Attn,
    )?;
    hook("hc_pre.ffn", ws)?;
    moe::forward(ctx, cfg, &blk.moe, ws, rows, numerics, hook)?;
    Ok(Post::Moe)
}

/// Applies a pending HCPost on its own (where no HCPre follows on these streams: a layer-split rank's
/// last block, whose streams go to the next rank).
pub(crate) fn flush_post(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    ws: &mut Workspace,
    rows: usize,
    post: Post,
) -> Result<(), RunnerError> {
    match post.source(cfg, &ws.io.attn_out, &ws.ex.y_routed, &ws.ex.y_shared) {
        Some(f) => post_alone(ctx, rows, cfg.hidden_size, &mut ws.io.x, &ws.io.mix, f),
        None => Ok(()),
    }
}

/// HCPost of `x` with `mix`'s coefficients and the sub-block output `f`, as its own launch.
fn post_alone(
    ctx: &GpuContext,
    rows: usize,
    d: usize,
    x: &mut CudaSlice<bf16>,
    mix: &CudaSlice<f32>,
    f: HcPostF<'_>,
) -> Result<(), RunnerError> {
    let s = &ctx.stream;
    match f {
        HcPostF::Bf16(f) => ctx.launch_hc_post(s, rows, d, x, mix, f)?,
        HcPostF::Moe {
            routed,
            shared,
            topk,
        } => ctx.launch_hc_post_moe(s, rows, d, topk, x, mix, routed, shared)?,
    }
    Ok(())
}

/// Which collapse an HCPre is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mixer {
    /// `quant`: also write the FP8-fake-quantised copy of `a` for the attention's FP8 wq_a/wkv (the
    /// workspace's `xq`; bit-identical to the attention's own x quant, which then skips its launch).
    Attn {
        quant: bool,
    },
    /// `quant`: also write the FP8-fake-quantised copy `aq` for the expert GEMVs.
    Ffn {
        quant: bool,
    },
    Head,
}

/// The HCPost still to apply to a workspace's streams before the next HCPre reads them (which fuses
/// it): its mixer's coefficients are in the workspace's `mix`, the sub-block output in its
/// `attn_out` (`Attn`) or `y_routed` + `y_shared` (`Moe`, the MoE's f32 outputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Post {
    None,
    Attn,
    Moe,
}

impl Post {
    /// The sub-block output this HCPost reads, from a workspace's buffers.
    fn source<'a>(
        self,
        cfg: &ModelConfig,
        attn_out: &'a CudaSlice<bf16>,
        y_routed: &'a CudaSlice<f32>,
        y_shared: &'a CudaSlice<f32>,
    ) -> Option<HcPostF<'a>> {
        match self {
            Post::None => None,
            Post::Attn => Some(HcPostF::Bf16(attn_out)),
            Post::Moe => Some(HcPostF::Moe {
                routed: y_routed,
                shared: y_shared,
                topk: cfg.num_experts_per_tok,
            }),
        }
    }
}

/// The buffers an HCPre reads and writes: the decode workspace's, or a prefill call's.
pub(crate) struct HcBufs<'a> {
    pub x: &'a mut CudaSlice<bf16>,
    /// Scratch streams for an HCPost fused into the HCPre (None: the workspace has none, the HCPost
    /// runs as its own launch first).
    pub x_post: Option<&'a mut CudaSlice<bf16>>,
    pub hc_ws: &'a mut CudaSlice<f32>,
    pub mix: &'a mut CudaSlice<f32>,
    pub a: &'a mut CudaSlice<bf16>,
    pub aq: &'a mut CudaSlice<bf16>,
    /// The attention's FP8 input copy ([`Mixer::Attn`] with `quant`; None: the workspace has none).
    pub xq: Option<&'a mut CudaSlice<bf16>>,
    /// Room for the e4m3 codes of the FP8 copy (None: the workspace has none, as prefill's).
    pub codes: Option<&'a mut HcCodeBufs>,
    /// The sub-block outputs a pending [`Post`] reads.
    pub attn_out: &'a CudaSlice<bf16>,
    pub y_routed: &'a CudaSlice<f32>,
    pub y_shared: &'a CudaSlice<f32>,
}

/// A workspace an HCPre runs in: the decode workspace, or a prefill call's.
pub(crate) trait HcWorkspace {
    fn hc_bufs(&mut self) -> HcBufs<'_>;
}

impl HcWorkspace for Workspace {
    fn hc_bufs(&mut self) -> HcBufs<'_> {
        HcBufs {
            x: &mut self.io.x,
            x_post: Some(&mut self.x_post),
            hc_ws: &mut self.io.hc_ws,
            mix: &mut self.io.mix,
            a: &mut self.io.a,
            aq: &mut self.io.aq,
            xq: Some(&mut self.attn.act.xq),
            codes: Some(&mut self.codes),
            attn_out: &self.io.attn_out,
            y_routed: &self.ex.y_routed,
            y_shared: &self.ex.y_shared,
        }
    }
}

/// HCPre (or HCHead) of `ws`'s streams fused with its RMSNorm into its `a` (mix coefficients into
/// its `mix`), after the pending HCPost `post` (fused into the same launches).
#[allow(clippy::too_many_arguments)]
pub(crate) fn hc_pre(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    ws: &mut impl HcWorkspace,
    rows: usize,
    hc: &HcDev,
    norm: &CudaSlice<f32>,
    mixer: Mixer,
    post: Post,
) -> Result<(), RunnerError> {
    let b = ws.hc_bufs();
    let d = cfg.hidden_size;
    let f = post.source(cfg, b.attn_out, b.y_routed, b.y_shared);
    let post = match (f, b.x_post) {
        (Some(f), Some(scratch)) => Some(HcPost { f, scratch }),
        (Some(f), None) => {
            post_alone(ctx, rows, d, &mut *b.x, &*b.mix, f)?;
            None
        }
        (None, _) => None,
    };
    let p = HcPre {
        rows,
        d: cfg.hidden_size,
        norm_eps: cfg.rms_norm_eps,
        hc_eps: cfg.hc_eps,
        sinkhorn_iters: cfg.hc_sinkhorn_iters,
        head: mixer == Mixer::Head,
        yq_bf16: matches!(mixer, Mixer::Attn { .. }),
    };
    let yq = match mixer {
        Mixer::Ffn { quant: true } => Some(b.aq),
        Mixer::Attn { quant: true } => Some(b.xq.ok_or_else(|| {
            RunnerError::Unsupported("attention input quantisation without an xq buffer".into())
        })?),
        _ => None,
    };
    let codes = b.codes.and_then(|c| {
        c.of = codes_of(ctx, mixer, rows, d);
        c.of.map(|_| HcCodes {
            codes: &mut c.codes,
            scales: &mut c.scales,
        })
    });
    let (s, f, base, scale) = (&ctx.stream, &hc.func, &hc.base, &hc.scale);
    ctx.launch_hc_pre(
        s, &p, b.x, f, base, scale, norm, b.hc_ws, b.mix, b.a, yq, codes, post,
    )?;
    Ok(())
}

/// Whose codes an HCPre of `mixer` writes beside its FP8 copy: where the mixer quantises and the GEMVs reading
/// the copy (wq_a + wkv, the shared expert's w1 + w3, all of inner dim D) take the FP8-activation kernel at this
/// many rows ([`q8_engaged`]), and that kernel is gemv_fp8x (1-8 rows on the H200; they read the codes only when
/// [`HcCodeBufs::of`] says these are their input's). Measured (H200, same binary, `DSV4_HC_CODES` 0 / 1, two
/// rounds, ms per step): batch 1 6.180 / 6.181 -> 6.079 / 6.096 (-1.5%), 8 12.969 / 13.004 -> 12.932 / 12.971;
/// on the wgmma ring (32-64 rows) level to +0.3% (batch 64 41.55 / 41.65 -> 41.71 / 41.77), and its FP8
/// accumulation on these two GEMVs too took the synthetic model's official-numerics agreement with the CPU
/// reference below its gate (0.683 < 0.7 with the ring from one row), so the ring keeps the bf16 copy for them.
/// `DSV4_HC_CODES=0` turns it off (A/B runs).
fn codes_of(ctx: &GpuContext, mixer: Mixer, rows: usize, d: usize) -> Option<CodesOf> {
    static ON: OnceLock<bool> = OnceLock::new();
    if !*ON.get_or_init(|| std::env::var("DSV4_HC_CODES").map_or(true, |v| v != "0")) {
        return None;
    }
    let of = match mixer {
        Mixer::Attn { quant: true } => CodesOf::Attn,
        Mixer::Ffn { quant: true } => CodesOf::Ffn,
        _ => return None,
    };
    let fp8x = ctx.gemv_q8_kernel(rows) == Some(Q8Kernel::MmaSync);
    (fp8x && q8_engaged(ctx, rows, d)).then_some(of)
}

/// HCHead + final norm of `ws`'s streams into its `a`, after the pending HCPost `post`.
pub(crate) fn hc_head(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    ws: &mut impl HcWorkspace,
    rows: usize,
    hc: &HcDev,
    norm: &CudaSlice<f32>,
    post: Post,
) -> Result<(), RunnerError> {
    hc_pre(ctx, cfg, ws, rows, hc, norm, Mixer::Head, post)
}

/// Vocabulary head (f32 logits of the normalised HC-head output in `ws.io.a`) and greedy argmax.
pub(crate) fn head(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &CudaSlice<bf16>,
    ws: &mut Workspace,
    rows: usize,
) -> Result<(), RunnerError> {
    let s = &ctx.stream;
    let (v, d) = (cfg.vocab_size, cfg.hidden_size);
    let plan = ctx.gemv_plan(GemvWeights::Bf16, rows, v, d)?;
    let out = GemvOut::f32(&mut ws.logits, s);
    ctx.launch_gemv_bf16(s, &plan, &ws.io.a, w, out, &mut ws.gemv)?;
    ctx.launch_argmax_rows(s, rows, v, &ws.logits, &mut ws.next)?;
    Ok(())
}
