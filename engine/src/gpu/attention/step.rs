//! Per-step context of a decode step and the grouped-GEMV helper every projection goes through.
use super::error::{ensure, GpuError};
use super::layer::Fp8Linear;
use super::scratch::AttnScratch;
use super::{dptr, dptr_mut};
use crate::model::ModelConfig;
use dsv4_kernels::attn::{AttnRowPrep, QUANT_NONE};
use dsv4_kernels::cudarc::driver::{sys, CudaEvent, CudaStream};
use dsv4_kernels::{
    gemv_q8_min_rows, gemv_splits, GemvParams, GemvPath, GemvQ8X, GemvScratch, GemvWeights,
    GpuContext, GEMV_GROUPS, GEMV_Q8_BLOCK, GEMV_ROW_TILE,
};
use std::cell::RefCell;

/// Named CUDA events recorded after each stage by [`decode_profiled`].
pub type StageMarks = Vec<(&'static str, CudaEvent)>;

/// One group of a grouped GEMV: device addresses of x `[rows, k]` bf16, the weight (and its FP8 scales), the
/// output `[rows, n]`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Job {
    pub x: u64,
    pub w: u64,
    pub s: u64,
    pub out: u64,
    pub n: usize,
}

impl Job {
    /// A stored linear (FP8 or bf16: the launch's format is the caller's, `w.wt`).
    pub(crate) fn linear(w: &Fp8Linear, x: u64, out: u64, s: &CudaStream) -> Job {
        Job {
            x,
            w: dptr(&w.w, s),
            s: dptr(&w.scale, s),
            out,
            n: w.n,
        }
    }
}

/// What one step needs besides buffers.
pub(super) struct Step<'a> {
    pub ctx: &'a GpuContext,
    pub s: &'a CudaStream,
    pub cfg: &'a ModelConfig,
    pub rows: usize,
    pub official: bool,
    pub slots: u64,
    pub positions: u64,
    /// Stage events of an eager profiled step (never while capturing: decode passes None).
    pub marks: Option<RefCell<&'a mut StageMarks>>,
}

impl<'a> Step<'a> {
    /// The same step's launches on another stream `s` (a side branch: no stage marks).
    pub(super) fn on<'b>(&self, s: &'b CudaStream) -> Step<'b>
    where
        'a: 'b,
    {
        Step {
            ctx: self.ctx,
            s,
            cfg: self.cfg,
            rows: self.rows,
            official: self.official,
            slots: self.slots,
            positions: self.positions,
            marks: None,
        }
    }

    /// Records the end of stage `name` when profiling.
    pub(super) fn mark(&self, name: &'static str) -> Result<(), GpuError> {
        if let Some(m) = &self.marks {
            let ev = self
                .s
                .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            m.borrow_mut().push((name, ev));
        }
        Ok(())
    }

    /// One grouped GEMV (gemv.cu) over `jobs` sharing the inner dim `k`.
    pub(super) fn gemv(
        &self,
        wt: GemvWeights,
        k: usize,
        out_bf16: bool,
        jobs: &[Job],
        sc: &mut AttnScratch,
    ) -> Result<(), GpuError> {
        grouped_gemv(
            self.ctx,
            self.s,
            self.rows,
            wt,
            k,
            out_bf16,
            jobs,
            &mut sc.gemv,
        )
    }

    /// One grouped FP8-activation GEMV over `jobs` (FP8 weights) sharing the inner dim `k`, their common input's
    /// e4m3 codes and scales in `sc.x8` / `sc.x8_scales` (written by its preparation).
    fn gemv_q8(
        &self,
        k: usize,
        out_bf16: bool,
        jobs: &[Job],
        sc: &mut AttnScratch,
    ) -> Result<(), GpuError> {
        let x8 = Q8In {
            codes: dptr(&sc.x8, self.s),
            scales: dptr(&sc.x8_scales, self.s),
        };
        self.gemv_q8_on(x8, k, out_bf16, jobs, sc)
    }

    /// [`Self::gemv_q8`] on the codes `x8` (rows x k codes, rows x k / 128 scales).
    pub(super) fn gemv_q8_on(
        &self,
        x8: Q8In,
        k: usize,
        out_bf16: bool,
        jobs: &[Job],
        sc: &mut AttnScratch,
    ) -> Result<(), GpuError> {
        grouped_gemv_q8(
            self.ctx,
            self.s,
            self.rows,
            (k, out_bf16),
            jobs,
            x8,
            &mut sc.gemv,
        )
    }

    /// [`Self::gemv_q8`] when `q8` (the input's preparation wrote its codes: [`Self::with_codes`]), else
    /// [`Self::gemv`] on the bf16 input in the jobs, weights `wt`.
    pub(super) fn gemv_maybe_q8(
        &self,
        q8: bool,
        wt: GemvWeights,
        k: usize,
        out_bf16: bool,
        jobs: &[Job],
        sc: &mut AttnScratch,
    ) -> Result<(), GpuError> {
        if q8 {
            self.gemv_q8(k, out_bf16, jobs, sc)
        } else {
            self.gemv(wt, k, out_bf16, jobs, sc)
        }
    }

    /// Whether this step's FP8 linears of inner dim `k` whose input the official numerics quantise take the
    /// FP8-activation GEMV: where it runs, from [`gemv_q8_min_rows`] rows, K in whole 128-value blocks.
    pub(super) fn q8(&self, quantised: bool, k: usize) -> bool {
        quantised && q8_engaged(self.ctx, self.rows, k)
    }

    /// Points the row preparation `p` at the FP8 codes and scales of `sc.x8` when `want` (the step takes the
    /// FP8-activation GEMV for the linear `p` feeds) and the preparation's kernel can write them; returns whether
    /// it will (else the bf16-x GEMV runs on `p.out` as before).
    pub(super) fn with_codes(&self, p: &mut AttnRowPrep, want: bool, sc: &mut AttnScratch) -> bool {
        if !want {
            return false;
        }
        p.q8 = dptr_mut(&mut sc.x8, self.s);
        p.q8_scales = dptr_mut(&mut sc.x8_scales, self.s);
        if self.ctx.row_prep_q8_ok(p) {
            return true;
        }
        (p.q8, p.q8_scales) = (0, 0);
        false
    }

    pub(super) fn quant(&self, q: i32) -> i32 {
        if self.official {
            q
        } else {
            QUANT_NONE
        }
    }
}

/// One grouped GEMV (gemv.cu) over `jobs` sharing the batch `rows` and inner dim `k`, split-K planned by
/// [`gemv_splits`] (for the kernel family of `rows` rows) from the device's SM count and reduced in the kernel
/// through `scratch`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn grouped_gemv(
    ctx: &GpuContext,
    s: &CudaStream,
    rows: usize,
    wt: GemvWeights,
    k: usize,
    out_bf16: bool,
    jobs: &[Job],
    scratch: &mut GemvScratch,
) -> Result<(), GpuError> {
    let (p, tiles) = gemv_params(rows, k, out_bf16, jobs, scratch, s)?;
    let path = GemvPath::for_rows(rows);
    let splits = gemv_splits(ctx.info.sm_count as usize, tiles, k, wt, path);
    let (ws_len, cnt_len) = (scratch.ws.len(), scratch.cnt.len());
    // SAFETY: every Job's x/w/s/out was built by the caller from buffers holding rows x k inputs, n x k
    // weights (+ scales) and rows x n outputs; ws/cnt are the scratch's, their lengths checked by the launcher.
    unsafe { ctx.launch_gemv_grouped(s, wt, jobs.len(), splits, path, &p, ws_len, cnt_len) }?;
    Ok(())
}

/// Device addresses of an FP8-activation GEMV's input: e4m3 codes `[rows, k]` and f32 scales `[rows, k / 128]`.
#[derive(Debug, Clone, Copy)]
pub struct Q8In {
    pub codes: u64,
    pub scales: u64,
}

/// Whether an FP8 linear of inner dim `k` whose input the official numerics quantise runs on the FP8-activation
/// GEMV at `rows` rows: one runs here for that many rows, from [`gemv_q8_min_rows`] rows, K in whole 128-value
/// blocks. Producers of codes (the HCPre) ask the same question, so they write codes just when they are read.
pub(crate) fn q8_engaged(ctx: &GpuContext, rows: usize, k: usize) -> bool {
    rows >= gemv_q8_min_rows()
        && k.is_multiple_of(GEMV_Q8_BLOCK)
        && ctx.gemv_q8_kernel(rows).is_some()
}

/// One grouped FP8-activation GEMV (the kernel [`GpuContext::gemv_q8_kernel`] picks) over `jobs` (FP8 weights)
/// sharing the batch `rows`, the inner dim `k` and the input `x8`; split-K through `scratch`.
pub(crate) fn grouped_gemv_q8(
    ctx: &GpuContext,
    s: &CudaStream,
    rows: usize,
    (k, out_bf16): (usize, bool),
    jobs: &[Job],
    x8: Q8In,
    scratch: &mut GemvScratch,
) -> Result<(), GpuError> {
    let kernel = ctx
        .gemv_q8_kernel(rows)
        .ok_or_else(|| GpuError::Unsupported(format!("no FP8-activation GEMV for {rows} rows")))?;
    let (p, tiles) = gemv_params(rows, k, out_bf16, jobs, scratch, s)?;
    let splits = kernel.splits(ctx.info.sm_count as usize, tiles, k);
    let mut q = GemvQ8X::default();
    for g in 0..jobs.len() {
        (q.xq[g], q.xs[g]) = (x8.codes, x8.scales);
    }
    let (ws_len, cnt_len) = (scratch.ws.len(), scratch.cnt.len());
    // SAFETY: every Job's w/s/out was built by the caller from an FP8 linear of n x k weights and a buffer of
    // rows x n outputs; x8 holds rows x k codes and their scales (the caller's); ws/cnt are the scratch's,
    // their lengths checked by the launcher.
    unsafe { ctx.launch_gemv_q8(s, kernel, (jobs.len(), splits), &p, &q, ws_len, cnt_len) }?;
    Ok(())
}

/// The launch parameters of a grouped GEMV over `jobs` (and the 32-row tiles of all groups).
fn gemv_params(
    rows: usize,
    k: usize,
    out_bf16: bool,
    jobs: &[Job],
    scratch: &mut GemvScratch,
    s: &CudaStream,
) -> Result<(GemvParams, usize), GpuError> {
    ensure(!jobs.is_empty() && jobs.len() <= GEMV_GROUPS, || {
        format!("{} GEMV groups (1..={GEMV_GROUPS})", jobs.len())
    })?;
    let mut p = GemvParams {
        b: rows as i32,
        k: k as i32,
        out_bf16: i32::from(out_bf16),
        ws: dptr_mut(&mut scratch.ws, s),
        cnt: dptr_mut(&mut scratch.cnt, s),
        ..Default::default()
    };
    let (mut tiles, mut nmax) = (0, 0);
    for (g, j) in jobs.iter().enumerate() {
        (p.x[g], p.w[g], p.s[g], p.out[g]) = (j.x, j.w, j.s, j.out);
        p.n[g] = j.n as i32;
        tiles += j.n.div_ceil(GEMV_ROW_TILE);
        nmax = nmax.max(j.n);
    }
    p.nmax = nmax as i32;
    Ok((p, tiles))
}
