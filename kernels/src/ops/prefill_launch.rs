//! Launchers of the batched-prefill kernels (`cuda/prefill_*.cu`). They check each kernel's dimension limits;
//! the caller vouches for the device addresses inside the parameter blocks (hence `unsafe`).
use std::sync::OnceLock;

use cudarc::driver::CudaStream;

use super::attn_launch::cfg;
use super::prefill_params::*;
use super::{env_usize, grid, int};
use crate::context::GpuContext;
use crate::error::{check, Result};

const NAME: &str = "prefill";

/// Position of `d` in `dims`, or a shape error.
fn dim_index(dims: &[usize], d: usize, what: &str) -> Result<usize> {
    let i = dims.iter().position(|&x| x == d);
    check(NAME, i.is_some(), || {
        format!("{what} dim {d} not in {dims:?}")
    })?;
    Ok(i.unwrap_or(0))
}

impl GpuContext {
    /// Prefill GEMM (prefill_gemm.cu) over the first `groups` groups of `p`, with `bm`-row tiles (64 or 128).
    /// Dense: `m_tiles` = ceil(M / bm). Expert (`PfWeights::Fp4Expert`): `m_tiles` = the most row tiles
    /// `p.tiles` may hold (blocks past its count exit).
    ///
    /// # Safety
    /// For g < groups: `p.x[g]` holds the rows it reads (`M*K` bf16; expert mode: every row `order` names),
    /// `p.w[g]` / `p.s[g]` the weights and scales, `p.out[g]` the `M*n[g]` (expert: slots * n) outputs;
    /// expert mode: `p.tiles` / `p.order` as written by `pf_moe_group` for the same `bm`.
    pub unsafe fn launch_pf_gemm(
        &self,
        s: &CudaStream,
        wt: PfWeights,
        bm: usize,
        groups: usize,
        m_tiles: usize,
        p: &PfGemm,
    ) -> Result<()> {
        let k = p.k as usize;
        check(NAME, bm == 64 || bm == 128, || format!("gemm bm {bm}"))?;
        check(NAME, (1..=PF_GROUPS).contains(&groups), || {
            format!("gemm groups {groups}")
        })?;
        check(
            NAME,
            k > 0 && k.is_multiple_of(wt.k_align()) && m_tiles > 0,
            || format!("gemm K {k} (multiple of {}), tiles {m_tiles}", wt.k_align()),
        )?;
        check(NAME, p.n[..groups].iter().all(|&n| n > 0), || {
            format!("gemm n {:?}", &p.n[..groups])
        })?;
        let nmax = p.n[..groups].iter().copied().max().unwrap_or(1) as usize;
        let c = cfg(
            (
                grid(NAME, m_tiles)?,
                grid(NAME, nmax.div_ceil(PF_BN))?,
                grid(NAME, groups)?,
            ),
            256,
            pf_gemm_smem(bm),
        );
        let i = usize::from(bm == 128);
        let f = match wt {
            PfWeights::Bf16 => &self.kernels.prefill.gemm_bf16[i],
            PfWeights::Fp8 => &self.kernels.prefill.gemm_fp8[i],
            PfWeights::Fp4Expert => &self.kernels.prefill.gemm_fp4_expert[i],
        };
        // SAFETY: caller's contract; shapes checked above.
        unsafe { self.launch_one(s, f, c, p) }
    }

    /// Sparse attention of `p.rows` query rows with the preferred kernel kind (see [`Self::pf_attn_kind`]).
    ///
    /// # Safety
    /// Addresses as documented in prefill_attn.cu for `p.rows` rows.
    pub unsafe fn launch_pf_attn(&self, s: &CudaStream, p: &PfAttn) -> Result<()> {
        let kind = self.pf_attn_kind(p.dim as usize).unwrap_or(0);
        // SAFETY: caller's contract.
        unsafe { self.launch_pf_attn_kind(s, kind, p) }
    }

    /// The attention kernel kind (index into [`PF_ATTN_KINDS`]) prefill uses for head dim `dim`: `pf_attn2s3`
    /// (1.6x faster than `pf_attn` at 8K rows, as accurate over 8 token seeds: kernels/BENCH_NOTES.md, ninth
    /// session) where its shared memory is granted, else the first kind that fits; `DSV4_PF_ATTN=K` picks
    /// kind K where it fits (A/B runs; `0` is `pf_attn`). None: no kind fits.
    pub fn pf_attn_kind(&self, dim: usize) -> Option<usize> {
        static FORCED: OnceLock<Option<usize>> = OnceLock::new();
        let forced = *FORCED.get_or_init(|| env_usize("DSV4_PF_ATTN"));
        let d = PF_ATTN_DIMS.iter().position(|&x| x == dim)?;
        let fits = |k: usize| self.kernels.prefill.attn_fits.get(k).is_some_and(|f| f[d]);
        forced.into_iter().chain([1, 2, 0]).find(|&k| fits(k))
    }

    /// Sparse attention of `p.rows` query rows with kernel kind `kind` (prefill_attn.cu, prefill_attn_fa.cu).
    ///
    /// # Safety
    /// Addresses as documented in prefill_attn.cu for `p.rows` rows.
    pub unsafe fn launch_pf_attn_kind(
        &self,
        s: &CudaStream,
        kind: usize,
        p: &PfAttn,
    ) -> Result<()> {
        let (d, rdim) = (p.dim as usize, p.rdim as usize);
        let i = dim_index(&PF_ATTN_DIMS, d, "attention")?;
        check(NAME, kind < PF_ATTN_KINDS.len(), || {
            format!("attention kind {kind}")
        })?;
        let smem = pf_attn_smem(kind, d);
        check(NAME, self.kernels.prefill.attn_fits[kind][i], || {
            format!(
                "attention {} dim {d}: {smem} B of shared memory per block not available",
                PF_ATTN_KINDS[kind]
            )
        })?;
        check(
            NAME,
            rdim.is_multiple_of(2) && rdim <= 64 && rdim <= d && p.window > 0 && p.rows > 0,
            || format!("attention rdim {rdim} window {} rows {}", p.window, p.rows),
        )?;
        check(
            NAME,
            p.heads > 0 && p.groups > 0 && p.heads % p.groups == 0,
            || format!("attention heads {} groups {}", p.heads, p.groups),
        )?;
        let hg = (p.heads as usize).div_ceil(PF_ATTN_HEADS);
        let c = cfg(
            (grid(NAME, p.rows as usize)?, grid(NAME, hg)?, 1),
            256,
            smem,
        );
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, &self.kernels.prefill.attn[kind][i], c, p) }
    }

    /// Indexer scores of rows `p.row_begin .. p.row_begin + rows` with `splits` blocks per row.
    ///
    /// # Safety
    /// Addresses as documented in prefill_index.cu; `p.scores` holds `rows * p.cap` f32.
    pub unsafe fn launch_pf_index_score(
        &self,
        s: &CudaStream,
        splits: usize,
        rows: usize,
        p: &PfIndexScore,
    ) -> Result<()> {
        let i = dim_index(&PF_INDEX_DIMS, p.core.dim as usize, "indexer")?;
        check(
            NAME,
            p.core.heads > 0 && p.core.heads <= 64 && p.core.ratio > 0,
            || format!("indexer heads {} ratio {}", p.core.heads, p.core.ratio),
        )?;
        // Two rows per block (prefill_index.cu).
        let c = cfg(
            (grid(NAME, splits.max(1))?, grid(NAME, rows.div_ceil(2))?, 1),
            128,
            pf_index_smem(p.core.dim as usize),
        );
        let p = PfIndexScore {
            rows: int(NAME, "rows", rows)?,
            ..*p
        };
        // SAFETY: caller's contract; p.rows is the launch's row count.
        unsafe { self.launch_one(s, &self.kernels.prefill.index_score[i], c, &p) }
    }

    /// Pools `jobs` compressed entries (prefill_state.cu).
    ///
    /// # Safety
    /// `p.jobs` holds `jobs` x 4 ints; the other addresses as documented in prefill_state.cu.
    pub unsafe fn launch_pf_compress_pool(
        &self,
        s: &CudaStream,
        jobs: usize,
        p: &PfCompress,
    ) -> Result<()> {
        check(
            NAME,
            p.tail.dc > 0 && p.tail.dc <= 512 && p.tail.ratio > 0,
            || format!("compress dc {} ratio {}", p.tail.dc, p.tail.ratio),
        )?;
        if jobs == 0 {
            return Ok(());
        }
        let c = cfg((grid(NAME, jobs)?, 1, 1), 256, 0);
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, &self.kernels.prefill.compress_pool, c, p) }
    }

    /// Updates the compressor state rows of `segments` segments (prefill_state.cu).
    ///
    /// # Safety
    /// `p.jobs` holds `segments` x 4 ints (slot, row0, pos0, len); the rest as documented in prefill_state.cu.
    pub unsafe fn launch_pf_compress_state(
        &self,
        s: &CudaStream,
        segments: usize,
        p: &PfCompress,
    ) -> Result<()> {
        check(NAME, p.tail.dc > 0 && p.tail.ratio > 0, || {
            format!("compress dc {} ratio {}", p.tail.dc, p.tail.ratio)
        })?;
        let cells =
            p.tail.ratio as usize * p.tail.dc as usize * if p.tail.overlap != 0 { 2 } else { 1 };
        let c = cfg(
            (grid(NAME, segments)?, grid(NAME, cells.div_ceil(256))?, 1),
            256,
            0,
        );
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, &self.kernels.prefill.compress_state, c, p) }
    }

    /// Writes the window ring rows of `rows` rows (prefill_state.cu).
    ///
    /// # Safety
    /// Addresses as documented in prefill_state.cu for `rows` rows.
    pub unsafe fn launch_pf_ring_write(
        &self,
        s: &CudaStream,
        rows: usize,
        p: &PfRing,
    ) -> Result<()> {
        check(NAME, p.dim > 0 && p.dim % 8 == 0 && p.window > 0, || {
            format!("ring dim {} window {}", p.dim, p.window)
        })?;
        let c = cfg((grid(NAME, rows)?, 1, 1), 64, 0);
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, &self.kernels.prefill.ring_write, c, p) }
    }

    /// Groups `p.slots` expert slots into row tiles of `p.bm` (prefill_state.cu).
    ///
    /// # Safety
    /// `p.ids` holds `p.slots` ids < `p.experts`; `p.order` `p.slots` ints; `p.tiles` 1 + 3 x (the most tiles:
    /// ceil(slots / bm) + min(experts, slots)) ints.
    pub unsafe fn launch_pf_moe_group(&self, s: &CudaStream, p: &PfGroup) -> Result<()> {
        check(
            NAME,
            p.experts > 0 && p.experts as usize <= PF_GROUP_MAX_EXPERTS && p.bm > 0 && p.slots > 0,
            || format!("group experts {} bm {} slots {}", p.experts, p.bm, p.slots),
        )?;
        let c = cfg((1, 1, 1), 1024, 0);
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, &self.kernels.prefill.moe_group, c, p) }
    }
}

/// The most row tiles `pf_moe_group` can produce for `slots` slots over `experts` experts.
pub fn pf_max_tiles(slots: usize, experts: usize, bm: usize) -> usize {
    slots.div_ceil(bm) + experts.min(slots)
}
