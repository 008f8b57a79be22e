//! Host side of the warp-specialised TMA GEMM (`cuda/prefill_wgmma_ws.cu`, sm_90a only): the tensor maps of
//! each group's x and W (the copy engine's descriptors, encoded on the host) in the kernel's parameter block,
//! and the persistent grid. Reached through `GpuContext::launch_pf_wgmma` with a `ws` variant.
use std::ffi::c_void;

use cudarc::driver::{sys, CudaFunction, CudaStream, DeviceRepr};

use super::attn_launch::cfg;
use super::attn_params::device_repr;
use super::grid;
use super::prefill_params::{pf_wgmma_smem, PfWgmma, WgmmaVariant, PF_GROUPS};
use crate::context::GpuContext;
use crate::error::{check, Result};

const NAME: &str = "pf_wgmma_bf16_ws";

/// Threads of one block: a producer and two consumer warpgroups.
const THREADS: u32 = 384;

/// Values of K per TMA box (128 bytes of bf16: the width of the 128-byte swizzle).
const BOX_K: u32 = 64;

/// A CUtensorMap as the kernel reads it: 128 opaque bytes, 128-byte aligned (as cuda.h 13 declares it).
#[repr(C, align(128))]
#[derive(Debug, Clone, Copy, Default)]
pub struct TensorMap(pub [u64; 16]);

/// The C struct PfWgmmaTma: per group the tensor maps of x `[M, K]` and W `[n, K]`, then PfWgmma's outputs and
/// sizes, the group count and the launch's tile count.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfWgmmaTma {
    pub x: [TensorMap; PF_GROUPS],
    pub w: [TensorMap; PF_GROUPS],
    pub out: [u64; PF_GROUPS],
    pub n: [i32; PF_GROUPS],
    pub m: i32,
    pub k: i32,
    pub out_bf16: i32,
    pub groups: i32,
    pub tiles: i32,
    pub pad: i32,
}

device_repr!(PfWgmmaTma);

/// Tensor map of the bf16 matrix `[rows, k]` (row-major) at `addr`, read in boxes of 64 values x `box_rows`
/// rows in the 128-byte swizzle; rows and k outside the matrix read as zeros. `addr` 16-byte aligned, k % 8 == 0
/// (the row pitch a multiple of 16 bytes), both checked by the caller.
fn bf16_map(addr: u64, rows: usize, k: usize, box_rows: u32) -> Result<TensorMap> {
    use sys::{
        CUtensorMapDataType as D, CUtensorMapFloatOOBfill as F, CUtensorMapInterleave as I,
        CUtensorMapL2promotion as L, CUtensorMapSwizzle as S,
    };
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims = [k as u64, rows as u64];
    let pitch = [2 * k as u64];
    let boxes = [BOX_K, box_rows];
    let steps = [1u32, 1];
    // SAFETY: `map` is a writable CUtensorMap; dims / boxes / steps hold rank (2) entries and pitch rank - 1;
    // the encoding only describes `addr` (nothing is read there now).
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            addr as *mut c_void,
            dims.as_ptr(),
            pitch.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            I::CU_TENSOR_MAP_INTERLEAVE_NONE,
            S::CU_TENSOR_MAP_SWIZZLE_128B,
            L::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()?;
    }
    Ok(TensorMap(map.opaque))
}

/// The kernel's parameter block for the first `groups` groups of `p` (shapes already checked).
fn params(p: &PfWgmma, groups: usize, bn: usize) -> Result<PfWgmmaTma> {
    let (m, k) = (p.m as usize, p.k as usize);
    let mut q = PfWgmmaTma {
        out: p.out,
        n: p.n,
        m: p.m,
        k: p.k,
        out_bf16: p.out_bf16,
        groups: groups as i32,
        ..Default::default()
    };
    let mut tiles = 0usize;
    for g in 0..groups {
        let n = p.n[g] as usize;
        q.x[g] = bf16_map(p.x[g], m, k, 128)?;
        q.w[g] = bf16_map(p.w[g], n, k, bn as u32)?;
        tiles += m.div_ceil(128) * n.div_ceil(bn);
    }
    check(NAME, tiles < i32::MAX as usize, || format!("{tiles} tiles"))?;
    q.tiles = tiles as i32;
    Ok(q)
}

impl GpuContext {
    /// `pf_wgmma_bf16_ws` (`f`, variant `v`) over the first `groups` groups of `p`: min(tiles, SMs) persistent
    /// blocks.
    ///
    /// # Safety
    /// As `launch_pf_wgmma`, whose checks (groups, M, K % 8, n > 0, 16-byte aligned x and W) were done.
    pub(super) unsafe fn launch_pf_wgmma_ws(
        &self,
        s: &CudaStream,
        f: &CudaFunction,
        v: WgmmaVariant,
        groups: usize,
        p: &PfWgmma,
    ) -> Result<()> {
        let q = params(p, groups, v.bn())?;
        let blocks = (q.tiles as usize).min(self.info.sm_count.max(1) as usize);
        let c = cfg((grid(NAME, blocks)?, 1, 1), THREADS, pf_wgmma_smem(v));
        // SAFETY: the caller's contract; the tensor maps describe exactly the buffers of `p`.
        unsafe { self.launch_one(s, f, c, &q) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_block_has_the_c_layout() {
        // 16 maps of 128 bytes, 8 pointers, 8 + 6 ints, padded to the 128-byte alignment.
        assert_eq!(std::mem::offset_of!(PfWgmmaTma, out), 16 * 128);
        assert_eq!(
            std::mem::offset_of!(PfWgmmaTma, m),
            16 * 128 + 8 * 8 + 8 * 4
        );
        assert_eq!(std::mem::size_of::<PfWgmmaTma>(), 17 * 128);
        assert_eq!(
            std::mem::size_of::<TensorMap>(),
            std::mem::size_of::<sys::CUtensorMap>()
        );
    }
}
