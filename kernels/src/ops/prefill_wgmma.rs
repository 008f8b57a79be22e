//! Launchers of the Hopper prefill GEMMs (`cuda/prefill_wgmma.cu`, wgmma, sm_90a only) and of the FP8 ->
//! bf16 weight dequantisation that feeds their bf16 variants.
use cudarc::driver::CudaStream;

use super::attn_launch::cfg;
use super::grid;
use super::prefill_params::{
    pf_wgmma_smem, PfDequant, PfWgmma, PF_BN, PF_GROUPS, PF_WGMMA_VARIANTS,
};
use crate::context::GpuContext;
use crate::error::{check, KernelError, Result};
use crate::module::ModuleSource;

const NAME: &str = "pf_wgmma";

/// Rows of one wgmma GEMM block (two warpgroups of 64).
pub const PF_WGMMA_BM: usize = 128;

impl GpuContext {
    /// Whether `launch_pf_wgmma` and `launch_pf_wgmma_fp4_expert` run here: a compute capability 9.0 device
    /// running the nvcc fatbin (whose sm_90a SASS holds the wgmma kernels; NVRTC's compute_90 PTX and the
    /// sm_120a SASS hold traps) with the shared memory of every instance granted (so any variant a caller
    /// picks can launch).
    pub fn has_wgmma(&self) -> bool {
        self.info.cc == (9, 0)
            && self.source == ModuleSource::Fatbin
            && self.kernels.prefill.wgmma_fits.iter().all(|&f| f)
            && self.kernels.prefill.wgmma_fp4_fits.iter().all(|&f| f)
    }

    /// Prefill GEMM over the first `groups` groups of `p` with instance `variant` of `PF_WGMMA_VARIANTS`: the
    /// cp.async rings on grid (ceil(M / 128), ceil(max n / 128), groups), the `ws` kernel on a persistent grid
    /// (prefill_wgmma_ws.rs).
    ///
    /// # Safety
    /// For g < groups: `p.x[g]` holds `M*K` bf16 and `p.w[g]` `n[g]*K` bf16 (both 16-byte aligned), `p.out[g]`
    /// `M*n[g]` f32 (or bf16 with `out_bf16`).
    pub unsafe fn launch_pf_wgmma(
        &self,
        s: &CudaStream,
        variant: usize,
        groups: usize,
        p: &PfWgmma,
    ) -> Result<()> {
        let fits = self.kernels.prefill.wgmma_fits.get(variant) == Some(&true);
        let Some(v) = PF_WGMMA_VARIANTS
            .get(variant)
            .filter(|_| fits && self.has_wgmma())
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
        let align = 8; // whole 16-byte chunks of bf16
        check(NAME, (1..=PF_GROUPS).contains(&groups), || {
            format!("groups {groups}")
        })?;
        check(NAME, p.m > 0 && p.k > 0 && k.is_multiple_of(align), || {
            format!("M {m} K {k} (K a multiple of {align})")
        })?;
        check(NAME, p.n[..groups].iter().all(|&n| n > 0), || {
            format!("n {:?}", &p.n[..groups])
        })?;
        check(
            NAME,
            p.x[..groups]
                .iter()
                .chain(&p.w[..groups])
                .all(|a| a % 16 == 0),
            || "x and W must be 16-byte aligned".to_string(),
        )?;
        let f = &self.kernels.prefill.wgmma[variant];
        if v.ws {
            // SAFETY: caller's contract; shapes and alignment checked above; sm_90a (has_wgmma).
            return unsafe { self.launch_pf_wgmma_ws(s, f, *v, groups, p) };
        }
        let nmax = p.n[..groups].iter().copied().max().unwrap_or(1) as usize;
        let c = cfg(
            (
                grid(NAME, m.div_ceil(PF_WGMMA_BM))?,
                grid(NAME, nmax.div_ceil(PF_BN))?,
                grid(NAME, groups)?,
            ),
            256,
            pf_wgmma_smem(*v),
        );
        // SAFETY: caller's contract; shapes checked above; the kernel is the sm_90a wgmma build (has_wgmma).
        unsafe { self.launch_one(s, f, c, p) }
    }

    /// Dequantises the first `groups` FP8 weights of `p` to bf16 (pf_fp8_to_bf16), any device.
    ///
    /// # Safety
    /// For g < groups: `p.w[g]` holds `n[g]*k` e4m3 bytes, `p.s[g]` `ceil(n[g]/128)*ceil(k/128)` UE8M0 bytes,
    /// `p.out[g]` room for `n[g]*k` bf16.
    pub unsafe fn launch_pf_fp8_to_bf16(
        &self,
        s: &CudaStream,
        groups: usize,
        p: &PfDequant,
    ) -> Result<()> {
        let k = p.k as usize;
        check("pf_fp8_to_bf16", (1..=PF_GROUPS).contains(&groups), || {
            format!("groups {groups}")
        })?;
        check(
            "pf_fp8_to_bf16",
            p.k > 0 && k.is_multiple_of(16) && p.n[..groups].iter().all(|&n| n > 0),
            || format!("k {k} (a multiple of 16), n {:?}", &p.n[..groups]),
        )?;
        let most = p.n[..groups].iter().copied().max().unwrap_or(1) as usize * k / 16;
        let c = cfg(
            (
                grid("pf_fp8_to_bf16", most.div_ceil(256))?,
                grid("pf_fp8_to_bf16", groups)?,
                1,
            ),
            256,
            0,
        );
        // SAFETY: caller's contract; shapes checked above.
        unsafe { self.launch_one(s, &self.kernels.prefill.fp8_to_bf16, c, p) }
    }
}
