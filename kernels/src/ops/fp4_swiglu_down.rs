//! `fp4_swiglu_down`: the routed w2 of a small decode batch with the SwiGLU in the same launch (see
//! cuda/moe_swiglu_down.cu): the same bits as `launch_moe_swiglu` followed by `launch_fp4_expert` of w2, one
//! dependent launch fewer and no SwiGLU output in global memory.
use cudarc::driver::{CudaStream, DevicePtr, LaunchConfig};

use super::fp4_expert::{check_mat, moe_group_meta_len, ExpertShape, Fp4Mat, Fp4Tune};
use super::{grid, int, ptr};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "fp4_swiglu_down";

/// The matrix shape (N, K) compiled into the kernel: the routed w2 of DeepSeek-V4-Flash.
pub const FP4_SWIGLU_DOWN_SHAPE: (usize, usize) = (4096, 2048);
/// The K split and row tile compiled into the kernel (fp4_expert_n4096k2048w2's: the shape's default).
const FUSED_TUNE: Fp4Tune = Fp4Tune { kw: 2, mt: 2 };

/// Whether one fused launch can run the SwiGLU and w2 of `shape`: the compiled shape with its default K split,
/// x per slot (w2's input is each slot's SwiGLU), a decode batch.
pub fn fp4_swiglu_down_fits(shape: &ExpertShape) -> bool {
    (shape.n, shape.k) == FP4_SWIGLU_DOWN_SHAPE
        && Fp4Tune::for_shape(shape) == FUSED_TUNE
        && shape.x_per_slot
        && (1..=64).contains(&shape.b)
}

/// The SwiGLU half of a fused launch: w1's and w3's outputs `g`, `u` ([slots, K] f32), the routing weights
/// (None: 1), the clamp (`limit` <= 0: none) and whether the values are FP8 fake-quantised per 128 (official
/// numerics) or rounded through bf16, as for [`GpuContext::launch_moe_swiglu`].
pub struct SwigluIn<'a, F: DevicePtr<f32>> {
    pub g: &'a F,
    pub u: &'a F,
    pub wt: Option<&'a F>,
    pub limit: f32,
    pub quant: bool,
}

impl GpuContext {
    /// The SwiGLU of `sw` (as [`Self::launch_moe_swiglu`]) and the w2 GEMV of `shape` over it (as
    /// [`Self::launch_fp4_expert`] with x per slot) in one launch; the same bits as those two launches. Only for
    /// [`fp4_swiglu_down_fits`] shapes.
    pub fn launch_fp4_swiglu_down<F, W>(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        sw: SwigluIn<'_, F>,
        mat: Fp4Mat<'_, W>,
        meta: &impl DevicePtr<i32>,
    ) -> Result<()>
    where
        F: DevicePtr<f32>,
        W: DevicePtr<u8>,
    {
        check(NAME, fp4_swiglu_down_fits(shape), || {
            format!("{shape:?}: not a fused shape")
        })?;
        let slots = shape.b * shape.topk;
        let n = slots * shape.k;
        check(NAME, sw.g.len() >= n && sw.u.len() >= n, || {
            format!("g / u have {} / {}, need {n}", sw.g.len(), sw.u.len())
        })?;
        let wp = match sw.wt {
            Some(w) if w.len() >= slots => ptr(w, stream),
            Some(_) => return check(NAME, false, || "routing weights too short".into()),
            None => 0,
        };
        check(NAME, meta.len() >= moe_group_meta_len(slots), || {
            "meta too short".into()
        })?;
        check_mat(shape, &mat)?;
        let (gp, up) = (ptr(sw.g, stream), ptr(sw.u, stream));
        let (wq, sp, mp, op) = (
            ptr(mat.w, stream),
            ptr(mat.scale, stream),
            ptr(meta, stream),
            mat.out.ptr,
        );
        let (si, ti) = (int(NAME, "slots", slots)?, int(NAME, "topk", shape.topk)?);
        let (qi, out_bf16) = (i32::from(sw.quant), mat.out.bf16);
        let cfg = LaunchConfig {
            grid_dim: (
                grid(NAME, shape.n / FUSED_TUNE.block_rows())?,
                grid(NAME, shape.experts.min(slots))?,
                1,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&gp).arg(&up).arg(&wp).arg(&sw.limit).arg(&qi);
        l.arg(&wq).arg(&sp).arg(&mp).arg(&op);
        l.arg(&si).arg(&ti).arg(&out_bf16);
        // SAFETY: fp4_swiglu_down_n4096k2048w2(g, u, wt, limit, quant, w, s, meta, out, S, topk, out_bf16): the
        // shape is the compiled one (fp4_swiglu_down_fits), g / u / wt checked for the slots, the matrix and its
        // output for the shape (check_mat), meta for the slots; expert ids and slots come from meta, which
        // moe_group / moe_route_group / fp4_routed_up fill with ids in [0, E) and slots in [0, S).
        unsafe { self.launch_k(stream, &self.kernels.fp4_swiglu_down, cfg, &mut l) }?;
        Ok(())
    }
}
