//! MoE routing, SwiGLU and FP8 fake-quantisation launchers (see cuda/moe_route.cu).
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use half::bf16;

use super::fp4_expert::moe_group_meta_len;
use super::{grid, int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "moe_route";

/// How one MoE layer routes.
#[derive(Debug, Clone, Copy)]
pub struct RouteShape {
    pub rows: usize,
    pub experts: usize,
    pub topk: usize,
    pub route_scale: f32,
}

/// Where the expert ids come from: hash layers read `tid2eid` i32 [vocab, topk] at the row's token; the
/// others take the top-k of score + bias (f32 [E]).
pub enum RouteBy<'a, T: DevicePtr<i32>, B: DevicePtr<f32>> {
    Hash { tid2eid: &'a T, tokens: &'a T },
    TopK { bias: Option<&'a B> },
}

/// The checked kernel arguments shared by `moe_route` and `moe_route_group`, in their order.
pub(super) struct RouteArgs {
    logits: u64,
    bias: u64,
    table: u64,
    tokens: u64,
    e: i32,
    topk: i32,
    ids: u64,
    wts: u64,
}

impl RouteArgs {
    /// Appends (logits, bias, tid2eid, tokens, E, topk, scale, ids, wts), the arguments both kernels
    /// start with.
    pub(super) fn push<'a>(&'a self, l: &mut Args<'a>, scale: &'a f32) {
        l.arg(&self.logits).arg(&self.bias).arg(&self.table);
        l.arg(&self.tokens).arg(&self.e).arg(&self.topk);
        l.arg(scale).arg(&self.ids).arg(&self.wts);
    }
}

pub(super) fn route_args<T: DevicePtr<i32>, B: DevicePtr<f32>>(
    stream: &CudaStream,
    s: &RouteShape,
    logits: &impl DevicePtr<f32>,
    by: RouteBy<'_, T, B>,
    ids: &mut impl DevicePtrMut<i32>,
    wts: &mut impl DevicePtrMut<f32>,
) -> Result<RouteArgs> {
    let slots = s.rows * s.topk;
    check(
        NAME,
        (1..=1024).contains(&s.experts) && (1..=16).contains(&s.topk),
        || format!("E {} topk {}", s.experts, s.topk),
    )?;
    check(NAME, s.topk <= s.experts && s.rows > 0, || {
        "topk > E".into()
    })?;
    check(NAME, logits.len() >= s.rows * s.experts, || {
        "logits too short".into()
    })?;
    check(NAME, ids.len() >= slots && wts.len() >= slots, || {
        "ids/wts too short".into()
    })?;
    let (bias, table, tokens) = match by {
        RouteBy::Hash { tid2eid, tokens } => {
            check(NAME, tokens.len() >= s.rows, || "tokens too short".into())?;
            (0, ptr(tid2eid, stream), ptr(tokens, stream))
        }
        RouteBy::TopK { bias } => match bias {
            Some(b) => {
                check(NAME, b.len() >= s.experts, || "bias too short".into())?;
                (ptr(b, stream), 0, 0)
            }
            None => (0, 0, 0),
        },
    };
    Ok(RouteArgs {
        logits: ptr(logits, stream),
        bias,
        table,
        tokens,
        e: int(NAME, "E", s.experts)?,
        topk: int(NAME, "topk", s.topk)?,
        ids: ptr_mut(ids, stream),
        wts: ptr_mut(wts, stream),
    })
}

/// Routing rows per `moe_route_group` block when it runs several blocks.
const ROUTE_GROUP_ROWS: usize = 4;
/// Up to this many rows `moe_route_group` runs one block of one warp per row (no device counter; its
/// shared id list holds 16 x topk <= 256 ids).
const ROUTE_GROUP_ONE_BLOCK: usize = 16;
/// Fewest warps of the one-block `moe_route_group`: 256 threads score the 256 experts of a batch-1 row at once.
const ROUTE_SCORE_WARPS: usize = 8;

impl GpuContext {
    /// `logits` f32 [rows, E] -> `ids` i32 [rows*topk], `wts` f32 [rows*topk].
    pub fn launch_moe_route<T: DevicePtr<i32>, B: DevicePtr<f32>>(
        &self,
        stream: &CudaStream,
        s: &RouteShape,
        logits: &impl DevicePtr<f32>,
        by: RouteBy<'_, T, B>,
        ids: &mut impl DevicePtrMut<i32>,
        wts: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let a = route_args(stream, s, logits, by, ids, wts)?;
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, s.rows)?, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        a.push(&mut l, &s.route_scale);
        // SAFETY: moe_route(logits, bias, tid2eid, tokens, E, topk, scale, ids, wts); lengths checked in
        // route_args; tid2eid rows are read at token ids the caller keeps below vocab (the table's row count).
        unsafe { self.launch_k(stream, &self.kernels.runner.moe_route, cfg, &mut l) }?;
        Ok(())
    }

    /// [`Self::launch_moe_route`] followed by [`Self::launch_moe_group`] of the ids into `meta`, in one
    /// launch (the same bits). `meta` (at least [`moe_group_meta_len`] of rows*topk) must have been
    /// allocated zeroed: the BUFFER's last element is the kernel's block counter, which every launch
    /// leaves at zero. Why the buffer's and not the launch's: a launch of fewer rows than an earlier one
    /// on the same buffer would find its counter inside the groups the earlier launch wrote (a stale
    /// count: the grouping skipped, the previous step's experts used).
    #[allow(clippy::too_many_arguments)]
    pub fn launch_moe_route_group<T: DevicePtr<i32>, B: DevicePtr<f32>>(
        &self,
        stream: &CudaStream,
        s: &RouteShape,
        logits: &impl DevicePtr<f32>,
        by: RouteBy<'_, T, B>,
        ids: &mut impl DevicePtrMut<i32>,
        wts: &mut impl DevicePtrMut<f32>,
        meta: &mut impl DevicePtrMut<i32>,
    ) -> Result<()> {
        let slots = s.rows * s.topk;
        let need = moe_group_meta_len(slots);
        check(NAME, meta.len() >= need, || {
            format!("meta has {}, need {need}", meta.len())
        })?;
        let a = route_args(stream, s, logits, by, ids, wts)?;
        let rows = int(NAME, "rows", s.rows)?;
        let mp = ptr_mut(meta, stream);
        // The counter: the buffer's last element, past what any launch on it writes (moe_group_meta_len).
        let cp = mp + 4 * (meta.len() as u64 - 1);
        let (per_block, warps) = if s.rows <= ROUTE_GROUP_ONE_BLOCK {
            // At least ROUTE_SCORE_WARPS warps: the one-block kernel scores every (row, expert) pair with the
            // whole block before its routing warps read them.
            (s.rows, s.rows.max(ROUTE_SCORE_WARPS))
        } else {
            (ROUTE_GROUP_ROWS, ROUTE_GROUP_ROWS)
        };
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, s.rows.div_ceil(per_block))?, 1, 1),
            block_dim: (32 * grid(NAME, warps)?, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        a.push(&mut l, &s.route_scale);
        let early = route_early();
        l.arg(&rows).arg(&mp).arg(&cp).arg(&early);
        // SAFETY: moe_route_group(logits, bias, tid2eid, tokens, E, topk, scale, ids, wts, rows, meta,
        // counter, early); lengths checked (route_args, meta above); the counter lies inside meta.
        unsafe { self.launch_k(stream, &self.kernels.runner.moe_route_group, cfg, &mut l) }?;
        Ok(())
    }

    /// h = bf16(silu(min(g, L)) * clamp(u, -L, L) * wt), then FP8 fake quantisation when `quant`.
    /// `g`, `u` f32 [slots, inter]; `wt` f32 [slots] (None: 1); `out` bf16 [slots, inter].
    #[allow(clippy::too_many_arguments)]
    pub fn launch_moe_swiglu(
        &self,
        stream: &CudaStream,
        slots: usize,
        inter: usize,
        limit: f32,
        quant: bool,
        g: &impl DevicePtr<f32>,
        u: &impl DevicePtr<f32>,
        wt: Option<&impl DevicePtr<f32>>,
        out: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        let act = SwigluAct {
            slots,
            inter,
            limit,
            quant,
            early: false,
        };
        self.launch_moe_swiglu_with(stream, act, g, u, wt, out)
    }

    /// [`Self::launch_moe_swiglu`] with its shape and options in `act` (see [`SwigluAct::early`]).
    pub fn launch_moe_swiglu_with(
        &self,
        stream: &CudaStream,
        act: SwigluAct,
        g: &impl DevicePtr<f32>,
        u: &impl DevicePtr<f32>,
        wt: Option<&impl DevicePtr<f32>>,
        out: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        let SwigluAct {
            slots,
            inter,
            limit,
            quant,
            early,
        } = act;
        let n = slots * inter;
        check(
            NAME,
            n > 0 && g.len() >= n && u.len() >= n && out.len() >= n,
            || "swiglu: buffers too short".into(),
        )?;
        let wp = match wt {
            Some(w) if w.len() >= slots => ptr(w, stream),
            Some(_) => return check(NAME, false, || "swiglu: weights too short".into()),
            None => 0,
        };
        let blocks = slots * inter.div_ceil(128);
        let (si, ii, qi) = (
            int(NAME, "S", slots)?,
            int(NAME, "I", inter)?,
            i32::from(quant),
        );
        let (gp, up, op) = (ptr(g, stream), ptr(u, stream), ptr_mut(out, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, blocks.div_ceil(8))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let early = i32::from(early);
        let mut l = Args::new();
        l.arg(&gp)
            .arg(&up)
            .arg(&wp)
            .arg(&op)
            .arg(&si)
            .arg(&ii)
            .arg(&limit)
            .arg(&qi)
            .arg(&early);
        // SAFETY: moe_swiglu(g, u, wt, out, S, I, limit, quant, early); lengths checked above (wt may be null).
        unsafe { self.launch_k(stream, &self.kernels.runner.moe_swiglu, cfg, &mut l) }?;
        Ok(())
    }

    /// FP8 fake quantisation (blocks of 128 along rows, shorter tail block) of `x` bf16 [rows, d] into
    /// `out` (which may be the same memory).
    pub fn launch_fake_quant_rows(
        &self,
        stream: &CudaStream,
        rows: usize,
        d: usize,
        x: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        check(
            NAME,
            rows * d > 0 && x.len() >= rows * d && out.len() >= rows * d,
            || "fake_quant: buffers too short".into(),
        )?;
        let blocks = rows * d.div_ceil(128);
        let (ri, di) = (int(NAME, "rows", rows)?, int(NAME, "D", d)?);
        let (xp, op) = (ptr(x, stream), ptr_mut(out, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, blocks.div_ceil(8))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&xp).arg(&op).arg(&ri).arg(&di);
        // SAFETY: fake_quant_rows(x, out, rows, D); both hold rows*D (checked).
        unsafe { self.launch_k(stream, &self.kernels.runner.fake_quant_rows, cfg, &mut l) }?;
        Ok(())
    }
}

/// One SwiGLU launch's shape and options (see [`GpuContext::launch_moe_swiglu`]).
#[derive(Debug, Clone, Copy)]
pub struct SwigluAct {
    pub slots: usize,
    pub inter: usize,
    pub limit: f32,
    pub quant: bool,
    /// Let the next kernel start right after this one's own wait instead of at its blocks' exit: that kernel
    /// still waits for it to complete, but its blocks are placed meanwhile and can issue loads that do not
    /// depend on it (the routed w2 of [`GpuContext::launch_fp4_expert_table_ready`]). The same values.
    pub early: bool,
}

/// Whether moe_route_group lets the next kernel (the routed experts) be placed right after its own wait instead
/// of at its exit (`DSV4_ROUTE_EARLY=0`: at its exit, for A/B runs); that kernel still waits for the table, so
/// only its launch and block placement overlap the routing (one block at up to 16 rows). Measured (one H200,
/// graphs, 4K, ms per step, two rounds): batch 2 7.517 / 7.507 -> 7.339 / 7.346 (-2.2%), batch 8 13.134 / 13.136
/// -> 12.980 / 12.982 (-1.2%), batch 16 level.
fn route_early() -> i32 {
    static V: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *V.get_or_init(|| i32::from(super::env_usize("DSV4_ROUTE_EARLY") != Some(0)))
}
