//! Launchers of the routed FP4 experts on Hopper wgmma (`cuda/prefill_wgmma_fp4.cu`, sm_90a only), of the
//! K permutation (`pf_kperm`) that puts their inputs in the order the kernel sums K in, and of the SwiGLU that
//! writes w2's input in that order directly (`pf_swiglu_kperm`, `cuda/prefill_swiglu.cu`).
use cudarc::driver::CudaStream;

use super::attn_launch::cfg;
use super::grid;
use super::prefill_params::{pf_wgmma_fp4_smem, PfGemm, PfKperm, PfSwiglu, PF_BN, PF_GROUPS};
use crate::context::GpuContext;
use crate::error::{check, KernelError, Result};

const NAME: &str = "pf_wgmma_fp4_expert";

/// Most rows of one row tile of `pf_wgmma_fp4_expert` (its widest wgmma, m64n256).
pub const PF_WGMMA_FP4_BM: usize = 256;
/// Most rows of one row tile of `pf_wgmma_fp4_expert_s` (two blocks per SM, for short prompts).
pub const PF_WGMMA_FP4_SMALL_BM: usize = 64;

/// Columns of an input after `pf_kperm`: `k` rounded up to whole 128-wide chunks (the tail zero-filled).
pub fn pf_kperm_cols(k: usize) -> usize {
    k.div_ceil(128) * 128
}

impl GpuContext {
    /// Routed-expert GEMM over the first `groups` groups of `p` (the PfGemm of `launch_pf_gemm` in expert mode,
    /// x in the K order of `launch_pf_kperm`) on tiles grouped with `bm` rows: pf_wgmma_fp4_expert_s for
    /// `bm <= PF_WGMMA_FP4_SMALL_BM`, pf_wgmma_fp4_expert up to `PF_WGMMA_FP4_BM`; grid (ceil(max n / 128),
    /// `m_tiles`, groups).
    ///
    /// # Safety
    /// For g < groups: `p.x[g]` holds every row `order` names as `pf_kperm_cols(K)` bf16 written by
    /// `launch_pf_kperm`, `p.w[g]` / `p.s[g]` the experts' FP4 weights and scales in the device layouts,
    /// `p.out[g]` slots * n[g] outputs; `p.tiles` / `p.order` as written by `pf_moe_group` with this `bm` (a
    /// tile larger than the kernel's traps), `m_tiles` at least their tile count.
    pub unsafe fn launch_pf_wgmma_fp4_expert(
        &self,
        s: &CudaStream,
        bm: usize,
        groups: usize,
        m_tiles: usize,
        p: &PfGemm,
    ) -> Result<()> {
        if !self.has_wgmma() {
            return Err(KernelError::Unavailable {
                kernel: NAME,
                why: format!("cc {:?} with a {:?} module", self.info.cc, self.source),
            });
        }
        let k = p.k as usize;
        check(NAME, (1..=PF_WGMMA_FP4_BM).contains(&bm), || {
            format!("bm {bm}")
        })?;
        check(NAME, (1..=PF_GROUPS).contains(&groups), || {
            format!("groups {groups}")
        })?;
        check(NAME, k > 0 && k.is_multiple_of(32) && m_tiles > 0, || {
            format!("K {k} (a multiple of 32), tiles {m_tiles}")
        })?;
        check(
            NAME,
            p.n[..groups].iter().all(|&n| n > 0) && p.topk > 0,
            || format!("n {:?} topk {}", &p.n[..groups], p.topk),
        )?;
        let nmax = p.n[..groups].iter().copied().max().unwrap_or(1) as usize;
        let small = bm <= PF_WGMMA_FP4_SMALL_BM;
        let c = cfg(
            (
                grid(NAME, nmax.div_ceil(PF_BN))?,
                grid(NAME, m_tiles)?,
                grid(NAME, groups)?,
            ),
            256,
            pf_wgmma_fp4_smem(small),
        );
        let f = &self.kernels.prefill.wgmma_fp4[usize::from(small)];
        // SAFETY: caller's contract; shapes checked above; the kernel is the sm_90a build (has_wgmma).
        unsafe { self.launch_one(s, f, c, p) }
    }

    /// Writes `p.x` (`rows x k` bf16) into `p.out` (`rows x pf_kperm_cols(k)` bf16) in the K order of
    /// `pf_wgmma_fp4_expert`, any device.
    ///
    /// # Safety
    /// `p.x` holds `rows * k` bf16, `p.out` room for `rows * pf_kperm_cols(k)` bf16, not overlapping.
    pub unsafe fn launch_pf_kperm(&self, s: &CudaStream, p: &PfKperm) -> Result<()> {
        let (rows, k) = (p.rows as usize, p.k as usize);
        check(
            "pf_kperm",
            p.rows > 0 && p.k > 0 && k.is_multiple_of(32),
            || format!("rows {rows} k {k} (a multiple of 32)"),
        )?;
        let threads = rows * (k.div_ceil(128) * 4);
        let c = cfg((grid("pf_kperm", threads.div_ceil(256))?, 1, 1), 256, 0);
        // SAFETY: caller's contract; shapes checked above.
        unsafe { self.launch_one(s, &self.kernels.prefill.kperm, c, p) }
    }

    /// moe_swiglu (`launch_moe_swiglu`: `p.limit`, `p.quant` as `limit`, `quant` there; `p.wt` 0 for none)
    /// followed by `launch_pf_kperm` of its output, the same bits in one launch: `p.out` gets the SwiGLU of
    /// `p.g`, `p.u` (`slots x inter` f32) as `slots x pf_kperm_cols(inter)` bf16 in the K order of
    /// `pf_wgmma_fp4_expert`. `inter` a multiple of 32 (as for `launch_pf_kperm`), any device.
    ///
    /// # Safety
    /// `p.g` and `p.u` hold `slots * inter` f32, `p.wt` (if not 0) `slots` f32, `p.out` room for
    /// `slots * pf_kperm_cols(inter)` bf16, not overlapping the inputs; all 16-byte aligned.
    pub unsafe fn launch_pf_swiglu_kperm(&self, s: &CudaStream, p: &PfSwiglu) -> Result<()> {
        const SW: &str = "pf_swiglu_kperm";
        let (slots, inter) = (p.slots as usize, p.inter as usize);
        let chunks = slots * inter.div_ceil(128);
        check(
            SW,
            p.slots > 0 && p.inter > 0 && inter.is_multiple_of(32) && chunks < 1 << 31,
            || format!("slots {slots} inter {inter} (a multiple of 32)"),
        )?;
        // 8 warps a block, PFS_CHUNKS = 4 (slot, chunk) pairs a warp.
        let c = cfg((grid(SW, chunks.div_ceil(32))?, 1, 1), 256, 0);
        // SAFETY: caller's contract; shapes checked above.
        unsafe { self.launch_one(s, &self.kernels.prefill.swiglu_kperm, c, p) }
    }
}
