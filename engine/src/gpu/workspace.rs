//! Every buffer a decode step touches, sized once from the config and the maximum rows: nothing is
//! allocated per step, so a captured graph's pointers stay valid for every replay.

use super::attention::{dptr, gemv_need, AttnScratch, Q8In, StepMeta};
use super::RunnerError;
use crate::model::ModelConfig;
use std::sync::Arc;

use dsv4_kernels::cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, DeviceRepr, DriverError, ValidAsZeroBits,
};
use dsv4_kernels::{
    bf16, hc_workspace_len, moe_group_meta_len, pf_kperm_cols, GemvScratch, GemvWeights,
    GpuContext, HC_MIX, HC_STREAMS,
};

pub struct Workspace {
    pub max_rows: usize,
    /// Per-step inputs, written by one host copy each before the step (graph replay reads them).
    pub tokens: CudaSlice<i32>,
    pub meta: StepMeta,
    pub io: BlockIo,
    /// The e4m3 codes of the last HCPre's fake-quantised output, when it wrote them.
    pub codes: HcCodeBufs,
    /// The streams after an HCPost fused into the next HCPre (that HCPre copies them back into `io.x`).
    pub x_post: CudaSlice<bf16>,
    pub attn: AttnScratch,
    /// Gate logits f32 [rows, E].
    pub gate: CudaSlice<f32>,
    /// Split-K partial sums and counters of the runner's GEMVs on the work stream (gate, head).
    pub gemv: GemvScratch,
    /// The shared expert's GEMV scratch: it runs on the side stream, concurrently with the gate GEMV, and
    /// a split-K launch's counters and partials must not be shared with a concurrent one.
    pub gemv_side: GemvScratch,
    /// The side stream of the MoE (shared expert beside the routed experts) and its fork/join events.
    pub side: SideStream,
    pub ids: CudaSlice<i32>,
    pub wts: CudaSlice<f32>,
    pub group: CudaSlice<i32>,
    pub ex: ExpertBufs,
    /// f32 [rows, vocab] and the greedy token of each row.
    pub logits: CudaSlice<f32>,
    pub next: CudaSlice<i32>,
}

/// The residual streams and each sub-block's input and output, for `rows` rows (decode step or prefill call).
pub struct BlockIo {
    /// Residual streams bf16 [rows, n, D].
    pub x: CudaSlice<bf16>,
    /// HCPre partial sums.
    pub hc_ws: CudaSlice<f32>,
    /// post/comb f32 [rows, 24].
    pub mix: CudaSlice<f32>,
    /// Normalised sub-block input bf16 [rows, D].
    pub a: CudaSlice<bf16>,
    /// FP8-fake-quantised copy of the ffn input feeding the expert GEMVs (official numerics), written by
    /// the ffn HCPre from f32.
    pub aq: CudaSlice<bf16>,
    pub attn_out: CudaSlice<bf16>,
}

impl BlockIo {
    pub(crate) fn new(ctx: &GpuContext, rows: usize, d: usize) -> Result<Self, RunnerError> {
        Ok(BlockIo {
            x: zeros(ctx, rows * HC_STREAMS * d)?,
            hc_ws: zeros(ctx, hc_workspace_len(rows, d))?,
            mix: zeros(ctx, rows * HC_MIX)?,
            a: zeros(ctx, rows * d)?,
            aq: zeros(ctx, rows * d)?,
            attn_out: zeros(ctx, rows * d)?,
        })
    }

    /// Device bytes of [`BlockIo::new`].
    pub(crate) fn bytes_for(rows: usize, d: usize) -> usize {
        rows * (2 * HC_STREAMS * d + 4 * HC_MIX + 6 * d) + 4 * hc_workspace_len(rows, d)
    }
}

/// The e4m3 codes `[rows, D]` and f32 block scales `[rows, D / 128]` an HCPre writes beside its fake-quantised
/// output (the FP8-activation GEMVs' input), and which mixer's output they are (None: stale, not to be read).
pub struct HcCodeBufs {
    pub codes: CudaSlice<u8>,
    pub scales: CudaSlice<f32>,
    pub of: Option<CodesOf>,
}

/// Whose HCPre output [`HcCodeBufs`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodesOf {
    /// The attention's input copy (wq_a + wkv read it).
    Attn,
    /// The FFN's (the shared expert's w1 + w3 read it).
    Ffn,
}

impl HcCodeBufs {
    fn new(ctx: &GpuContext, rows: usize, d: usize) -> Result<Self, RunnerError> {
        Ok(HcCodeBufs {
            codes: zeros(ctx, rows * d)?,
            scales: zeros(ctx, (rows * d).div_ceil(128))?,
            of: None,
        })
    }

    /// The codes of `of`'s output, if that is what they hold.
    pub(crate) fn of(&self, of: CodesOf, s: &CudaStream) -> Option<Q8In> {
        (self.of == Some(of)).then(|| Q8In {
            codes: dptr(&self.codes, s),
            scales: dptr(&self.scales, s),
        })
    }
}

/// The expert outputs of `slots` routed slots and `rows` rows: routed w1/w3 f32 [slots, I], SwiGLU bf16
/// [slots, I] (room for [slots, pf_kperm_cols(I)]: the prefill's wgmma path writes it K-permuted, zero-padded
/// to whole 128-wide chunks), w2 f32 [slots, D]; the shared expert's f32 [rows, I] x2, bf16 [rows, I], f32
/// [rows, D].
pub struct ExpertBufs {
    pub g: CudaSlice<f32>,
    pub u: CudaSlice<f32>,
    pub h: CudaSlice<bf16>,
    pub y_routed: CudaSlice<f32>,
    pub sg: CudaSlice<f32>,
    pub su: CudaSlice<f32>,
    pub sh: CudaSlice<bf16>,
    pub y_shared: CudaSlice<f32>,
}

impl ExpertBufs {
    pub(crate) fn new(
        ctx: &GpuContext,
        rows: usize,
        slots: usize,
        cfg: &ModelConfig,
    ) -> Result<Self, RunnerError> {
        let (d, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
        Ok(ExpertBufs {
            g: zeros(ctx, slots * i)?,
            u: zeros(ctx, slots * i)?,
            h: zeros(ctx, slots * pf_kperm_cols(i))?,
            y_routed: zeros(ctx, slots * d)?,
            sg: zeros(ctx, rows * i)?,
            su: zeros(ctx, rows * i)?,
            sh: zeros(ctx, rows * i)?,
            y_shared: zeros(ctx, rows * d)?,
        })
    }

    /// Device bytes of [`ExpertBufs::new`].
    pub(crate) fn bytes_for(rows: usize, slots: usize, cfg: &ModelConfig) -> usize {
        let (d, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
        (slots + rows) * (10 * i + 4 * d) + 2 * slots * (pf_kperm_cols(i) - i)
    }
}

/// A second stream with the events that fork it from the work stream and join it back, created once
/// (recording and waiting on them allocates nothing and is graph-capturable).
pub struct SideStream {
    pub stream: Arc<CudaStream>,
    pub fork: CudaEvent,
    pub join: CudaEvent,
}

impl SideStream {
    pub(crate) fn new(ctx: &GpuContext) -> Result<Self, DriverError> {
        Ok(SideStream {
            stream: ctx.ctx.new_stream()?,
            fork: ctx.ctx.new_event(None)?,
            join: ctx.ctx.new_event(None)?,
        })
    }
}

/// A zeroed device buffer of `len` elements (at least one: a zero-length buffer has no address).
pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    ctx: &GpuContext,
    len: usize,
) -> Result<CudaSlice<T>, RunnerError> {
    Ok(ctx.stream.alloc_zeros::<T>(len.max(1))?)
}

impl Workspace {
    pub fn new(ctx: &GpuContext, cfg: &ModelConfig, max_rows: usize) -> Result<Self, RunnerError> {
        let r = max_rows;
        let (d, e, k, i) = (
            cfg.hidden_size,
            cfg.n_routed_experts,
            cfg.num_experts_per_tok,
            cfg.moe_intermediate_size,
        );
        let slots = r * k;
        let (sms, fp8, bf) = (
            ctx.info.sm_count as usize,
            GemvWeights::Fp8,
            GemvWeights::Bf16,
        );
        // Every GEMV of the step outside the attention block (model.rs, moe.rs); the shared expert's in
        // either format (the split-K plan depends on it).
        let needs = [
            gemv_need(sms, r, &[e], d, bf),
            gemv_need(sms, r, &[i, i], d, fp8),
            gemv_need(sms, r, &[d], i, fp8),
            gemv_need(sms, r, &[i, i], d, bf),
            gemv_need(sms, r, &[d], i, bf),
            gemv_need(sms, r, &[cfg.vocab_size], d, bf),
        ];
        let len = |needs: &[(usize, usize)]| {
            let ws = needs.iter().map(|n| n.0).max().unwrap_or(0);
            (ws, needs.iter().map(|n| n.1).max().unwrap_or(0))
        };
        let (ws_len, cnt_len) = len(&needs);
        // The shared expert's GEMVs (indices 1..=4 above) in the side scratch.
        let (side_ws, side_cnt) = len(&needs[1..5]);
        Ok(Workspace {
            max_rows,
            tokens: zeros(ctx, r)?,
            meta: StepMeta {
                slots: zeros(ctx, r)?,
                positions: zeros(ctx, r)?,
            },
            io: BlockIo::new(ctx, r, d)?,
            codes: HcCodeBufs::new(ctx, r, d)?,
            x_post: zeros(ctx, r * HC_STREAMS * d)?,
            attn: AttnScratch::new(ctx, cfg, r)?,
            gate: zeros(ctx, r * e)?,
            gemv: GemvScratch::new(&ctx.stream, ws_len, cnt_len)?,
            gemv_side: GemvScratch::new(&ctx.stream, side_ws, side_cnt)?,
            side: SideStream::new(ctx)?,
            ids: zeros(ctx, slots)?,
            wts: zeros(ctx, slots)?,
            group: zeros(ctx, moe_group_meta_len(slots))?,
            ex: ExpertBufs::new(ctx, r, slots, cfg)?,
            logits: zeros(ctx, r * cfg.vocab_size)?,
            next: zeros(ctx, r)?,
        })
    }
}
