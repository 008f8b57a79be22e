//! Launcher of the Hopper FP8 prefill GEMM (`cuda/prefill_wgmma.cu`, wgmma e4m3, sm_90a only).
use cudarc::driver::CudaStream;

use super::attn_launch::cfg;
use super::grid;
use super::prefill_params::{pf_wgmma_smem, PfWgmma, PF_BN, PF_GROUPS, PF_WGMMA_VARIANTS};
use crate::context::GpuContext;
use crate::error::{check, KernelError, Result};
use crate::module::ModuleSource;

const NAME: &str = "pf_wgmma";

/// Rows of one wgmma GEMM block (two warpgroups of 64).
pub const PF_WGMMA_BM: usize = 128;

impl GpuContext {
    /// Whether `launch_pf_wgmma` runs here: a compute capability 9.0 device running the nvcc fatbin (whose
    /// sm_90a SASS holds the wgmma kernels; NVRTC's compute_90 PTX and the sm_120a SASS hold traps) with the
    /// shared memory of the 4-stage instance granted.
    pub fn has_wgmma(&self) -> bool {
        self.info.cc == (9, 0)
            && self.source == ModuleSource::Fatbin
            && self.kernels.prefill.wgmma_fits[0]
    }

    /// FP8 x FP8 prefill GEMM over the first `groups` groups of `p` with instance `variant` of
    /// `PF_WGMMA_VARIANTS`, grid (ceil(M / 128), ceil(max n / 128), groups).
    ///
    /// # Safety
    /// For g < groups: `p.xq[g]` holds `M*K` e4m3 bytes and `p.xs[g]` `M*ceil(K/128)` f32 scales, `p.w[g]`
    /// `n[g]*K` e4m3 bytes and `p.s[g]` `ceil(n[g]/128)*ceil(K/128)` UE8M0 bytes, `p.out[g]` `M*n[g]` f32 (or
    /// bf16 with `out_bf16`).
    pub unsafe fn launch_pf_wgmma(
        &self,
        s: &CudaStream,
        variant: usize,
        groups: usize,
        p: &PfWgmma,
    ) -> Result<()> {
        let fits = self.kernels.prefill.wgmma_fits.get(variant) == Some(&true);
        let Some(&(stages, _)) = PF_WGMMA_VARIANTS.get(variant).filter(|_| fits && self.has_wgmma())
        else {
            return Err(KernelError::Unavailable {
                kernel: NAME,
                why: format!(
                    "variant {variant} on cc {:?} with a {:?} module",
                    self.info.cc, self.source
                ),
            });
        };
        let (m, k) = (p.m as usize, p.k as usize);
        check(NAME, (1..=PF_GROUPS).contains(&groups), || {
            format!("groups {groups}")
        })?;
        check(
            NAME,
            p.m > 0 && p.k > 0 && k.is_multiple_of(16),
            || format!("M {m} K {k} (K a multiple of 16)"),
        )?;
        check(NAME, p.n[..groups].iter().all(|&n| n > 0), || {
            format!("n {:?}", &p.n[..groups])
        })?;
        let nmax = p.n[..groups].iter().copied().max().unwrap_or(1) as usize;
        let c = cfg(
            (
                grid(NAME, m.div_ceil(PF_WGMMA_BM))?,
                grid(NAME, nmax.div_ceil(PF_BN))?,
                grid(NAME, groups)?,
            ),
            256,
            pf_wgmma_smem(stages),
        );
        // SAFETY: caller's contract; shapes checked above; the kernel is the sm_90a wgmma build (has_wgmma).
        unsafe { self.launch_one(s, &self.kernels.prefill.wgmma[variant], c, p) }
    }
}
