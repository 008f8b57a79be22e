//! Parameter blocks of the attention kernels (`cuda/attn_*.cu`), passed by value as one kernel argument.
//!
//! Each struct mirrors the C struct of the same name field by field (`#[repr(C)]`; pointers as u64 device
//! addresses first, then 4-byte fields, padded to a multiple of 8 bytes). The launchers in
//! [`super::attn_launch`] are `unsafe`: the caller guarantees every address is valid for what the kernel
//! reads and writes (see each kernel's header comment for the extents).
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, DeviceRepr};

use super::opt_in_smem;
use crate::error::Result;

/// Quantisation mode of a finished vector (`ATTN_QUANT_*` in attn_common.cu).
pub const QUANT_NONE: i32 = 0;
/// Q8 in blocks of 64 on the non-rope channels (window rows, compressed entries).
pub const QUANT_Q8_NOPE: i32 = 1;
/// Hadamard over all channels then Q4 in blocks of 32 (indexer queries and keys).
pub const QUANT_HAD_Q4: i32 = 2;

/// Largest shared row of `attn_row_prep`.
pub const ROW_PREP_MAX: usize = 8192;
/// Largest vector of `attn_vec_prep`, `attn_compress`, `attn_sparse_*`.
pub const VEC_MAX: usize = 512;
/// Limits of `attn_index_score`.
pub const INDEX_MAX_HEADS: usize = 64;
pub const INDEX_MAX_DIM: usize = 128;
/// Largest top-k of `attn_index_topk` (cuda/attn_topk.cu: its filter takes 2048 group maxima, >= 2 k).
pub const TOPK_MAX: usize = 1024;
/// Scores per row up to which `attn_index_topk` selects over all of them in shared memory; longer rows go
/// through its filter first (`TOPK_CAND` in cuda/attn_topk.cu).
pub const TOPK_DIRECT_MAX: usize = 4096;
/// Scores per row whose filter pass keeps them in registers (`TOPK_THREADS * TOPK_REG_ROUNDS`); later ones
/// are read again from L2.
pub const TOPK_REGISTER_MAX: usize = 18432;
/// Largest split count of `attn_sparse_merge`.
pub const SPLITS_MAX: usize = 64;
/// Heads per block of `attn_sparse_partial`.
pub const SPARSE_HEADS_PER_BLOCK: usize = 16;

/// The attention kernels, resolved once with the module.
#[derive(Debug, Clone)]
pub struct AttnKernels {
    pub row_prep: CudaFunction,
    pub row_quant: CudaFunction,
    pub row_norm_quant: CudaFunction,
    pub vec_prep: CudaFunction,
    pub vec_prep_small: CudaFunction,
    pub compress: CudaFunction,
    pub index_score: CudaFunction,
    pub index_topk: CudaFunction,
    pub sparse_partial: CudaFunction,
    pub sparse_merge: CudaFunction,
    pub fill_f32: CudaFunction,
    pub synth: CudaFunction,
}

/// Dynamic shared memory of `attn_sparse_partial` for head dim `dim`: q of 16 heads and a 32-key tile
/// (rows of dim/2 + 4 words), the 16 x 36 score tile and 3 x 16 softmax floats (cuda/attn_sparse.cu).
pub fn sparse_smem_bytes(dim: usize) -> usize {
    4 * ((SPARSE_HEADS_PER_BLOCK + 32) * (dim / 2 + 4) + SPARSE_HEADS_PER_BLOCK * 36 + 48)
}

impl AttnKernels {
    pub(crate) fn resolve(module: &Arc<CudaModule>) -> Result<Self> {
        let get = |name: &'static str| super::kernel(module, name);
        let sparse_partial = get("attn_sparse_partial")?;
        // 52.4 KB at dim 512: above the 48 KB default, so opt in once here.
        opt_in_smem(&sparse_partial, sparse_smem_bytes(VEC_MAX))?;
        Ok(AttnKernels {
            row_prep: get("attn_row_prep")?,
            row_quant: get("attn_row_quant")?,
            row_norm_quant: get("attn_row_norm_quant")?,
            vec_prep: get("attn_vec_prep")?,
            vec_prep_small: get("attn_vec_prep_small")?,
            compress: get("attn_compress")?,
            index_score: get("attn_index_score")?,
            index_topk: get("attn_index_topk")?,
            sparse_partial,
            sparse_merge: get("attn_sparse_merge")?,
            fill_f32: get("attn_fill_f32")?,
            synth: get("attn_synth")?,
        })
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnRowPrep {
    pub x: u64,
    pub norm_w: u64,
    pub out: u64,
    /// Also the e4m3 codes `[rows, n]` and their f32 scales `[rows, n / 128]` (the FP8-activation GEMV's input;
    /// 0: none). Only with quant blocks of 128 on attn_row_quant / attn_row_norm_quant
    /// ([`crate::GpuContext::row_prep_q8_ok`]).
    pub q8: u64,
    pub q8_scales: u64,
    pub x_f32: i32,
    pub groups: i32,
    pub rows: i32,
    pub width: i32,
    pub quant_blk: i32,
    pub eps: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnVecPrep {
    pub x: u64,
    pub norm_w: u64,
    pub freqs: u64,
    pub slots: u64,
    pub positions: u64,
    pub out: u64,
    pub x_stride: i32,
    pub dim: i32,
    pub rdim: i32,
    pub rms: i32,
    pub quant: i32,
    pub window: i32,
    pub eps: f32,
    pub pad: i32,
}

/// Most jobs of one `attn_vec_prep` launch (q heads, the kv row, the indexer's q heads).
pub const VEC_PREP_JOBS: usize = 3;

/// Vectors of one row per `attn_vec_prep` block (VP_VPB in attn_prep.cu).
pub const VEC_PREP_PER_BLOCK: usize = 4;

/// The two `attn_vec_prep` kernels (same inputs, outputs and bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VecPrepKernel {
    /// `attn_vec_prep`: a warp per vector, 4 vectors of a row per block, registers throughout.
    WarpPerVector,
    /// `attn_vec_prep_small`: a 128-thread block per vector (short blocks for few rows).
    BlockPerVector,
}

/// The kernel parameter of `attn_vec_prep`: jobs 0..njobs, each over `nvec[j]` vectors.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AttnVecPrepJobs {
    pub job: [AttnVecPrep; VEC_PREP_JOBS],
    pub nvec: [i32; VEC_PREP_JOBS],
    pub njobs: i32,
}

/// Most jobs of one `attn_compress` launch (the attention's and the indexer's compressor).
pub const COMPRESS_JOBS: usize = 2;

/// The kernel parameter of `attn_compress`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AttnCompressJobs {
    pub job: [AttnCompress; COMPRESS_JOBS],
    pub njobs: i32,
    pub pad: i32,
}

/// The leading fields of the C structs AttnCompress and PfCompress (prefill_state.cu): the compressor's input
/// and weights. Nested here only; the C structs stay flat (same bytes: the pieces are 8-byte aligned).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CompressHead {
    pub proj: u64,
    pub ape: u64,
    pub norm_w: u64,
    pub freqs: u64,
}

/// The trailing fields of the C structs AttnCompress and PfCompress: the compressor's state and cache and
/// its shape (both kernels read the same fields after their own row addressing).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CompressTail {
    pub state_kv: u64,
    pub state_sc: u64,
    pub cache: u64,
    pub proj_stride: i32,
    pub kv_off: i32,
    pub gate_off: i32,
    pub dc: i32,
    pub ratio: i32,
    pub overlap: i32,
    pub rdim: i32,
    pub quant: i32,
    pub cap: i32,
    pub eps: f32,
}

/// The C struct AttnCompress: the shared head, each row's slot and position, the shared tail.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnCompress {
    pub head: CompressHead,
    pub slots: u64,
    pub positions: u64,
    pub tail: CompressTail,
}

/// The leading fields of the C structs AttnIndexScore and PfIndexScore (prefill_index.cu), nested here only
/// (the C structs stay flat; same bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexScoreCore {
    pub q: u64,
    pub wts: u64,
    pub keys: u64,
    pub slots: u64,
    pub positions: u64,
    pub scores: u64,
    pub wts_stride: i32,
    pub heads: i32,
    pub dim: i32,
    pub cap: i32,
    pub ratio: i32,
    pub k: i32,
}

/// The C struct AttnIndexScore.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnIndexScore {
    pub core: IndexScoreCore,
    pub scale: f32,
    pub pad: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnIndexTopk {
    pub scores: u64,
    pub slots: u64,
    pub positions: u64,
    pub sel: u64,
    pub cap: i32,
    pub ratio: i32,
    pub k: i32,
    /// Padding (the C struct's last int).
    pub pad: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnSparse {
    pub q: u64,
    pub ring: u64,
    pub comp: u64,
    pub sel: u64,
    pub slots: u64,
    pub positions: u64,
    pub part_o: u64,
    pub part_ml: u64,
    pub heads: i32,
    pub dim: i32,
    pub window: i32,
    pub ratio: i32,
    pub cap: i32,
    pub k: i32,
    pub scale: f32,
    pub pad: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnMerge {
    pub part_o: u64,
    pub part_ml: u64,
    pub sink: u64,
    pub freqs: u64,
    pub positions: u64,
    pub out: u64,
    pub splits: i32,
    pub heads: i32,
    pub dim: i32,
    pub rdim: i32,
    pub groups: i32,
    pub rows: i32,
}

/// `unsafe impl DeviceRepr` for parameter structs that mirror a C struct of cuda/*.cu byte for byte.
macro_rules! device_repr {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: the type is #[repr(C)] of u64/i32/f32 fields (and arrays or structs of them), laid out as
        // the C struct of the same name (sizes and offsets checked by the tests below); no references.
        unsafe impl DeviceRepr for $t {}
    )*};
}
pub(crate) use device_repr;

device_repr!(
    AttnRowPrep,
    AttnVecPrep,
    AttnCompress,
    AttnIndexScore,
    AttnIndexTopk,
    AttnSparse,
    AttnMerge,
    AttnVecPrepJobs,
    AttnCompressJobs,
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn parameter_blocks_have_the_c_layouts() {
        // Pointers first, then 4-byte fields, padded to 8 bytes (the C structs in cuda/attn_*.cu).
        assert_eq!(size_of::<AttnRowPrep>(), 5 * 8 + 6 * 4);
        assert_eq!(size_of::<AttnVecPrep>(), 6 * 8 + 8 * 4);
        assert_eq!(size_of::<AttnIndexScore>(), 6 * 8 + 8 * 4);
        assert_eq!(offset_of!(AttnIndexScore, scale), 6 * 8 + 6 * 4);
        assert_eq!(size_of::<AttnIndexTopk>(), 4 * 8 + 4 * 4);
        assert_eq!(size_of::<AttnSparse>(), 8 * 8 + 8 * 4);
        assert_eq!(size_of::<AttnMerge>(), 6 * 8 + 6 * 4);
        // AttnCompress: 9 pointers then 10 4-byte fields, as the flat C struct.
        assert_eq!(size_of::<AttnCompress>(), 9 * 8 + 10 * 4);
        assert_eq!(offset_of!(AttnCompress, slots), 4 * 8);
        assert_eq!(offset_of!(AttnCompress, tail), 6 * 8);
        assert_eq!(offset_of!(CompressTail, proj_stride), 3 * 8);
        assert_eq!(offset_of!(CompressTail, eps), 3 * 8 + 9 * 4);
        assert_eq!(
            size_of::<AttnCompressJobs>(),
            2 * size_of::<AttnCompress>() + 2 * 4
        );
        assert_eq!(
            size_of::<AttnVecPrepJobs>(),
            VEC_PREP_JOBS * size_of::<AttnVecPrep>() + (VEC_PREP_JOBS + 1) * 4
        );
    }
}
