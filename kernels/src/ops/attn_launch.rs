//! Launchers of the attention kernels (`cuda/attn_*.cu`). They check the dimension limits of each kernel;
//! the caller vouches for the device addresses inside the parameter blocks (hence `unsafe`).
use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig};

use super::attn_params::*;
use super::{env_usize, grid};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "attn";

pub(super) fn cfg(grid_dim: (u32, u32, u32), threads: u32, smem: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: u32::try_from(smem).unwrap_or(u32::MAX),
    }
}

impl GpuContext {
    /// Launches `f` with the single by-value argument `p`.
    ///
    /// # Safety
    /// `p` must match the kernel's parameter struct and every address in it must be valid for the grid.
    pub(super) unsafe fn launch_one<P: DeviceRepr>(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        c: LaunchConfig,
        p: &P,
    ) -> Result<()> {
        let mut l = Args::new();
        l.arg(p);
        // SAFETY: forwarded from the caller (parameter block matches the kernel, addresses valid).
        unsafe { self.launch_k(stream, f, c, &mut l) }
    }
}

fn pos_i32(what: &'static str, v: i32) -> Result<()> {
    check(NAME, v > 0, || format!("{what} = {v} must be positive"))
}

impl GpuContext {
    /// A row preparation (attn_prep.cu). Launches of at least [`ROW_QUANT_MIN_ROWS`] rows whose 128-value quant
    /// blocks (or none) stay inside a group take a warp per block of 128 values: attn_row_quant without a norm,
    /// attn_row_norm_quant with one (one f32 group up to [`ROW_NORM_QUANT_MAX`] wide); the others attn_row_prep.
    /// The same bits either way.
    ///
    /// # Safety
    /// `p.x` holds `groups*rows*width` values, `p.out` `rows*groups*width` bf16, `p.norm_w` (if set) the row.
    pub unsafe fn launch_attn_row_prep(&self, s: &CudaStream, p: &AttnRowPrep) -> Result<()> {
        let wide = p.rows as usize >= row_quant_min();
        // SAFETY: caller's contract.
        unsafe { self.launch_attn_row_prep_on(s, p, wide) }
    }

    /// [`Self::launch_attn_row_prep`], allowed (`wide`) or not to take attn_row_quant or attn_row_norm_quant
    /// (tests compare them).
    ///
    /// # Safety
    /// As [`Self::launch_attn_row_prep`].
    pub unsafe fn launch_attn_row_prep_on(
        &self,
        s: &CudaStream,
        p: &AttnRowPrep,
        wide: bool,
    ) -> Result<()> {
        pos_i32("rows", p.rows)?;
        let n = (p.groups as usize) * (p.width as usize);
        check(NAME, n > 0 && n <= ROW_PREP_MAX, || {
            format!("row_prep row {n}")
        })?;
        let kernel = row_prep_kernel(p, wide);
        check(
            NAME,
            p.q8 == 0 || (kernel != RowPrepKernel::General && p.quant_blk == 128),
            || {
                "row_prep: FP8 codes need 128-value quant blocks on attn_row_quant / attn_row_norm_quant".into()
            },
        )?;
        let k = &self.kernels.attn;
        let (f, c) = match kernel {
            RowPrepKernel::Quant => {
                let warps = (p.rows as usize) * (n / 128);
                (
                    &k.row_quant,
                    cfg((grid(NAME, warps.div_ceil(8))?, 1, 1), 256, 0),
                )
            }
            RowPrepKernel::NormQuant => (
                &k.row_norm_quant,
                cfg((grid(NAME, p.rows as usize)?, 1, 1), 256, 0),
            ),
            RowPrepKernel::General => {
                // Without a norm the row is cut into 1024-wide pieces (whole quant blocks, see attn_prep.cu).
                let pieces = if p.norm_w == 0 { n.div_ceil(1024) } else { 1 };
                (
                    &k.row_prep,
                    cfg(
                        (grid(NAME, p.rows as usize)?, grid(NAME, pieces)?, 1),
                        256,
                        0,
                    ),
                )
            }
        };
        // SAFETY: caller's contract; row_prep_kernel only picks the warp-per-block kernels for whole 128-value
        // blocks (and, with a norm, one aligned f32 group of at most ROW_NORM_QUANT_MAX values); q8 only there.
        unsafe { self.launch_one(s, f, c, p) }
    }

    /// Whether [`Self::launch_attn_row_prep`] can also write `p`'s FP8 codes (`p.q8`): 128-value quant blocks on
    /// one of the warp-per-block kernels (its row count, shape and alignment).
    pub fn row_prep_q8_ok(&self, p: &AttnRowPrep) -> bool {
        p.quant_blk == 128
            && row_prep_kernel(p, p.rows as usize >= row_quant_min()) != RowPrepKernel::General
    }

    /// Up to [`VEC_PREP_JOBS`] vector preparations in one launch; job j = (nvec, parameters). Launches of
    /// fewer than [`VEC_PREP_WIDE_MIN_ROWS`] rows (`DSV4_VEC_PREP_WIDE_MIN` overrides it, for measuring) take
    /// the block-per-vector kernel, the others the warp-per-vector one (the same bits).
    ///
    /// # Safety
    /// For each job: `p.x` holds `rows` rows of `x_stride` f32; `p.positions` (and `p.slots` in ring mode)
    /// `rows` ints; `p.out` the `[rows, nvec, dim]` output or the ring; `p.freqs` `rdim/2` f32.
    pub unsafe fn launch_attn_vec_prep(
        &self,
        s: &CudaStream,
        rows: usize,
        jobs: &[(usize, AttnVecPrep)],
    ) -> Result<()> {
        let kind = if rows >= vec_prep_wide_min() {
            VecPrepKernel::WarpPerVector
        } else {
            VecPrepKernel::BlockPerVector
        };
        // SAFETY: caller's contract.
        unsafe { self.launch_attn_vec_prep_on(s, rows, jobs, kind) }
    }

    /// [`Self::launch_attn_vec_prep`] on a chosen kernel (tests compare the two).
    ///
    /// # Safety
    /// As [`Self::launch_attn_vec_prep`].
    pub unsafe fn launch_attn_vec_prep_on(
        &self,
        s: &CudaStream,
        rows: usize,
        jobs: &[(usize, AttnVecPrep)],
        kind: VecPrepKernel,
    ) -> Result<()> {
        check(NAME, (1..=VEC_PREP_JOBS).contains(&jobs.len()), || {
            format!("vec_prep jobs {}", jobs.len())
        })?;
        let per_block = match kind {
            VecPrepKernel::WarpPerVector => VEC_PREP_PER_BLOCK,
            VecPrepKernel::BlockPerVector => 1,
        };
        let mut p = AttnVecPrepJobs {
            njobs: jobs.len() as i32,
            ..Default::default()
        };
        let mut blocks = 0;
        for (j, (nvec, job)) in jobs.iter().enumerate() {
            check(
                NAME,
                job.dim > 0 && job.dim as usize <= VEC_MAX && *nvec > 0,
                || format!("vec_prep dim {} nvec {nvec}", job.dim),
            )?;
            p.job[j] = *job;
            p.nvec[j] = i32::try_from(*nvec).unwrap_or(i32::MAX);
            blocks += nvec.div_ceil(per_block);
        }
        let c = cfg((grid(NAME, blocks)?, grid(NAME, rows)?, 1), 128, 0);
        let f = match kind {
            VecPrepKernel::WarpPerVector => &self.kernels.attn.vec_prep,
            VecPrepKernel::BlockPerVector => &self.kernels.attn.vec_prep_small,
        };
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, f, c, &p) }
    }

    /// Up to [`COMPRESS_JOBS`] compressors in one launch.
    ///
    /// # Safety
    /// Addresses of every job as documented in attn_compress.cu for `rows` rows (distinct slots).
    pub unsafe fn launch_attn_compress(
        &self,
        s: &CudaStream,
        rows: usize,
        jobs: &[AttnCompress],
    ) -> Result<()> {
        check(NAME, (1..=COMPRESS_JOBS).contains(&jobs.len()), || {
            format!("compress jobs {}", jobs.len())
        })?;
        let mut p = AttnCompressJobs {
            njobs: jobs.len() as i32,
            ..Default::default()
        };
        for (j, job) in jobs.iter().enumerate() {
            check(
                NAME,
                job.tail.dc > 0 && job.tail.dc as usize <= VEC_MAX,
                || format!("compress dc {}", job.tail.dc),
            )?;
            pos_i32("ratio", job.tail.ratio)?;
            p.job[j] = *job;
        }
        let c = cfg((grid(NAME, rows)?, grid(NAME, jobs.len())?, 1), 256, 0);
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, &self.kernels.attn.compress, c, &p) }
    }

    /// # Safety
    /// Addresses as documented in attn_index.cu for `rows` rows.
    pub unsafe fn launch_attn_index_score(
        &self,
        s: &CudaStream,
        splits: usize,
        rows: usize,
        p: &AttnIndexScore,
    ) -> Result<()> {
        let (h, d) = (p.core.heads as usize, p.core.dim as usize);
        check(NAME, h > 0 && h <= INDEX_MAX_HEADS, || {
            format!("index heads {h}")
        })?;
        check(
            NAME,
            d > 0 && d <= INDEX_MAX_DIM && d.is_multiple_of(32),
            || format!("index dim {d}"),
        )?;
        // 4 warps of 16 entries per block: more blocks than cap / 64 would find no work.
        let blocks = splits.min((p.core.cap.max(1) as usize).div_ceil(64)).max(1);
        let c = cfg((grid(NAME, blocks)?, grid(NAME, rows)?, 1), 128, 0);
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, &self.kernels.attn.index_score, c, p) }
    }

    /// # Safety
    /// Addresses as documented in attn_topk.cu for `rows` rows; `p.sel` holds `rows*k` ints.
    pub unsafe fn launch_attn_index_topk(
        &self,
        s: &CudaStream,
        rows: usize,
        p: &AttnIndexTopk,
    ) -> Result<()> {
        check(NAME, p.k > 0 && p.k as usize <= TOPK_MAX, || {
            format!("topk {}", p.k)
        })?;
        let c = cfg((grid(NAME, rows)?, 1, 1), 1024, 0);
        // SAFETY: caller's contract; the kernel's shared memory is static.
        unsafe { self.launch_one(s, &self.kernels.attn.index_topk, c, p) }
    }

    /// # Safety
    /// Addresses as documented in attn_sparse.cu for `rows` rows and `splits` splits.
    pub unsafe fn launch_attn_sparse_partial(
        &self,
        s: &CudaStream,
        splits: usize,
        rows: usize,
        p: &AttnSparse,
    ) -> Result<()> {
        let d = p.dim as usize;
        check(NAME, d > 0 && d.is_multiple_of(64) && d <= VEC_MAX, || {
            format!("sparse dim {d}")
        })?;
        check(NAME, (1..=SPLITS_MAX).contains(&splits), || {
            format!("splits {splits}")
        })?;
        let hg = (p.heads as usize).div_ceil(SPARSE_HEADS_PER_BLOCK);
        let c = cfg(
            (grid(NAME, splits)?, grid(NAME, hg)?, grid(NAME, rows)?),
            128,
            sparse_smem_bytes(d),
        );
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, &self.kernels.attn.sparse_partial, c, p) }
    }

    /// # Safety
    /// Addresses as documented in attn_sparse.cu for `p.rows` rows.
    pub unsafe fn launch_attn_sparse_merge(&self, s: &CudaStream, p: &AttnMerge) -> Result<()> {
        // One thread per 4 channels (8-byte stores), rope pairs inside a thread's 4: dim % 4 == 0, rdim even.
        check(
            NAME,
            p.dim > 0 && p.dim % 4 == 0 && p.dim as usize <= VEC_MAX,
            || format!("merge dim {}", p.dim),
        )?;
        check(
            NAME,
            p.rdim >= 0 && p.rdim % 2 == 0 && p.rdim <= p.dim,
            || format!("merge rope dim {} of {}", p.rdim, p.dim),
        )?;
        check(
            NAME,
            p.splits > 0 && p.splits as usize <= SPLITS_MAX,
            || format!("splits {}", p.splits),
        )?;
        check(NAME, p.groups > 0 && p.heads % p.groups == 0, || {
            format!("heads {} groups {}", p.heads, p.groups)
        })?;
        let c = cfg(
            (
                grid(NAME, p.heads as usize)?,
                grid(NAME, p.rows as usize)?,
                1,
            ),
            128,
            0,
        );
        // SAFETY: caller's contract.
        unsafe { self.launch_one(s, &self.kernels.attn.sparse_merge, c, p) }
    }

    /// # Safety
    /// `ptr` holds `n` f32.
    pub unsafe fn launch_attn_fill_f32(
        &self,
        s: &CudaStream,
        ptr: u64,
        n: usize,
        value: f32,
    ) -> Result<()> {
        let blocks = n.div_ceil(256).clamp(1, 4096);
        let c = cfg((grid(NAME, blocks)?, 1, 1), 256, 0);
        let n64 = n as u64;
        let mut l = Args::new();
        l.arg(&ptr).arg(&n64).arg(&value);
        // SAFETY: attn_fill_f32(p, n, value); the caller guarantees ptr holds n f32.
        unsafe { self.launch_k(s, &self.kernels.attn.fill_f32, c, &mut l) }?;
        Ok(())
    }

    /// Fills `n` elements at `ptr` with synthetic weights of `kind` (see attn_misc.cu).
    ///
    /// # Safety
    /// `ptr` holds `n` elements of the kind's type (u8 for kinds 0-1, bf16 for 2, f32 for 3-4).
    pub unsafe fn launch_attn_synth(
        &self,
        s: &CudaStream,
        ptr: u64,
        n: usize,
        kind: i32,
        seed: u64,
        amp: f32,
    ) -> Result<()> {
        let blocks = n.div_ceil(256).clamp(1, 8192);
        let c = cfg((grid(NAME, blocks)?, 1, 1), 256, 0);
        let n64 = n as u64;
        let mut l = Args::new();
        l.arg(&ptr).arg(&n64).arg(&kind).arg(&seed).arg(&amp);
        // SAFETY: attn_synth(p, n, kind, seed, amp); the caller guarantees ptr holds n elements of the kind.
        unsafe { self.launch_k(s, &self.kernels.attn.synth, c, &mut l) }?;
        Ok(())
    }
}

/// First row count of the warp-per-vector vec_prep. Batch 64 decode: 48.9 ms per step against 49.2-49.3 with
/// the block-per-vector kernel (kernels/BENCH_NOTES.md, eleventh session); at 8192 rows 52 against 111 ms.
const VEC_PREP_WIDE_MIN_ROWS: usize = 64;

/// First row count of the warp-per-block row preparations (`attn_row_quant`, `attn_row_norm_quant`). At one
/// row too they beat attn_row_prep's shared row: the wo_b input (8192 wide, no norm) and the q_lora norm at batch
/// 1 / 8 / 64, same binary, `DSV4_ROW_QUANT_MIN` 128 / 1, ms per step 6.320-6.373 -> 6.208-6.215 (-2.0%, three
/// rounds) / 13.495-13.548 -> 13.077-13.142 (-2.9%) / 42.40-42.48 -> 42.31-42.52 (level); the wo_b input alone
/// gave -0.8% / -1.4% (kernels/BENCH_NOTES.md, twentieth session).
const ROW_QUANT_MIN_ROWS: usize = 1;

/// Widest row of `attn_row_norm_quant` (256 threads x RNQ_U values in attn_prep.cu).
const ROW_NORM_QUANT_MAX: usize = 2048;

/// [`ROW_QUANT_MIN_ROWS`], or `DSV4_ROW_QUANT_MIN`.
fn row_quant_min() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_usize("DSV4_ROW_QUANT_MIN").unwrap_or(ROW_QUANT_MIN_ROWS))
}

/// [`VEC_PREP_WIDE_MIN_ROWS`], or `DSV4_VEC_PREP_WIDE_MIN`.
fn vec_prep_wide_min() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_usize("DSV4_VEC_PREP_WIDE_MIN").unwrap_or(VEC_PREP_WIDE_MIN_ROWS))
}

/// The row-preparation kernel a launch takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RowPrepKernel {
    /// attn_row_quant: no norm, whole 128-value blocks per group.
    Quant,
    /// attn_row_norm_quant: a norm over one f32 group of whole 128-value blocks.
    NormQuant,
    /// attn_row_prep: anything else.
    General,
}

/// attn_row_quant / attn_row_norm_quant where `wide` allows them and the shape and alignment do: whole
/// 128-value blocks; attn_row_quant loads 4 values (16 or 8 bytes) and stores 4 bf16 (8 bytes) at once;
/// attn_row_norm_quant also one f32 group of at most ROW_NORM_QUANT_MAX values and 16-byte aligned weights.
fn row_prep_kernel(p: &AttnRowPrep, wide: bool) -> RowPrepKernel {
    let n = (p.groups.max(0) as usize) * (p.width.max(0) as usize);
    let blocks_of_128 = p.width % 128 == 0 && matches!(p.quant_blk, 0 | 128);
    let aligned = p.x.is_multiple_of(if p.x_f32 != 0 { 16 } else { 8 })
        && p.out.is_multiple_of(8)
        && p.q8.is_multiple_of(4);
    if !(wide && blocks_of_128 && aligned) {
        return RowPrepKernel::General;
    }
    if p.norm_w == 0 {
        return RowPrepKernel::Quant;
    }
    let norm_rows = p.groups == 1 && p.x_f32 != 0 && n <= ROW_NORM_QUANT_MAX;
    if norm_rows && p.norm_w.is_multiple_of(16) {
        RowPrepKernel::NormQuant
    } else {
        RowPrepKernel::General
    }
}
