//! `fp8_gemv`: y[b, n] = sum_k x[b, k] * e4m3(W[n, k]) * S[n/128, k/128] (see cuda/fp8_gemv.cu).
use std::marker::PhantomData;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use half::bf16;

use super::{grid, int, ptr, ptr_mut};
use crate::context::{nt_index, GpuContext};
use crate::error::{check, Result};

const NAME: &str = "fp8_gemv";

/// Output buffer of a GEMV-like kernel: f32 or bf16, row-major. Holds the mutable borrow of the buffer.
pub struct GemvOut<'a> {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) bf16: i32,
    _borrow: PhantomData<&'a mut ()>,
}

impl<'a> GemvOut<'a> {
    pub fn f32(buf: &'a mut impl DevicePtrMut<f32>, stream: &CudaStream) -> Self {
        GemvOut {
            len: buf.len(),
            ptr: ptr_mut(buf, stream),
            bf16: 0,
            _borrow: PhantomData,
        }
    }
    pub fn bf16(buf: &'a mut impl DevicePtrMut<bf16>, stream: &CudaStream) -> Self {
        GemvOut {
            len: buf.len(),
            ptr: ptr_mut(buf, stream),
            bf16: 1,
            _borrow: PhantomData,
        }
    }
}

/// Shape and split-K choice of one FP8 GEMV. Build with [`GpuContext::fp8_gemv_plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8GemvPlan {
    pub b: usize,
    pub n: usize,
    pub k: usize,
    /// Blocks along K (each of 8 warps); > 1 needs a workspace and a second (reduce) launch.
    pub splits: usize,
}

impl Fp8GemvPlan {
    /// f32 elements of workspace [`GpuContext::launch_fp8_gemv`] needs (0: none).
    pub fn workspace_len(&self) -> usize {
        if self.splits > 1 {
            self.splits * self.b * self.n
        } else {
            0
        }
    }
}

impl GpuContext {
    /// Chooses split-K so that about two blocks per SM exist even when N is small (wkv: N = 512).
    pub fn fp8_gemv_plan(&self, b: usize, n: usize, k: usize) -> Result<Fp8GemvPlan> {
        check(NAME, (1..=64).contains(&b), || {
            format!("batch {b} not in 1..=64")
        })?;
        check(NAME, n > 0 && k > 0 && k.is_multiple_of(16), || {
            format!("need N > 0 and K % 16 == 0, got N {n} K {k}")
        })?;
        let row_tiles = n.div_ceil(32);
        let kblocks = k.div_ceil(128);
        let target = 2 * self.info.sm_count as usize;
        let splits = target.div_ceil(row_tiles).clamp(1, kblocks.div_ceil(8));
        Ok(Fp8GemvPlan { b, n, k, splits })
    }

    /// Launches the GEMV (and the split-K reduce when `plan.splits > 1`). `w` u8 [N, K] e4m3, `scale` u8
    /// UE8M0 [ceil(N/128), ceil(K/128)], `x` bf16 [B, K].
    #[allow(clippy::too_many_arguments)]
    pub fn launch_fp8_gemv(
        &self,
        stream: &CudaStream,
        plan: &Fp8GemvPlan,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<u8>,
        scale: &impl DevicePtr<u8>,
        out: GemvOut<'_>,
        workspace: Option<&mut impl DevicePtrMut<f32>>,
    ) -> Result<()> {
        let (b, n, k) = (plan.b, plan.n, plan.k);
        check(NAME, x.len() >= b * k, || {
            format!("x has {} elements, need {}", x.len(), b * k)
        })?;
        check(NAME, w.len() >= n * k, || {
            format!("w has {} bytes, need {}", w.len(), n * k)
        })?;
        let slen = n.div_ceil(128) * k.div_ceil(128);
        check(NAME, scale.len() >= slen, || {
            format!("scale has {} bytes, need {slen}", scale.len())
        })?;
        let (out_ptr, out_len, out_bf16) = (out.ptr, out.len, out.bf16);
        check(NAME, out_len >= b * n, || {
            format!("out has {out_len} elements, need {}", b * n)
        })?;
        let ws_ptr = match workspace {
            Some(ws) if ws.len() >= plan.workspace_len() => ptr_mut(ws, stream),
            _ if plan.workspace_len() == 0 => 0u64,
            _ => {
                return check(NAME, false, || {
                    format!("workspace of {} f32 needed", plan.workspace_len())
                })
            }
        };
        let (bi, ni, ki) = (int(NAME, "B", b)?, int(NAME, "N", n)?, int(NAME, "K", k)?);
        let (xp, wp, sp) = (ptr(x, stream), ptr(w, stream), ptr(scale, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, n.div_ceil(32))?, grid(NAME, plan.splits)?, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let func = &self.kernels.fp8_gemv[nt_index(b)];
        let mut l = stream.launch_builder(func);
        l.arg(&xp)
            .arg(&wp)
            .arg(&sp)
            .arg(&out_ptr)
            .arg(&ws_ptr)
            .arg(&bi)
            .arg(&ni)
            .arg(&ki)
            .arg(&out_bf16);
        // SAFETY: argument list matches fp8_gemv_ntX(x, w, s, out, ws, B, N, K, out_bf16); every buffer was
        // checked above to hold what the kernel reads or writes for this (B, N, K).
        unsafe { l.launch(cfg) }?;
        if plan.splits > 1 {
            let total = b * n;
            let (splits, total_i) = (int(NAME, "splits", plan.splits)?, int(NAME, "B*N", total)?);
            let cfg = LaunchConfig {
                grid_dim: (grid(NAME, total.div_ceil(256))?, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut l = stream.launch_builder(&self.kernels.gemv_splitk_reduce);
            l.arg(&ws_ptr)
                .arg(&out_ptr)
                .arg(&splits)
                .arg(&total_i)
                .arg(&out_bf16);
            // SAFETY: gemv_splitk_reduce(ws, out, splits, total, out_bf16); ws holds splits*total f32 and out
            // holds total elements (checked above).
            unsafe { l.launch(cfg) }?;
        }
        Ok(())
    }
}
