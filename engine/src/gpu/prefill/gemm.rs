//! Launch helpers of the prefill GEMMs (prefill_gemm.cu): jobs of device addresses, grouped per launch.

use crate::gpu::attention::{dptr, dptr_mut};
use crate::gpu::RunnerError;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use dsv4_kernels::prefill::{PfGemm, PfWeights, PF_GROUPS};
use dsv4_kernels::GpuContext;

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

/// Dense GEMM of `rows` rows over every job (same x rows count and inner dim `k`).
pub fn dense(
    ctx: &GpuContext,
    s: &CudaStream,
    wt: PfWeights,
    rows: usize,
    k: usize,
    out_bf16: bool,
    jobs: &[Job],
) -> Result<(), RunnerError> {
    let mut p = params(k, out_bf16, jobs)?;
    p.m = rows as i32;
    let bm = tile_rows(rows);
    // SAFETY: every Job was built by the caller from buffers holding rows x k inputs, n x k weights (+ their
    // scales) and rows x n outputs of the declared types.
    unsafe { ctx.launch_pf_gemm(s, wt, bm, jobs.len(), rows.div_ceil(bm), &p) }?;
    Ok(())
}

/// Where the routed-expert GEMM finds its row tiles.
pub struct ExpertTiles {
    pub tiles: u64,
    pub order: u64,
    pub bm: usize,
    pub max_tiles: usize,
    pub topk: usize,
}

/// FP4 routed-expert GEMM over the grouped slots (`x_per_slot`: x rows are slots, else tokens).
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
    // SAFETY: tiles/order were written by pf_moe_group for t.bm over the same slots; the jobs' x hold every
    // token (or slot) row, the weights are [E, n, k/2] nibbles with [E, n, k/32] scales, outputs [slots, n].
    unsafe { ctx.launch_pf_gemm(s, PfWeights::Fp4Expert, t.bm, jobs.len(), t.max_tiles, &p) }?;
    Ok(())
}
