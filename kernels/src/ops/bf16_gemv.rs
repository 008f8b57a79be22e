//! `bf16_gemv`: y[b, n] = sum_k x[b, k] * W[n, k] with bf16 weights (see cuda/bf16_gemv.cu).
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use half::bf16;

use super::fp8_gemv::GemvOut;
use super::{grid, int, ptr, ptr_mut};
use crate::context::{nt_index, GpuContext};
use crate::error::{check, Result};

const NAME: &str = "bf16_gemv";
/// K handled by one warp step (cuda BG_KB).
const KB: usize = 64;

/// Shape and split-K choice of one bf16 GEMV. Build with [`GpuContext::bf16_gemv_plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bf16GemvPlan {
    pub b: usize,
    pub n: usize,
    pub k: usize,
    pub splits: usize,
}

impl Bf16GemvPlan {
    /// f32 elements of split-K workspace needed (0: none).
    pub fn workspace_len(&self) -> usize {
        if self.splits > 1 {
            self.splits * self.b * self.n
        } else {
            0
        }
    }
}

impl GpuContext {
    /// Splits K so that about two blocks per SM exist even for small N (the MoE gate: N = 256).
    pub fn bf16_gemv_plan(&self, b: usize, n: usize, k: usize) -> Result<Bf16GemvPlan> {
        check(NAME, (1..=64).contains(&b), || {
            format!("batch {b} not in 1..=64")
        })?;
        check(NAME, n > 0 && k > 0 && k.is_multiple_of(8), || {
            format!("need N > 0 and K % 8 == 0, got N {n} K {k}")
        })?;
        let target = 2 * self.info.sm_count as usize;
        let splits = target
            .div_ceil(n.div_ceil(32))
            .clamp(1, k.div_ceil(KB).div_ceil(8));
        Ok(Bf16GemvPlan { b, n, k, splits })
    }

    /// Launches the GEMV (plus the split-K reduce when `plan.splits > 1`). `w` bf16 [N, K], `x` bf16 [B, K].
    pub fn launch_bf16_gemv(
        &self,
        stream: &CudaStream,
        plan: &Bf16GemvPlan,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        out: GemvOut<'_>,
        workspace: Option<&mut impl DevicePtrMut<f32>>,
    ) -> Result<()> {
        let (b, n, k) = (plan.b, plan.n, plan.k);
        check(
            NAME,
            x.len() >= b * k && w.len() >= n * k && out.len >= b * n,
            || {
                format!(
                    "x {} w {} out {} too short for B {b} N {n} K {k}",
                    x.len(),
                    w.len(),
                    out.len
                )
            },
        )?;
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
        let (xp, wp) = (ptr(x, stream), ptr(w, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, n.div_ceil(32))?, grid(NAME, plan.splits)?, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(&self.kernels.runner.bf16_gemv[nt_index(b)]);
        l.arg(&xp).arg(&wp).arg(&out.ptr).arg(&ws_ptr);
        l.arg(&bi).arg(&ni).arg(&ki).arg(&out.bf16);
        // SAFETY: bf16_gemv_ntX(x, w, out, ws, B, N, K, out_bf16); x, w, out and ws were checked above to
        // hold what the kernel touches for (B, N, K, splits).
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
                .arg(&out.ptr)
                .arg(&splits)
                .arg(&total_i)
                .arg(&out.bf16);
            // SAFETY: gemv_splitk_reduce(ws, out, splits, total, out_bf16); ws holds splits*total f32 and out
            // holds total elements (checked above).
            unsafe { l.launch(cfg) }?;
        }
        Ok(())
    }
}
