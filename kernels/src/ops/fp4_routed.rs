//! `fp4_routed_up`: the routed w1 / w3 pair of a small decode batch with its routing and grouping in the same
//! launch (see cuda/moe_routed_up.cu): the same bits as `launch_moe_route_group` followed by
//! `launch_fp4_expert_pair`, one dependent launch fewer.
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use half::bf16;

use super::fp4_expert::{check_mat, moe_group_meta_len, ExpertShape, Fp4Mat, Fp4Tune};
use super::moe_route::{route_args, RouteBy, RouteShape};
use super::{grid, int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "fp4_routed_up";

/// The matrix shape (N, K) compiled into the kernel: the routed w1 / w3 of DeepSeek-V4-Flash.
pub const FP4_ROUTED_UP_SHAPE: (usize, usize) = (2048, 4096);
/// Most rows: the kernel's block routes one row per warp, with 4 warps.
pub const FP4_ROUTED_UP_ROWS: usize = 4;
/// Most slots (rows x topk): one warp groups them.
const SLOTS_MAX: usize = 32;
/// Most experts: the block's score scratch holds 4 rows of 256.
const EXPERTS_MAX: usize = 256;
/// The K split and row tile compiled into the kernel (fp4_expert_n2048k4096w4's: the shape's default).
const FUSED_TUNE: Fp4Tune = Fp4Tune { kw: 4, mt: 2 };

/// Whether one fused launch can route `route` and run the w1 / w3 pair of `shape`: the compiled shape with its
/// default K split, the same rows, top-k and experts, and a batch the block's routing covers.
pub fn fp4_routed_up_fits(route: &RouteShape, shape: &ExpertShape) -> bool {
    (shape.n, shape.k) == FP4_ROUTED_UP_SHAPE
        && Fp4Tune::for_shape(shape) == FUSED_TUNE
        && !shape.x_per_slot
        && (shape.b, shape.topk, shape.experts) == (route.rows, route.topk, route.experts)
        && (1..=FP4_ROUTED_UP_ROWS).contains(&route.rows)
        && route.rows * route.topk <= SLOTS_MAX
        && route.experts <= EXPERTS_MAX
}

/// The routing half of a fused launch: the gate logits, how the layer routes, and where ids, weights and the
/// group table go (for the launches after it).
pub struct RoutedUpRoute<'a, T: DevicePtr<i32>, B: DevicePtr<f32>, L: DevicePtr<f32>> {
    pub shape: RouteShape,
    pub logits: &'a L,
    pub by: RouteBy<'a, T, B>,
}

impl GpuContext {
    /// Routes `route.shape.rows` rows from `route.logits` into `ids` / `wts`, groups them into `meta` (as
    /// [`Self::launch_moe_route_group`]) and runs the w1 / w3 pair of `shape` over `x` (as
    /// [`Self::launch_fp4_expert_pair`]) in one launch; the same bits as those two launches. Only for
    /// [`fp4_routed_up_fits`] shapes.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_fp4_routed_up<T, B, L, W>(
        &self,
        stream: &CudaStream,
        route: RoutedUpRoute<'_, T, B, L>,
        ids: &mut impl DevicePtrMut<i32>,
        wts: &mut impl DevicePtrMut<f32>,
        meta: &mut impl DevicePtrMut<i32>,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        mats: [Fp4Mat<'_, W>; 2],
    ) -> Result<()>
    where
        T: DevicePtr<i32>,
        B: DevicePtr<f32>,
        L: DevicePtr<f32>,
        W: DevicePtr<u8>,
    {
        let rs = route.shape;
        check(NAME, fp4_routed_up_fits(&rs, shape), || {
            format!("{rs:?} / {shape:?}: not a fused shape")
        })?;
        let slots = rs.rows * rs.topk;
        check(NAME, meta.len() >= moe_group_meta_len(slots), || {
            "meta too short".into()
        })?;
        check(NAME, x.len() >= rs.rows * shape.k, || "x too short".into())?;
        let [a, b] = mats;
        check(NAME, a.out.bf16 == b.out.bf16, || {
            "paired outputs differ in type".into()
        })?;
        check_mat(shape, &a)?;
        check_mat(shape, &b)?;
        let ra = route_args(stream, &rs, route.logits, route.by, ids, wts)?;
        let (w0, s0, o0) = (ptr(a.w, stream), ptr(a.scale, stream), a.out.ptr);
        let d = (
            ptr(b.w, stream).wrapping_sub(w0),
            ptr(b.scale, stream).wrapping_sub(s0),
            b.out.ptr.wrapping_sub(o0),
        );
        let (xp, mp) = (ptr(x, stream), ptr_mut(meta, stream));
        let (out_bf16, rows) = (a.out.bf16, int(NAME, "rows", rs.rows)?);
        let block_rows = FUSED_TUNE.block_rows();
        let cfg = LaunchConfig {
            grid_dim: (
                grid(NAME, shape.n / block_rows)?,
                grid(NAME, shape.experts.min(slots))?,
                2,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&xp).arg(&w0).arg(&s0).arg(&o0);
        l.arg(&d.0).arg(&d.1).arg(&d.2).arg(&out_bf16);
        ra.push(&mut l, &rs.route_scale);
        l.arg(&rows).arg(&mp);
        // SAFETY: fp4_routed_up_n2048k4096w4(x, w, s, out, dw, ds, dout, out_bf16, logits, bias, tid2eid, tokens,
        // E, topk, scale, ids, wts, rows, meta): the shape is the compiled one (fp4_routed_up_fits), both matrices
        // checked for it (check_mat: block z reads matrix z at base + z * offset), x for the rows, the routing
        // buffers in route_args, meta above; expert ids come from the routing (top-k over [0, E) or tid2eid, whose
        // entries the caller keeps in [0, E), as for moe_route_group).
        unsafe { self.launch_k(stream, &self.kernels.fp4_routed_up, cfg, &mut l) }?;
        Ok(())
    }
}
