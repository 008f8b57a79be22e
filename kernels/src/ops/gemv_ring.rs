//! The ring decode GEMVs (cuda/gemv_ring.cu, mma.sync; cuda/gemv_wg.cu, wgmma on sm_90a: see gemv_wg.rs): a
//! cp.async ring per block that stages x once per block. [`GemvPath`] picks the ring or gemv.cu's kernels by
//! the row count; each family has its own split-K rule (shape only, never the batch), so a row's bits do not
//! depend on the batch within a family (on one device: the wgmma and mma.sync rings differ in their bits).
use std::sync::OnceLock;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig};
use std::sync::Arc;

use super::gemv::{GemvParams, GemvWeights, RingTune, GEMV_GROUPS};
use super::{env_usize, grid};
use crate::context::GpuContext;
use crate::error::{KernelError, Result};
use crate::launch::Args;

const NAME: &str = "gemv_ring";

/// Most K splits of a ring launch (cuda GEMV_RING_SPLITS_MAX: the last block of a row tile sums them).
const SPLITS_MAX: usize = 8;
/// Weight rows per warp and row tile (a block holds 8 warps of MT tiles).
const WARP_ROWS: usize = 16;
/// Fewest rows the ring kernels take (the mma.sync ring runs 1-16 rows on its 2-tile kernel).
pub const RING_ROWS_MIN: usize = 1;
/// Default first row count on the ring (`DSV4_GEMV_RING_MIN` overrides it, 65 turns the ring off):
/// measured on the H200 in kernels/BENCH_NOTES.md (gemv-hybrid).
const RING_FROM_DEFAULT: usize = 17;

/// Which decode GEMV kernel family runs a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvPath {
    /// gemv.cu: 32-row blocks, weights straight into registers (fastest for 1-8 rows).
    Skinny,
    /// gemv_ring.cu: 128/256-row blocks with a shared-memory ring, x staged once per block.
    Ring,
}

impl GemvPath {
    /// The family for `rows` rows: the ring from [`RING_FROM_DEFAULT`] rows (or `DSV4_GEMV_RING_MIN`).
    pub fn for_rows(rows: usize) -> Self {
        if rows >= ring_from() {
            GemvPath::Ring
        } else {
            GemvPath::Skinny
        }
    }
}

fn ring_from() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| {
        env_usize("DSV4_GEMV_RING_MIN")
            .unwrap_or(RING_FROM_DEFAULT)
            .max(RING_ROWS_MIN)
    })
}

/// Ring split-K for `tiles` 32-row tiles (sum over groups) and inner dim `k`: about two 128-row blocks per
/// SM, at least two K steps per split, a power of two up to [`SPLITS_MAX`].
pub(crate) fn ring_splits(sms: usize, tiles: usize, k: usize, wt: GemvWeights) -> usize {
    let blocks = tiles.div_ceil(4).max(1);
    let cap = (k.div_ceil(wt.k_step()) / 2).clamp(1, SPLITS_MAX);
    let s = (2 * sms / blocks).clamp(1, cap);
    1 << s.ilog2()
}

/// Whether `splits` is one the ring kernels accept for inner dim `k`.
pub(crate) fn ring_splits_ok(splits: usize, k: usize, wt: GemvWeights) -> bool {
    splits.is_power_of_two() && splits <= SPLITS_MAX.min(k.div_ceil(wt.k_step()))
}

/// One ring kernel with its ring depth and occupancy.
#[derive(Debug, Clone)]
pub struct RingKernel {
    pub f: CudaFunction,
    /// Ring stages (2..=4): the most that fit the device's shared memory per block.
    pub depth: usize,
    /// Dynamic shared memory of one block at that depth.
    pub smem: usize,
    /// Resident blocks per SM.
    pub occupancy: usize,
}

/// `gemv_ring_{fp8,bf16}_nt{2,4,8}_mt{1,2}`, resolved once with the module: `[format][nt][mt]`.
#[derive(Debug, Clone)]
pub struct RingKernels {
    pub k: [[[RingKernel; 2]; 3]; 2],
}

const KERNEL_NAMES: [[[&str; 2]; 3]; 2] = [
    [
        ["gemv_ring_fp8_nt2_mt1", "gemv_ring_fp8_nt2_mt2"],
        ["gemv_ring_fp8_nt4_mt1", "gemv_ring_fp8_nt4_mt2"],
        ["gemv_ring_fp8_nt8_mt1", "gemv_ring_fp8_nt8_mt2"],
    ],
    [
        ["gemv_ring_bf16_nt2_mt1", "gemv_ring_bf16_nt2_mt2"],
        ["gemv_ring_bf16_nt4_mt1", "gemv_ring_bf16_nt4_mt2"],
        ["gemv_ring_bf16_nt8_mt1", "gemv_ring_bf16_nt8_mt2"],
    ],
];

/// Batch tiles of 8 (2, 4 or 8) of a ring launch of `rows` rows, as an index.
fn nt_slot(rows: usize) -> usize {
    match rows.div_ceil(8) {
        0..=2 => 0,
        3 | 4 => 1,
        _ => 2,
    }
}

/// Bytes of one ring stage: the block's weight rows x 128 B plus 8 NT activation rows (padded stride).
fn stage_bytes(fp8: bool, nt: usize, mt: usize) -> usize {
    let xs = if fp8 { 272 } else { 192 };
    8 * mt * WARP_ROWS * 128 + 8 * nt * xs
}

fn format_slot(wt: GemvWeights) -> usize {
    match wt {
        GemvWeights::Fp8 => 0,
        GemvWeights::Bf16 => 1,
    }
}

impl RingKernels {
    pub(crate) fn resolve(module: &Arc<CudaModule>) -> Result<Self> {
        let one = |fmt: usize, nt: usize, mt: usize| -> Result<RingKernel> {
            let name = KERNEL_NAMES[fmt][nt][mt];
            let f = super::kernel(module, name)?;
            // The deepest ring the device's shared memory takes (sm_120 has ~99 KB per block).
            for depth in [4usize, 3, 2] {
                let smem = depth * stage_bytes(fmt == 0, 2 << nt, mt + 1);
                let bytes = i32::try_from(smem).unwrap_or(i32::MAX);
                let attr =
                    CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                if f.set_attribute(attr, bytes).is_ok() {
                    let occupancy =
                        f.occupancy_max_active_blocks_per_multiprocessor(256, smem, None)?;
                    return Ok(RingKernel {
                        f,
                        depth,
                        smem,
                        occupancy: (occupancy as usize).max(1),
                    });
                }
            }
            Err(KernelError::Shape {
                kernel: NAME,
                what: format!("{name}: no ring depth fits the device's shared memory"),
            })
        };
        let nts = |fmt: usize| -> Result<[[RingKernel; 2]; 3]> {
            let mts =
                |nt: usize| -> Result<[RingKernel; 2]> { Ok([one(fmt, nt, 0)?, one(fmt, nt, 1)?]) };
            Ok([mts(0)?, mts(1)?, mts(2)?])
        };
        Ok(RingKernels {
            k: [nts(0)?, nts(1)?],
        })
    }

    fn get(&self, wt: GemvWeights, rows: usize, mt: usize) -> &RingKernel {
        &self.k[format_slot(wt)][nt_slot(rows)][mt.clamp(1, 2) - 1]
    }

    /// Rows per warp (16 or 32) for groups of `ns` rows at batch `b` with `splits`: fewer, larger blocks (x
    /// staged once for 256 rows) unless that costs a wave of blocks. Numerics do not depend on it.
    fn pick_mt(&self, wt: GemvWeights, b: usize, ns: &[usize], splits: usize, sms: usize) -> usize {
        let cost = |mt: usize| {
            let rows = 8 * WARP_ROWS * mt;
            let blocks: usize = ns.iter().map(|n| n.div_ceil(rows)).sum::<usize>() * splits;
            let waves = blocks.div_ceil(sms * self.get(wt, b, mt).occupancy);
            // Per wave a 256-row block streams twice the bytes; above 16 batch rows a 128-row block is bound
            // by its warps' x reads from shared memory, about 3/4 of a 256-row block's time (BENCH_NOTES, gemv8).
            let per_wave = match (mt, b > 16) {
                (2, _) => 8,
                (_, true) => 6,
                _ => 4,
            };
            waves * per_wave
        };
        let (c1, c2) = (cost(1), cost(2));
        if c2 < c1 || (c2 == c1 && b > 16) {
            2
        } else {
            1
        }
    }
}

impl GpuContext {
    /// Launches the ring kernel for `groups` groups of `p` with `splits` (checked by the caller against
    /// [`ring_splits_ok`]): the wgmma one where it runs (unless `tune.mma_sync`), else the mma.sync one.
    ///
    /// # Safety
    /// As [`GpuContext::launch_gemv_grouped`], whose checks the caller has made.
    pub(crate) unsafe fn launch_gemv_ring(
        &self,
        s: &CudaStream,
        wt: GemvWeights,
        groups: usize,
        splits: usize,
        tune: RingTune,
        p: &GemvParams,
    ) -> Result<()> {
        let (b, nmax) = (p.b as usize, p.nmax as usize);
        if let Some(kern) = self.wg_ring(wt, b).filter(|_| !tune.mma_sync) {
            // SAFETY: caller's contract.
            return unsafe { self.launch_gemv_wg(s, kern, tune.depth, (groups, splits), p) };
        }
        let mt = tune.mt;
        let ring = &self.kernels.gemv_ring;
        let mt = match mt {
            0 => {
                // A fixed array, not a Vec: nothing is allocated per launch on the decode path.
                let mut ns = [0usize; GEMV_GROUPS];
                for (d, &n) in ns.iter_mut().zip(&p.n[..groups]) {
                    *d = n.max(0) as usize;
                }
                ring.pick_mt(wt, b, &ns[..groups], splits, self.info.sm_count as usize)
            }
            m => m.clamp(1, 2),
        };
        let kern = ring.get(wt, b, mt);
        let cfg = LaunchConfig {
            grid_dim: (
                grid(NAME, nmax.div_ceil(8 * WARP_ROWS * mt))?,
                grid(NAME, splits)?,
                grid(NAME, groups)?,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: u32::try_from(kern.smem).unwrap_or(u32::MAX),
        };
        let depth = kern.depth as i32;
        let mut a = Args::new();
        a.arg(p).arg(&depth);
        // SAFETY: caller's contract; the kernel's dynamic shared memory was raised to kern.smem at resolve.
        unsafe { self.launch_k(s, &kern.f, cfg, &mut a) }
    }
}
