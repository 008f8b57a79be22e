//! The ring GEMVs on Hopper's warpgroup MMA (cuda/gemv_wg.cu, sm_90a only): the ring family's kernels where
//! they run (a cc 9.0 device with the nvcc fatbin), gemv_ring.cu's mma.sync kernels elsewhere. Same grid,
//! split-K rule and scratch as the mma.sync ring; one row tiling (128-row blocks of two warpgroups).
use std::sync::OnceLock;

use cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig};
use std::sync::Arc;

use super::gemv::{GemvParams, GemvWeights};
use super::{env_usize, grid, opt_in_smem};
use crate::context::{nt_index, GpuContext};
use crate::error::Result;
use crate::launch::Args;
use crate::module::ModuleSource;

const NAME: &str = "gemv_wg";

/// Weight rows of one block (gemv_wq8.rs's too).
pub(crate) const BLOCK_ROWS: usize = 128;
/// Deepest ring tried (the kernel's copy-group waits cover up to 6 stages).
const DEPTH_MAX: usize = 6;
/// Resident blocks per SM the default depth keeps (`DSV4_GEMV_WG_BLOCKS` overrides it).
const BLOCKS_DEFAULT: usize = 2;

const KERNEL_NAMES: [[&str; 4]; 2] = [
    [
        "gemv_wg_fp8_nt1",
        "gemv_wg_fp8_nt2",
        "gemv_wg_fp8_nt4",
        "gemv_wg_fp8_nt8",
    ],
    [
        "gemv_wg_bf16_nt1",
        "gemv_wg_bf16_nt2",
        "gemv_wg_bf16_nt4",
        "gemv_wg_bf16_nt8",
    ],
];

/// One wgmma ring kernel with its ring depth and occupancy.
#[derive(Debug, Clone)]
pub struct WgKernel {
    pub f: CudaFunction,
    /// Ring stages (2..=6).
    pub depth: usize,
    /// Dynamic shared memory of one block (the stages plus 1 KB of alignment slack).
    pub smem: usize,
    /// Resident blocks per SM.
    pub occupancy: usize,
    /// Bytes of one stage.
    pub stage: usize,
    /// The deepest ring the device takes (the shared memory the kernel was opted in for).
    pub depth_max: usize,
}

impl WgKernel {
    /// The launch of `(nmax rows, splits, groups)` with `depth` ring stages (0 or out of range: the default):
    /// 128-row blocks of 256 threads, the stages plus 1 KB of alignment slack; and the depth as passed to the
    /// kernel.
    pub(crate) fn launch_cfg(
        &self,
        name: &'static str,
        depth: usize,
        (nmax, splits, groups): (usize, usize, usize),
    ) -> Result<(LaunchConfig, i32)> {
        let depth = if (2..=self.depth_max).contains(&depth) {
            depth
        } else {
            self.depth
        };
        let cfg = LaunchConfig {
            grid_dim: (
                grid(name, nmax.div_ceil(BLOCK_ROWS))?,
                grid(name, splits)?,
                grid(name, groups)?,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: u32::try_from(depth * self.stage + 1024).unwrap_or(u32::MAX),
        };
        Ok((cfg, depth as i32))
    }
}

/// `gemv_wg_{fp8,bf16}_nt{1,2,4,8}`: `[format][nt slot]`; `None` where no ring depth fits the device.
#[derive(Debug, Clone)]
pub struct WgKernels {
    pub k: [[Option<WgKernel>; 4]; 2],
}

/// Bytes of one stage: the x tiles (FP8: two of 64 values a row, bf16: one), 1 KB per 8 batch columns each,
/// then the block's weight rows x 128 B.
fn stage_bytes(fp8: bool, nt: usize) -> usize {
    (if fp8 { 2 } else { 1 }) * nt * 1024 + BLOCK_ROWS * 128
}

impl WgKernels {
    /// Resolves every instance (traps outside the sm_90a SASS: [`GpuContext::wg_ring`] decides whether they
    /// run), each with [`resolve_ring`]'s depth.
    pub(crate) fn resolve(module: &Arc<CudaModule>) -> Result<Self> {
        let one = |fmt: usize, slot: usize| -> Result<Option<WgKernel>> {
            let f = super::kernel(module, KERNEL_NAMES[fmt][slot])?;
            resolve_ring(f, stage_bytes(fmt == 0, 1 << slot))
        };
        let fmt = |f: usize| -> Result<[Option<WgKernel>; 4]> {
            Ok([one(f, 0)?, one(f, 1)?, one(f, 2)?, one(f, 3)?])
        };
        Ok(WgKernels {
            k: [fmt(0)?, fmt(1)?],
        })
    }
}

/// A ring kernel of `stage` bytes a stage (gemv_wg.cu, gemv_wq8.cu) with the deepest ring that keeps
/// `DSV4_GEMV_WG_BLOCKS` (default 2) blocks per SM, or exactly `DSV4_GEMV_WG_DEPTH` stages when set (tuning
/// runs); `None` where no depth fits the device.
pub(crate) fn resolve_ring(f: CudaFunction, stage: usize) -> Result<Option<WgKernel>> {
    let want = env_usize("DSV4_GEMV_WG_BLOCKS")
        .unwrap_or(BLOCKS_DEFAULT)
        .max(1);
    let forced = env_usize("DSV4_GEMV_WG_DEPTH");
    let Some(depth_max) = (2..=DEPTH_MAX)
        .rev()
        .find(|d| opt_in_smem(&f, d * stage + 1024).is_ok())
    else {
        return Ok(None);
    };
    // Opted in for the deepest ring (launches may ask for less); the default: the deepest that keeps `want`
    // blocks per SM, else the deepest.
    opt_in_smem(&f, depth_max * stage + 1024)?;
    let mut best: Option<WgKernel> = None;
    for depth in (2..=depth_max).rev() {
        if forced.is_some_and(|d| d != depth) {
            continue;
        }
        let smem = depth * stage + 1024;
        let occupancy = f.occupancy_max_active_blocks_per_multiprocessor(256, smem, None)?;
        let k = WgKernel {
            f: f.clone(),
            depth,
            smem,
            occupancy: (occupancy as usize).max(1),
            stage,
            depth_max,
        };
        let enough = k.occupancy >= want;
        if best.is_none() || enough {
            best = Some(k);
        }
        if enough {
            break;
        }
    }
    Ok(best)
}

/// `DSV4_GEMV_WG=0` keeps the mma.sync ring on a device that could run the wgmma one (A/B runs).
fn wg_allowed() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var("DSV4_GEMV_WG").map_or(true, |v| v != "0"))
}

impl GpuContext {
    /// The wgmma ring kernel for `rows` rows of format `wt`, where it runs here: a cc 9.0 device with the nvcc
    /// fatbin (its sm_90a SASS; NVRTC's compute_90 PTX and the sm_120a SASS hold traps).
    pub fn wg_ring(&self, wt: GemvWeights, rows: usize) -> Option<&WgKernel> {
        if self.info.cc != (9, 0) || self.source != ModuleSource::Fatbin || !wg_allowed() {
            return None;
        }
        let fmt = usize::from(wt == GemvWeights::Bf16);
        self.kernels.gemv_wg.k[fmt][nt_index(rows)].as_ref()
    }

    /// Launches `kern` (from [`GpuContext::wg_ring`]) over `groups` groups of `p` with `splits` K splits and
    /// `depth` ring stages (0 or out of range: the kernel's default).
    ///
    /// # Safety
    /// As [`GpuContext::launch_gemv_grouped`], whose checks the caller has made.
    pub(crate) unsafe fn launch_gemv_wg(
        &self,
        s: &CudaStream,
        kern: &WgKernel,
        depth: usize,
        (groups, splits): (usize, usize),
        p: &GemvParams,
    ) -> Result<()> {
        let (cfg, depth) =
            kern.launch_cfg(NAME, depth, (p.nmax.max(1) as usize, splits, groups))?;
        let mut a = Args::new();
        a.arg(p).arg(&depth);
        // SAFETY: caller's contract; the kernel's dynamic shared memory was raised to that of depth_max stages at
        // resolve, and wg_ring only hands out kernels whose sm_90a build is loaded.
        unsafe { self.launch_k(s, &kern.f, cfg, &mut a) }
    }
}
