//! Decode GEMVs (see cuda/gemv.cu and cuda/gemv_ring.cu): FP8 or bf16 weights, one to [`GEMV_GROUPS`]
//! matrices per launch, split-K reduced inside the kernel. [`GemvPath`] picks the kernel family by the row
//! count; one split planner ([`gemv_splits`]) per family serves every caller.
use std::marker::PhantomData;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig,
};
use half::bf16;
use std::sync::Arc;

use super::gemv_plan::check_groups_and_scratch;
pub use super::gemv_plan::{gemv_cnt_len, gemv_splits, gemv_splits_max, gemv_ws_len};
use super::gemv_ring::{ring_splits_ok, GemvPath, RING_ROWS_MIN};
use super::gemv_tile::tiled_launch;
use super::{grid, ptr, ptr_mut};
use crate::context::{nt_index, GpuContext};
use crate::error::{check, KernelError, Result};
use crate::launch::Args;

const NAME: &str = "gemv";

/// Most groups of one launch.
pub const GEMV_GROUPS: usize = 8;
/// Rows per block (the split-K counters count blocks per row tile).
pub const GEMV_ROW_TILE: usize = 32;

/// Weight format of a GEMV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvWeights {
    /// e4m3 bytes with UE8M0 128x128 block scales.
    Fp8,
    /// bf16.
    Bf16,
}

impl GemvWeights {
    /// K alignment the kernel needs (16-byte rows).
    fn k_align(self) -> usize {
        match self {
            GemvWeights::Fp8 => 16,
            GemvWeights::Bf16 => 8,
        }
    }

    /// K values per 128-byte step of one warp.
    pub(crate) fn k_step(self) -> usize {
        match self {
            GemvWeights::Fp8 => 128,
            GemvWeights::Bf16 => 64,
        }
    }
}

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

/// Shape and split-K of one single-matrix GEMV. Build with [`GpuContext::gemv_plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvPlan {
    pub wt: GemvWeights,
    pub b: usize,
    pub n: usize,
    pub k: usize,
    pub splits: usize,
    pub path: GemvPath,
    /// Ring path: kernel choices (tests and kbench; the default is what the engine runs).
    pub ring: RingTune,
}

/// Choices of one launch (tests and kbench; the engine launches the default): `mt`, `mma_sync` and `depth`
/// for the ring, `tile_rows` for either family. `mt`, `depth` and `tile_rows` leave the bits as they are;
/// `mma_sync` selects the other kernel family where both run, whose bits differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingTune {
    /// 16-row tiles per warp of the mma.sync ring (1 or 2; 0 picks).
    pub mt: usize,
    /// The portable mma.sync kernels even where the wgmma ones run.
    pub mma_sync: bool,
    /// Ring stages of the wgmma kernels (0: the resolved default; 2 up to the deepest that fits).
    pub depth: usize,
    /// Rows per batch tile, either family (gemv_tile.rs; the same bits): None the launcher's default,
    /// Some(0) none.
    pub tile_rows: Option<usize>,
}

impl GemvPlan {
    /// f32 workspace the launch needs (0: none).
    pub fn workspace_len(&self) -> usize {
        gemv_ws_len(1, self.splits, self.b, self.n)
    }
    /// Split-K counters the launch needs, batch tiles included (every group slot: gemv_tile.rs).
    pub fn counters_len(&self) -> usize {
        gemv_cnt_len(GEMV_GROUPS, self.n)
    }
}

/// Split-K workspace and arrival counters (zeroed at creation; every launch leaves them zero).
pub struct GemvScratch {
    pub ws: CudaSlice<f32>,
    pub cnt: CudaSlice<u32>,
}

impl GemvScratch {
    pub fn new(stream: &Arc<CudaStream>, ws_len: usize, cnt_len: usize) -> Result<Self> {
        Ok(GemvScratch {
            ws: stream.alloc_zeros(ws_len.max(1))?,
            cnt: stream.alloc_zeros(cnt_len.max(1))?,
        })
    }
}

/// Parameters of `gemv_fp8_ntX` / `gemv_bf16_ntX`: per group g < groups, x[g] bf16 [b, k], w[g] [n[g], k]
/// (+ s[g] scales for FP8), out[g] [b, n[g]] f32 or bf16. Mirrors the C struct GemvParams.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GemvParams {
    pub x: [u64; GEMV_GROUPS],
    pub w: [u64; GEMV_GROUPS],
    pub s: [u64; GEMV_GROUPS],
    pub out: [u64; GEMV_GROUPS],
    pub ws: u64,
    pub cnt: u64,
    pub n: [i32; GEMV_GROUPS],
    pub b: i32,
    pub k: i32,
    pub nmax: i32,
    pub out_bf16: i32,
}

// SAFETY: #[repr(C)] u64/i32 fields and arrays laid out as the C struct GemvParams in cuda/gemv.cu; no
// references.
unsafe impl DeviceRepr for GemvParams {}

impl GemvParams {
    /// (B, K, nmax) as sizes (negative values as 0: the launchers' checks reject them).
    pub(crate) fn dims(&self) -> (usize, usize, usize) {
        let u = |v: i32| v.max(0) as usize;
        (u(self.b), u(self.k), u(self.nmax))
    }
}

/// The grid of gemv.cu's kernels: (32-row tiles of the largest group, splits, groups), 256 threads.
pub(crate) fn skinny_cfg(
    name: &'static str,
    nmax: usize,
    splits: usize,
    groups: usize,
) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (
            grid(name, nmax.div_ceil(GEMV_ROW_TILE))?,
            grid(name, splits)?,
            grid(name, groups)?,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The GEMV kernels, resolved once with the module.
#[derive(Debug, Clone)]
pub struct GemvKernels {
    /// gemv_fp8_nt{1,2,4,8} / gemv_bf16_nt{1,2,4,8}: batch tiles of 8.
    pub fp8: [CudaFunction; 4],
    pub bf16: [CudaFunction; 4],
    /// gemv_fp8x_nt{1,2}: FP8 weights x e4m3 activation codes, 1-16 rows (gemv_q8.rs launches them).
    pub fp8x: [CudaFunction; 2],
}

impl GemvKernels {
    pub(crate) fn resolve(module: &Arc<CudaModule>) -> Result<Self> {
        let get = |name: &'static str| super::kernel(module, name);
        Ok(GemvKernels {
            fp8: [
                get("gemv_fp8_nt1")?,
                get("gemv_fp8_nt2")?,
                get("gemv_fp8_nt4")?,
                get("gemv_fp8_nt8")?,
            ],
            bf16: [
                get("gemv_bf16_nt1")?,
                get("gemv_bf16_nt2")?,
                get("gemv_bf16_nt4")?,
                get("gemv_bf16_nt8")?,
            ],
            fp8x: [get("gemv_fp8x_nt1")?, get("gemv_fp8x_nt2")?],
        })
    }
}

impl GpuContext {
    /// Plans one GEMV of `b` rows (1..=64) against an `n` x `k` matrix, on the family for `b` rows.
    pub fn gemv_plan(&self, wt: GemvWeights, b: usize, n: usize, k: usize) -> Result<GemvPlan> {
        self.gemv_plan_on(GemvPath::for_rows(b), wt, b, n, k)
    }

    /// [`GpuContext::gemv_plan`] on a given family (the ring takes 9..=64 rows).
    pub fn gemv_plan_on(
        &self,
        path: GemvPath,
        wt: GemvWeights,
        b: usize,
        n: usize,
        k: usize,
    ) -> Result<GemvPlan> {
        let lo = if path == GemvPath::Ring {
            RING_ROWS_MIN
        } else {
            1
        };
        check(NAME, (lo..=64).contains(&b), || {
            format!("batch {b} not in {lo}..=64 ({path:?})")
        })?;
        check(
            NAME,
            n > 0 && k > 0 && k.is_multiple_of(wt.k_align()),
            || format!("need N > 0 and K % {} == 0, got N {n} K {k}", wt.k_align()),
        )?;
        let tiles = n.div_ceil(GEMV_ROW_TILE);
        let splits = gemv_splits(self.info.sm_count as usize, tiles, k, wt, path);
        Ok(GemvPlan {
            wt,
            b,
            n,
            k,
            splits,
            path,
            ring: RingTune::default(),
        })
    }

    /// y = x W^T with FP8 weights: `w` u8 [N, K] e4m3, `scale` u8 UE8M0 [ceil(N/128), ceil(K/128)], `x`
    /// bf16 [B, K]. `plan.wt` must be [`GemvWeights::Fp8`].
    #[allow(clippy::too_many_arguments)]
    pub fn launch_gemv_fp8(
        &self,
        stream: &CudaStream,
        plan: &GemvPlan,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<u8>,
        scale: &impl DevicePtr<u8>,
        out: GemvOut<'_>,
        scratch: &mut GemvScratch,
    ) -> Result<()> {
        let (n, k) = (plan.n, plan.k);
        check(NAME, plan.wt == GemvWeights::Fp8, || {
            "plan is not FP8".into()
        })?;
        check(NAME, w.len() >= n * k, || {
            format!("w has {} bytes, need {}", w.len(), n * k)
        })?;
        let slen = n.div_ceil(128) * k.div_ceil(128);
        check(NAME, scale.len() >= slen, || {
            format!("scale has {} bytes, need {slen}", scale.len())
        })?;
        let (wp, sp) = (ptr(w, stream), ptr(scale, stream));
        self.gemv_single(stream, plan, x, wp, sp, out, scratch)
    }

    /// y = x W^T with bf16 weights `w` [N, K]; `plan.wt` must be [`GemvWeights::Bf16`].
    pub fn launch_gemv_bf16(
        &self,
        stream: &CudaStream,
        plan: &GemvPlan,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        out: GemvOut<'_>,
        scratch: &mut GemvScratch,
    ) -> Result<()> {
        check(NAME, plan.wt == GemvWeights::Bf16, || {
            "plan is not bf16".into()
        })?;
        check(NAME, w.len() >= plan.n * plan.k, || {
            format!("w has {} elements, need {}", w.len(), plan.n * plan.k)
        })?;
        let wp = ptr(w, stream);
        self.gemv_single(stream, plan, x, wp, 0, out, scratch)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemv_single(
        &self,
        stream: &CudaStream,
        plan: &GemvPlan,
        x: &impl DevicePtr<bf16>,
        w: u64,
        s: u64,
        out: GemvOut<'_>,
        scratch: &mut GemvScratch,
    ) -> Result<()> {
        let (b, n, k) = (plan.b, plan.n, plan.k);
        check(NAME, x.len() >= b * k && out.len >= b * n, || {
            format!(
                "x {} out {} too short for B {b} N {n} K {k}",
                x.len(),
                out.len
            )
        })?;
        let mut p = GemvParams {
            b: b as i32,
            k: i32::try_from(k).map_err(|_| shape_err("K exceeds i32"))?,
            nmax: i32::try_from(n).map_err(|_| shape_err("N exceeds i32"))?,
            out_bf16: out.bf16,
            ws: ptr_mut(&mut scratch.ws, stream),
            cnt: ptr_mut(&mut scratch.cnt, stream),
            ..Default::default()
        };
        (p.x[0], p.w[0], p.s[0], p.out[0], p.n[0]) = (ptr(x, stream), w, s, out.ptr, p.nmax);
        let (ws_len, cnt_len) = (scratch.ws.len(), scratch.cnt.len());
        let launch = GemvLaunch {
            wt: plan.wt,
            groups: 1,
            splits: plan.splits,
            path: plan.path,
            ring: plan.ring,
        };
        // SAFETY: x, w (+ scales), out were checked above to hold B*K, N*K (+ scale bytes) and B*N
        // elements; ws/cnt are the scratch's own buffers with their lengths.
        unsafe { self.launch_gemv_with(stream, launch, &p, ws_len, cnt_len) }
    }

    /// Grouped GEMV over the first `groups` entries of `p` on `path`, `splits` K splits (planned by
    /// [`gemv_splits`] for that path); `ws_len` / `cnt_len`: what `p.ws` / `p.cnt` hold.
    ///
    /// # Safety
    /// For g < groups: `p.x[g]` holds `b*k` bf16, `p.w[g]` `n[g]*k` weights (+ `p.s[g]` the UE8M0 scales for
    /// FP8), `p.out[g]` `b*n[g]` outputs; `p.ws` / `p.cnt` hold `ws_len` f32 / `cnt_len` zeroed u32.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_gemv_grouped(
        &self,
        s: &CudaStream,
        wt: GemvWeights,
        groups: usize,
        splits: usize,
        path: GemvPath,
        p: &GemvParams,
        ws_len: usize,
        cnt_len: usize,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            self.launch_gemv_grouped_tuned(
                s,
                wt,
                groups,
                splits,
                (path, RingTune::default()),
                p,
                ws_len,
                cnt_len,
            )
        }
    }

    /// [`GpuContext::launch_gemv_grouped`] with the ring's kernel choices (kbench).
    ///
    /// # Safety
    /// As [`GpuContext::launch_gemv_grouped`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_gemv_grouped_tuned(
        &self,
        s: &CudaStream,
        wt: GemvWeights,
        groups: usize,
        splits: usize,
        (path, ring): (GemvPath, RingTune),
        p: &GemvParams,
        ws_len: usize,
        cnt_len: usize,
    ) -> Result<()> {
        let launch = GemvLaunch {
            wt,
            groups,
            splits,
            path,
            ring,
        };
        // SAFETY: the caller's contract.
        unsafe { self.launch_gemv_with(s, launch, p, ws_len, cnt_len) }
    }

    /// # Safety
    /// As [`GpuContext::launch_gemv_grouped`].
    unsafe fn launch_gemv_with(
        &self,
        s: &CudaStream,
        l: GemvLaunch,
        p: &GemvParams,
        ws_len: usize,
        cnt_len: usize,
    ) -> Result<()> {
        let GemvLaunch {
            wt, groups, splits, ..
        } = l;
        let (b, k, nmax) = (p.b as usize, p.k as usize, p.nmax as usize);
        check_groups_and_scratch(NAME, p, (groups, splits), (ws_len, cnt_len))?;
        let (lo, splits_ok) = match l.path {
            GemvPath::Skinny => (1, splits >= 1),
            GemvPath::Ring => (RING_ROWS_MIN, ring_splits_ok(splits, k, wt)),
        };
        check(
            NAME,
            (lo..=64).contains(&b) && k > 0 && k.is_multiple_of(wt.k_align()) && splits_ok,
            || format!("gemv B {b} K {k} splits {splits} ({:?})", l.path),
        )?;
        // Batch tiles (gemv_tile.rs): the same bits, the counters checked for every (group, tile).
        let cnt_room = if splits > 1 { cnt_len } else { usize::MAX };
        let sms = self.info.sm_count as usize;
        let tiled_p = tiled_launch(
            p,
            (groups, splits),
            (l.path, l.ring.tile_rows),
            sms,
            cnt_room,
        );
        let (p, groups) = match &tiled_p {
            Some((q, g)) => (q, *g),
            None => (p, groups),
        };
        let b = p.b as usize;
        if l.path == GemvPath::Ring {
            // SAFETY: caller's contract; shapes and splits checked above (a tile's x and outputs lie inside
            // its group's, its workspace inside the launch's).
            return unsafe { self.launch_gemv_ring(s, wt, groups, splits, l.ring, p) };
        }
        let cfg = skinny_cfg(NAME, nmax, splits, groups)?;
        let f = match wt {
            GemvWeights::Fp8 => &self.kernels.gemv.fp8[nt_index(b)],
            GemvWeights::Bf16 => &self.kernels.gemv.bf16[nt_index(b)],
        };
        let mut a = Args::new();
        a.arg(p);
        // SAFETY: caller's contract; shapes checked above.
        unsafe { self.launch_k(s, f, cfg, &mut a) }
    }
}

/// One grouped launch's choices (see [`GpuContext::launch_gemv_grouped`]).
#[derive(Clone, Copy)]
struct GemvLaunch {
    wt: GemvWeights,
    groups: usize,
    splits: usize,
    path: GemvPath,
    ring: RingTune,
}

fn shape_err(what: &str) -> KernelError {
    KernelError::Shape {
        kernel: NAME,
        what: what.into(),
    }
}
