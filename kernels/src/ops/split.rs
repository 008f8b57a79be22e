//! Glue of the model split over ranks (see cuda/split.cu): the on-device sum of ranks simulated on one
//! GPU, a rank's view of the routed expert ids and its MoE partial sum, and a column gather.
use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, PushKernelArg,
};

use super::{grid, int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};

/// Most buffers one `rank_sum_f32` adds.
pub const RANK_MAX: usize = 8;

/// The split kernels, resolved once with the module.
#[derive(Debug, Clone)]
pub struct SplitKernels {
    pub rank_sum: CudaFunction,
    pub localize: CudaFunction,
    pub rank_moe_sum: CudaFunction,
    pub gather_cols: CudaFunction,
    /// The peer all-reduce of ranks on different GPUs (peer.cu; see ops::peer).
    pub peer_sum: CudaFunction,
}

impl SplitKernels {
    pub(crate) fn resolve(module: &Arc<CudaModule>) -> Result<Self> {
        let get = |name: &'static str| super::kernel(module, name);
        Ok(SplitKernels {
            rank_sum: get("rank_sum_f32")?,
            localize: get("moe_localize")?,
            rank_moe_sum: get("moe_rank_sum")?,
            gather_cols: get("gather_cols_bf16")?,
            peer_sum: get("peer_sum_f32")?,
        })
    }
}

/// The C struct `RankBufs` of cuda/split.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RankBufs {
    buf: [u64; RANK_MAX],
}

// SAFETY: #[repr(C)] array of u64 device addresses, laid out as the C struct RankBufs; no references.
unsafe impl DeviceRepr for RankBufs {}

fn one_d(name: &'static str, n: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (grid(name, n.div_ceil(256).clamp(1, 4096))?, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    })
}

impl GpuContext {
    /// Sums the first `n` elements of every buffer in rank order and writes the sum into all of them
    /// (the all-reduce of ranks simulated on this GPU). Every buffer must belong to this context.
    pub fn launch_rank_sum_f32(
        &self,
        stream: &CudaStream,
        bufs: &mut [&mut CudaSlice<f32>],
        n: usize,
    ) -> Result<()> {
        const NAME: &str = "rank_sum_f32";
        check(NAME, (1..=RANK_MAX).contains(&bufs.len()), || {
            format!("{} buffers (1..={RANK_MAX})", bufs.len())
        })?;
        check(NAME, bufs.iter().all(|b| b.len() >= n), || {
            format!("a buffer is shorter than {n}")
        })?;
        if n == 0 {
            return Ok(());
        }
        let mut p = RankBufs::default();
        for (slot, b) in p.buf.iter_mut().zip(bufs.iter_mut()) {
            *slot = ptr_mut(*b, stream);
        }
        let ranks = int(NAME, "ranks", bufs.len())?;
        let len = n as u64;
        let mut l = stream.launch_builder(&self.kernels.split.rank_sum);
        l.arg(&p).arg(&ranks).arg(&len);
        // SAFETY: rank_sum_f32(bufs, ranks, n): the first `ranks` addresses hold >= n f32 each (checked).
        unsafe { l.launch(one_d(NAME, n)?) }?;
        Ok(())
    }

    /// `out[i] = ids[i] - e0` when `e0 <= ids[i] < e1`, else -1, for `slots` ids.
    pub fn launch_moe_localize(
        &self,
        stream: &CudaStream,
        slots: usize,
        experts: std::ops::Range<usize>,
        ids: &impl DevicePtr<i32>,
        out: &mut impl DevicePtrMut<i32>,
    ) -> Result<()> {
        const NAME: &str = "moe_localize";
        check(NAME, ids.len() >= slots && out.len() >= slots, || {
            format!("ids {} out {} for {slots} slots", ids.len(), out.len())
        })?;
        if slots == 0 {
            return Ok(());
        }
        let (s, e0, e1) = (
            int(NAME, "slots", slots)?,
            int(NAME, "e0", experts.start)?,
            int(NAME, "e1", experts.end)?,
        );
        let (ip, op) = (ptr(ids, stream), ptr_mut(out, stream));
        let mut l = stream.launch_builder(&self.kernels.split.localize);
        l.arg(&ip).arg(&op).arg(&s).arg(&e0).arg(&e1);
        // SAFETY: moe_localize(ids, out, S, e0, e1); both hold >= S ints (checked).
        unsafe { l.launch(one_d(NAME, slots)?) }?;
        Ok(())
    }

    /// A rank's MoE partial output `out` f32 [rows, d]: the sum over k of `y` f32 [rows*topk, d] where
    /// `local` i32 [rows*topk] >= 0, plus `shared` f32 [rows, d] when given.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_moe_rank_sum(
        &self,
        stream: &CudaStream,
        rows: usize,
        topk: usize,
        d: usize,
        y: &impl DevicePtr<f32>,
        local: &impl DevicePtr<i32>,
        shared: Option<&CudaSlice<f32>>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        const NAME: &str = "moe_rank_sum";
        let ok = rows > 0
            && y.len() >= rows * topk * d
            && local.len() >= rows * topk
            && shared.is_none_or(|s| s.len() >= rows * d)
            && out.len() >= rows * d;
        check(NAME, ok, || {
            format!("buffers too short for {rows} rows x {topk} x {d}")
        })?;
        let (ti, di) = (int(NAME, "topk", topk)?, int(NAME, "d", d)?);
        let (yp, lp, op) = (ptr(y, stream), ptr(local, stream), ptr_mut(out, stream));
        let sp = shared.map_or(0, |s| ptr(s, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, rows)?, grid(NAME, d.div_ceil(256))?, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(&self.kernels.split.rank_moe_sum);
        l.arg(&yp).arg(&lp).arg(&sp).arg(&op).arg(&ti).arg(&di);
        // SAFETY: moe_rank_sum(y, local, shared, out, topk, D); extents checked above (shared null: unread).
        unsafe { l.launch(cfg) }?;
        Ok(())
    }

    /// `out[r, j] = x[r, cols.start + j]` for `rows` rows of width `width` (bf16).
    pub fn launch_gather_cols_bf16(
        &self,
        stream: &CudaStream,
        rows: usize,
        width: usize,
        cols: std::ops::Range<usize>,
        x: &impl DevicePtr<half::bf16>,
        out: &mut impl DevicePtrMut<half::bf16>,
    ) -> Result<()> {
        const NAME: &str = "gather_cols_bf16";
        let w = cols.len();
        let ok = cols.end <= width && x.len() >= rows * width && out.len() >= rows * w;
        check(NAME, ok, || format!("columns {cols:?} of {rows} x {width}"))?;
        if rows == 0 || w == 0 {
            return Ok(());
        }
        let (wi, c0, wn) = (
            int(NAME, "width", width)?,
            int(NAME, "c0", cols.start)?,
            int(NAME, "w", w)?,
        );
        let (xp, op) = (ptr(x, stream), ptr_mut(out, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, rows)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(&self.kernels.split.gather_cols);
        l.arg(&xp).arg(&op).arg(&wi).arg(&c0).arg(&wn);
        // SAFETY: gather_cols_bf16(x, out, width, c0, w); x rows x width, out rows x w (checked).
        unsafe { l.launch(cfg) }?;
        Ok(())
    }
}
