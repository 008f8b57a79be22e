//! The FP8-activation GEMVs (x as e4m3 codes with one power-of-two scale per 128 values: the official FP8
//! linear's input) and which of their two kernels a launch takes: gemv.cu's `gemv_fp8x` (f16 tensor-core MMAs on
//! the codes, 32-row blocks, the skinny split plan, 1-16 rows; every device from cc 8.9) or gemv_wq8.cu's wgmma
//! ring (sm_90a with the nvcc fatbin, 128-row blocks, the ring's split plan, 1-64 rows).
use std::sync::OnceLock;

use cudarc::driver::CudaStream;

use super::env_usize;
use super::gemv::{gemv_splits, skinny_cfg, GemvParams, GemvWeights};
use super::gemv_plan::check_groups_and_scratch;
use super::gemv_ring::GemvPath;
use super::gemv_wq8::{GemvQ8X, GEMV_Q8_BLOCK};
use crate::context::{nt_index, GpuContext};
use crate::error::{check, KernelError, Result};
use crate::launch::Args;

const NAME: &str = "gemv_fp8x";

/// The kernel of one FP8-activation GEMV launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Kernel {
    /// gemv.cu's gemv_fp8x_nt{1,2,4,8} (portable: cc 8.9 and later).
    MmaSync,
    /// gemv_wq8.cu's wgmma ring (sm_90a only).
    Wgmma,
}

impl Q8Kernel {
    /// The split-K plan of this kernel for `tiles` 32-row tiles (all groups) over inner dim `k`.
    pub fn splits(self, sms: usize, tiles: usize, k: usize) -> usize {
        let path = match self {
            Q8Kernel::MmaSync => GemvPath::Skinny,
            Q8Kernel::Wgmma => GemvPath::Ring,
        };
        gemv_splits(sms, tiles, k, GemvWeights::Fp8, path)
    }
}

/// Default fewest rows on an FP8-activation GEMV (`DSV4_GEMV_Q8_MIN` overrides it): every batch. Measured (H200,
/// full-size bench, same binary, 9 against 1, two rounds, ms per step, twenty-fifth session): batch 1 6.232 / 6.246
/// -> 6.168 / 6.148, 2 7.372 / 7.394 -> 7.290 / 7.283, 4 9.450 / 9.467 -> 9.360 / 9.342, 8 13.126 / 13.148 ->
/// 13.058 / 13.010 (gemv_fp8x at 1-8 rows: -0.6 to -1.3%); from 9 rows the wgmma ring had measured -1.2 to -1.6%
/// against the bf16-x kernels (twenty-third session).
const Q8_FROM_DEFAULT: usize = 1;

/// Fewest rows for which the engine takes an FP8-activation GEMV where one runs.
pub fn gemv_q8_min_rows() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| {
        env_usize("DSV4_GEMV_Q8_MIN")
            .unwrap_or(Q8_FROM_DEFAULT)
            .max(1)
    })
}

/// Most rows gemv_fp8x takes (its two batch-tile widths, NT 1-2).
pub const FP8X_MAX_ROWS: usize = 16;

/// Most rows on gemv_fp8x where the wgmma ring also runs (`DSV4_GEMV_Q8S_MAX` overrides it). kbench gemv-q8
/// (H200, us, gemv_fp8x against the planned bf16-x gemv.cu launch): 1-8 rows wq_b + iwq_b 14.0-14.7 against
/// 15.6-16.0, wo_b 13.3 against 15.4-16.1; at 9-16 rows the wgmma ring is faster (wq_b + iwq_b 17.1 against 21.4,
/// wo_b 14.7 against 16.2).
const SYNC_MAX_DEFAULT: usize = 8;

fn sync_max_rows() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| env_usize("DSV4_GEMV_Q8S_MAX").unwrap_or(SYNC_MAX_DEFAULT))
}

/// `DSV4_GEMV_Q8=0` keeps the bf16-x kernels everywhere (A/B runs).
pub(crate) fn q8_allowed() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var("DSV4_GEMV_Q8").map_or(true, |v| v != "0"))
}

impl GpuContext {
    /// Whether gemv_fp8x runs here (its F2FP needs cc 8.9).
    pub fn gemv_fp8x_runs(&self) -> bool {
        self.info.cc >= (8, 9) && q8_allowed()
    }

    /// The FP8-activation kernel for a launch of `rows` rows (1..=64) here, if any: gemv_fp8x up to
    /// `DSV4_GEMV_Q8S_MAX` rows, then the wgmma ring where it runs; where it does not (sm_120, the NVRTC build),
    /// gemv_fp8x up to [`FP8X_MAX_ROWS`] and none beyond (the bf16-x rings are faster there).
    pub fn gemv_q8_kernel(&self, rows: usize) -> Option<Q8Kernel> {
        if !(1..=64).contains(&rows) {
            return None;
        }
        let sync = self.gemv_fp8x_runs() && rows <= FP8X_MAX_ROWS;
        if sync && rows <= sync_max_rows() {
            return Some(Q8Kernel::MmaSync);
        }
        if self.wq8_ring(rows).is_some() {
            return Some(Q8Kernel::Wgmma);
        }
        sync.then_some(Q8Kernel::MmaSync)
    }

    /// y = dequant(xq) W^T over the first `groups` groups on `kernel` (from [`GpuContext::gemv_q8_kernel`]):
    /// `p` as for [`GpuContext::launch_gemv_grouped`] with FP8 weights (its `x` unused), `q` the e4m3 inputs;
    /// `splits` from [`Q8Kernel::splits`].
    ///
    /// # Safety
    /// As [`GpuContext::launch_gemv_wq8`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_gemv_q8(
        &self,
        s: &CudaStream,
        kernel: Q8Kernel,
        (groups, splits): (usize, usize),
        p: &GemvParams,
        q: &GemvQ8X,
        ws_len: usize,
        cnt_len: usize,
    ) -> Result<()> {
        match kernel {
            // SAFETY: the caller's contract.
            Q8Kernel::Wgmma => unsafe {
                self.launch_gemv_wq8(s, (groups, splits, 0), p, q, ws_len, cnt_len)
            },
            // SAFETY: the caller's contract.
            Q8Kernel::MmaSync => unsafe {
                self.launch_gemv_fp8x(s, (groups, splits), p, q, ws_len, cnt_len)
            },
        }
    }

    /// gemv.cu's gemv_fp8x_nt{1,2}: grid (row tiles of 32, splits, groups), 1..=[`FP8X_MAX_ROWS`] rows.
    ///
    /// # Safety
    /// As [`GpuContext::launch_gemv_wq8`].
    unsafe fn launch_gemv_fp8x(
        &self,
        s: &CudaStream,
        (groups, splits): (usize, usize),
        p: &GemvParams,
        q: &GemvQ8X,
        ws_len: usize,
        cnt_len: usize,
    ) -> Result<()> {
        let (b, k, nmax) = p.dims();
        if !self.gemv_fp8x_runs() {
            return Err(KernelError::Shape {
                kernel: NAME,
                what: format!("needs cc 8.9 or later (this device: {:?})", self.info.cc),
            });
        }
        check_groups_and_scratch(NAME, p, (groups, splits), (ws_len, cnt_len))?;
        check(
            NAME,
            (1..=FP8X_MAX_ROWS).contains(&b)
                && k > 0
                && k.is_multiple_of(GEMV_Q8_BLOCK)
                && splits >= 1,
            || format!("B {b} K {k} splits {splits} (K % {GEMV_Q8_BLOCK} == 0)"),
        )?;
        let cfg = skinny_cfg(NAME, nmax, splits, groups)?;
        let f = &self.kernels.gemv.fp8x[nt_index(b)];
        let mut a = Args::new();
        a.arg(p).arg(q);
        // SAFETY: caller's contract; shapes, splits and scratch checked above.
        unsafe { self.launch_k(s, f, cfg, &mut a) }
    }
}
