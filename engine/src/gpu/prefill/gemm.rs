//! Launch helpers of the prefill GEMMs (prefill_gemm.cu): jobs of device addresses, grouped per launch.

use crate::gpu::attention::{dptr, dptr_mut};
use crate::gpu::RunnerError;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use dsv4_kernels::prefill::{PfDequant, PfGemm, PfKperm, PfWeights, PfWgmma, PF_GROUPS};
use dsv4_kernels::{GpuContext, PF_WGMMA_BM, PF_WGMMA_FP4_BM, PF_WGMMA_FP4_SMALL_BM};

use super::attn::Call;

/// Fewest rows for which a dense FP8 GEMM takes the wgmma path (dequantising the weights costs about as
/// much as a GEMM of a few dozen rows; kernels/BENCH_NOTES.md "Prefill wgmma").
pub const WGMMA_MIN_ROWS: usize = 256;
/// The bf16 wgmma instances the engine uses (indices into `PF_WGMMA_VARIANTS`): pf_wgmma_bf16_ws (128 x 256
/// tiles, warp-specialised TMA pipeline) unless its tiles would fill at most half the SMs, where
/// pf_wgmma_bf16_s6 (128 x 128 tiles) still runs in one wave with twice the blocks. kbench pf (H200, 1024 rows):
/// 48 ws tiles (wq_a+wkv) ws 47.0 us vs s6 31.1; 128 ws tiles (wo_b, shared w1+w3, w2) ws 16-24% faster;
/// kernels/BENCH_NOTES.md "pf_wgmma_bf16_ws".
pub const WGMMA_WS: usize = 3;
pub const WGMMA_S6: usize = 1;

/// The wgmma instance for a launch of `rows` rows over `jobs`. `DSV4_PF_GEMM` = `s6` / `ws` fixes it (an A/B
/// switch for benches; read once).
fn wgmma_variant(ctx: &GpuContext, rows: usize, jobs: &[Job]) -> usize {
    static FIXED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let fixed = FIXED.get_or_init(|| match std::env::var("DSV4_PF_GEMM").as_deref() {
        Ok("s6") => Some(WGMMA_S6),
        Ok("ws") => Some(WGMMA_WS),
        _ => None,
    });
    let bn = dsv4_kernels::prefill::PF_WGMMA_VARIANTS[WGMMA_WS].bn();
    let tiles: usize = jobs
        .iter()
        .map(|j| rows.div_ceil(PF_WGMMA_BM) * j.n.div_ceil(bn))
        .sum();
    fixed.unwrap_or(if 2 * tiles > ctx.info.sm_count as usize {
        WGMMA_WS
    } else {
        WGMMA_S6
    })
}

/// Fewest rows for which the routed experts take the wgmma kernel (prefill_wgmma_fp4.cu; it reads each
/// expert's weights once per 256 rows where pf_gemm_fp4_expert converts them once per 64 or 128).
pub const EXPERT_WGMMA_MIN_ROWS: usize = 64;

/// `DSV4_PF_WGMMA`, read once: `0` keeps every prefill GEMM on the portable kernels (an A/B switch for
/// benches), `dense` only the routed experts (the wgmma path before the expert kernel), `all` takes both
/// wgmma paths from one row (lets the small GPU prefill tests exercise them); anything else the defaults.
/// Returns the fewest rows of (dense FP8 wgmma, expert wgmma).
fn wgmma_min_rows() -> (usize, usize) {
    static MIN: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| match std::env::var("DSV4_PF_WGMMA").as_deref() {
        Ok("0") => (usize::MAX, usize::MAX),
        Ok("dense") => (WGMMA_MIN_ROWS, usize::MAX),
        Ok("all") => (1, 1),
        _ => (WGMMA_MIN_ROWS, EXPERT_WGMMA_MIN_ROWS),
    })
}

/// Row tiles of the expert wgmma kernels for `slots` slots over `experts` experts: experts averaging fewer than
/// 64 rows (short prompts) take the two-blocks-per-SM kernel's 64-row tiles, longer calls PF_WGMMA_FP4_BM (one
/// pass over an expert's weights for up to 256 of its rows). `DSV4_PF_EXPERT_BM` = 64 / 128 / 256 fixes it (an
/// A/B switch for benches; read once).
pub fn expert_wgmma_bm(slots: usize, experts: usize) -> usize {
    static BM: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let fixed = BM.get_or_init(|| match std::env::var("DSV4_PF_EXPERT_BM").as_deref() {
        Ok("64") => Some(PF_WGMMA_FP4_SMALL_BM),
        Ok("128") => Some(128),
        Ok("256") => Some(PF_WGMMA_FP4_BM),
        _ => None,
    });
    fixed.unwrap_or(if slots < 64 * experts.max(1) {
        PF_WGMMA_FP4_SMALL_BM
    } else {
        PF_WGMMA_FP4_BM
    })
}

/// Whether a call of `rows` rows may take the expert wgmma kernel (the device and DSV4_PF_WGMMA permitting).
pub fn expert_wgmma(ctx: &GpuContext, rows: usize) -> bool {
    ctx.has_wgmma() && rows >= wgmma_min_rows().1
}

/// One group of a GEMM launch: x `[rows, k]` bf16, weight `[n, k]` (+ FP8/FP4 scales), output `[rows, n]`.
#[derive(Clone, Copy, Default)]
pub struct Job {
    pub x: u64,
    pub w: u64,
    pub s: u64,
    pub out: u64,
    pub n: usize,
}

impl Job {
    pub fn new<W, S>(
        s: &CudaStream,
        x: u64,
        w: &CudaSlice<W>,
        sc: &CudaSlice<S>,
        out: u64,
        n: usize,
    ) -> Job {
        Job {
            x,
            w: dptr(w, s),
            s: dptr(sc, s),
            out,
            n,
        }
    }

    /// A bf16 weight (no scales).
    pub fn bf16<W>(s: &CudaStream, x: u64, w: &CudaSlice<W>, out: u64, n: usize) -> Job {
        Job {
            x,
            w: dptr(w, s),
            s: 0,
            out,
            n,
        }
    }
}

/// Device address of a buffer written by a kernel, `elems` elements in.
pub fn at_mut<T>(b: &mut CudaSlice<T>, s: &CudaStream, elems: usize) -> u64 {
    dptr_mut(b, s) + (elems * std::mem::size_of::<T>()) as u64
}

/// Device address of a buffer read by a kernel, `elems` elements in.
pub fn at<T>(b: &impl DevicePtr<T>, s: &CudaStream, elems: usize) -> u64 {
    dptr(b, s) + (elems * std::mem::size_of::<T>()) as u64
}

/// Tile rows for `rows` rows: the larger tile once a call has rows to fill it.
fn tile_rows(rows: usize) -> usize {
    if rows > 96 {
        128
    } else {
        64
    }
}

fn params(k: usize, out_bf16: bool, jobs: &[Job]) -> Result<PfGemm, RunnerError> {
    if jobs.is_empty() || jobs.len() > PF_GROUPS {
        return Err(RunnerError::Unsupported(format!(
            "{} GEMM groups",
            jobs.len()
        )));
    }
    let mut p = PfGemm {
        k: k as i32,
        out_bf16: i32::from(out_bf16),
        ..Default::default()
    };
    for (g, j) in jobs.iter().enumerate() {
        (p.x[g], p.w[g], p.s[g], p.out[g]) = (j.x, j.w, j.s, j.out);
        p.n[g] = j.n as i32;
    }
    Ok(p)
}

/// Dense GEMM of `rows` rows over every job (same x rows count and inner dim `k`). bf16 weights of calls of
/// at least WGMMA_MIN_ROWS rows go straight to the bf16 wgmma kernel on an sm_90a fatbin device (nothing to
/// dequantise: the same products, f32 accumulation; ncu, 8192 rows: the router gate and the compressor and
/// indexer projections took 23.5 ms per call on pf_gemm), everything else to pf_gemm.
pub fn dense(
    ctx: &GpuContext,
    s: &CudaStream,
    wt: PfWeights,
    rows: usize,
    k: usize,
    out_bf16: bool,
    jobs: &[Job],
) -> Result<(), RunnerError> {
    let wgmma = matches!(wt, PfWeights::Bf16)
        && ctx.has_wgmma()
        && rows >= wgmma_min_rows().0
        && k.is_multiple_of(16)
        && (1..=PF_GROUPS).contains(&jobs.len());
    if wgmma {
        let mut p = PfWgmma {
            m: rows as i32,
            k: k as i32,
            out_bf16: i32::from(out_bf16),
            ..Default::default()
        };
        for (g, j) in jobs.iter().enumerate() {
            (p.x[g], p.w[g], p.out[g], p.n[g]) = (j.x, j.w, j.out, j.n as i32);
        }
        // SAFETY: every Job was built by the caller from buffers holding rows x k bf16 inputs, n x k bf16
        // weights and rows x n outputs of the declared type.
        unsafe { ctx.launch_pf_wgmma(s, wgmma_variant(ctx, rows, jobs), jobs.len(), &p) }?;
        return Ok(());
    }
    let mut p = params(k, out_bf16, jobs)?;
    p.m = rows as i32;
    let bm = tile_rows(rows);
    // SAFETY: every Job was built by the caller from buffers holding rows x k inputs, n x k weights (+ their
    // scales) and rows x n outputs of the declared types.
    unsafe { ctx.launch_pf_gemm(s, wt, bm, jobs.len(), rows.div_ceil(bm), &p) }?;
    Ok(())
}

/// Dense GEMM of FP8 weights (bf16 x, as `dense`). On an sm_90a fatbin device with the workspace's scratch
/// (`c.wbf`) and at least WGMMA_MIN_ROWS rows: the weights dequantised to bf16 (pf_fp8_to_bf16, exact: the
/// same bf16 weights pf_gemm converts to in shared memory), then bf16 wgmma (`wgmma_variant`: prefill_wgmma_ws.cu
/// or prefill_wgmma.cu's s6): the same products, f32 accumulation. Otherwise pf_gemm.
pub fn fp8(
    c: &Call<'_>,
    rows: usize,
    k: usize,
    out_bf16: bool,
    jobs: &[Job],
) -> Result<(), RunnerError> {
    let elems: usize = jobs.iter().map(|j| j.n * k).sum();
    let scratch = c.wbf.filter(|&(_, len)| {
        rows >= wgmma_min_rows().0 && k.is_multiple_of(16) && elems <= len && !jobs.is_empty()
    });
    let Some((wbf, _)) = scratch.filter(|_| jobs.len() <= PF_GROUPS) else {
        return dense(c.ctx, c.s, PfWeights::Fp8, rows, k, out_bf16, jobs);
    };
    let mut d = PfDequant {
        k: k as i32,
        ..Default::default()
    };
    let mut p = PfWgmma {
        m: rows as i32,
        k: k as i32,
        out_bf16: i32::from(out_bf16),
        ..Default::default()
    };
    let mut at = wbf;
    for (g, j) in jobs.iter().enumerate() {
        (d.w[g], d.s[g], d.out[g], d.n[g]) = (j.w, j.s, at, j.n as i32);
        (p.x[g], p.w[g], p.out[g], p.n[g]) = (j.x, at, j.out, j.n as i32);
        at += (2 * j.n * k) as u64;
    }
    // SAFETY: each job's w / s are n x k e4m3 bytes and their 128 x 128 scales; the scratch holds
    // `elems` bf16 (checked above), group g's share starting where the previous one ends.
    unsafe { c.ctx.launch_pf_fp8_to_bf16(c.s, jobs.len(), &d) }?;
    // SAFETY: x holds rows x k bf16 (the caller's Job), the scratch the n x k bf16 weights just written,
    // out rows x n outputs of the declared type.
    unsafe {
        c.ctx
            .launch_pf_wgmma(c.s, wgmma_variant(c.ctx, rows, jobs), jobs.len(), &p)
    }?;
    Ok(())
}

/// Where the routed-expert GEMM finds its row tiles.
pub struct ExpertTiles {
    pub tiles: u64,
    pub order: u64,
    pub bm: usize,
    pub max_tiles: usize,
    pub topk: usize,
    /// Tiles for pf_wgmma_fp4_expert (x in pf_kperm's order), else for pf_gemm_fp4_expert.
    pub wgmma: bool,
}

/// FP4 routed-expert GEMM over the grouped slots (`x_per_slot`: x rows are slots, else tokens): on `t.wgmma`
/// tiles pf_wgmma_fp4_expert, whose jobs' x must be in pf_kperm's order ([`kperm`]), else pf_gemm_fp4_expert.
pub fn experts(
    ctx: &GpuContext,
    s: &CudaStream,
    t: &ExpertTiles,
    k: usize,
    x_per_slot: bool,
    jobs: &[Job],
) -> Result<(), RunnerError> {
    let mut p = params(k, false, jobs)?;
    p.tiles = t.tiles;
    p.order = t.order;
    p.topk = t.topk as i32;
    p.x_per_slot = i32::from(x_per_slot);
    if t.wgmma {
        // SAFETY: as below, with every x in pf_kperm's order (the caller's contract for `wgmma` tiles; t.bm from
        // expert_wgmma_bm).
        unsafe { ctx.launch_pf_wgmma_fp4_expert(s, t.bm, jobs.len(), t.max_tiles, &p) }?;
        return Ok(());
    }
    // SAFETY: tiles/order were written by pf_moe_group for t.bm over the same slots; the jobs' x hold every
    // token (or slot) row, the weights are [E, n, k/2] nibbles with [E, n, k/32] scales, outputs [slots, n].
    unsafe { ctx.launch_pf_gemm(s, PfWeights::Fp4Expert, t.bm, jobs.len(), t.max_tiles, &p) }?;
    Ok(())
}

/// Writes `rows` rows of `k` bf16 at `x` to `out` in the K order of the expert wgmma kernel
/// (`pf_kperm_cols(k)` bf16 a row).
///
/// # Safety
/// `x` holds `rows * k` bf16 and `out` room for `rows * pf_kperm_cols(k)` bf16, not overlapping.
pub unsafe fn kperm(
    ctx: &GpuContext,
    s: &CudaStream,
    x: u64,
    out: u64,
    rows: usize,
    k: usize,
) -> Result<(), RunnerError> {
    let p = PfKperm {
        x,
        out,
        rows: rows as i32,
        k: k as i32,
    };
    // SAFETY: the caller's contract.
    unsafe { ctx.launch_pf_kperm(s, &p) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn short_prompts_take_the_small_expert_wgmma_kernel() {
        if std::env::var_os("DSV4_PF_EXPERT_BM").is_some() {
            return; // fixed by the A/B switch
        }
        // 1K tokens x top-6 over 256 experts: ~24 rows per expert; 8K: ~192.
        let bm = |tokens: usize| super::expert_wgmma_bm(tokens * 6, 256);
        assert_eq!(bm(1024), dsv4_kernels::PF_WGMMA_FP4_SMALL_BM);
        assert_eq!(bm(8192), dsv4_kernels::PF_WGMMA_FP4_BM);
    }

    #[test]
    fn the_engine_uses_the_ws_and_six_stage_wgmma_instances() {
        let v = dsv4_kernels::prefill::PF_WGMMA_VARIANTS;
        assert_eq!(
            (v[super::WGMMA_S6].name, v[super::WGMMA_S6].stages),
            ("pf_wgmma_bf16_s6", 6)
        );
        assert_eq!(v[super::WGMMA_WS].name, "pf_wgmma_bf16_ws");
    }
}
