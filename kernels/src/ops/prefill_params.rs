//! Parameter blocks of the batched-prefill kernels (`cuda/prefill_*.cu`), passed by value as one kernel
//! argument. Each struct mirrors the C struct of the same name field by field (`#[repr(C)]`; device addresses
//! as u64 first, then 4-byte fields, padded to a multiple of 8 bytes). The launchers in
//! [`super::prefill_launch`] are `unsafe`: the caller vouches for every address (see each kernel's header).
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, DeviceRepr};

use super::attn_params::{device_repr, CompressHead, CompressTail, IndexScoreCore};
use super::opt_in_smem;
use crate::error::Result;

/// Most groups of one dense prefill GEMM launch.
pub const PF_GROUPS: usize = 8;
/// Output columns per GEMM block.
pub const PF_BN: usize = 128;
/// Heads per block of `pf_attn_dX`.
pub const PF_ATTN_HEADS: usize = 64;
/// Index entries per tile of `pf_index_score_dX`.
pub const PF_INDEX_TILE: usize = 64;
/// Largest expert count of `pf_moe_group`.
pub const PF_GROUP_MAX_EXPERTS: usize = 1024;

/// Weight format of a prefill GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PfWeights {
    Bf16,
    /// e4m3 bytes with UE8M0 128x128 block scales.
    Fp8,
    /// Routed experts: e2m1 nibbles `[E, N, K/2]` with UE8M0 scales `[E, N, K/32]`, rows gathered per expert.
    Fp4Expert,
}

impl PfWeights {
    /// K must be a multiple of this (16-byte chunks wholly inside or outside K).
    pub fn k_align(self) -> usize {
        match self {
            PfWeights::Bf16 => 8,
            PfWeights::Fp8 => 16,
            PfWeights::Fp4Expert => 32,
        }
    }
}

/// Dynamic shared memory of a GEMM block of `bm` rows (two stages of x and weight tiles, 144-byte rows).
pub fn pf_gemm_smem(bm: usize) -> usize {
    2 * (bm + PF_BN) * 72 * 2
}

/// One instance of the bf16 wgmma GEMM: prefill_wgmma.cu's cp.async ring (128 x 128 tiles) or
/// prefill_wgmma_ws.cu's warp-specialised TMA pipeline (`ws`: 128 x 256 tiles, persistent blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgmmaVariant {
    pub name: &'static str,
    /// Depth of the ring (an x tile of 128 rows and a weight tile of `bn()` rows, 128 bytes each, a stage).
    pub stages: usize,
    pub ws: bool,
}

impl WgmmaVariant {
    /// Output columns of one tile.
    pub const fn bn(&self) -> usize {
        if self.ws {
            256
        } else {
            PF_BN
        }
    }
}

/// The wgmma GEMM instances, in `PrefillKernels::wgmma` order.
pub const PF_WGMMA_VARIANTS: [WgmmaVariant; 4] = [
    WgmmaVariant {
        name: "pf_wgmma_bf16_s4",
        stages: 4,
        ws: false,
    },
    WgmmaVariant {
        name: "pf_wgmma_bf16_s6",
        stages: 6,
        ws: false,
    },
    WgmmaVariant {
        name: "pf_wgmma_bf16_s3x2",
        stages: 3,
        ws: false,
    },
    WgmmaVariant {
        name: "pf_wgmma_bf16_ws",
        stages: 4,
        ws: true,
    },
];

/// Dynamic shared memory of a wgmma GEMM instance: its ring, the slack that aligns the ring to the 1024-byte
/// swizzle pattern, and for `ws` a full and an empty mbarrier per stage.
pub const fn pf_wgmma_smem(v: WgmmaVariant) -> usize {
    let bars = if v.ws { 16 * v.stages } else { 0 };
    v.stages * (128 + v.bn()) * 128 + 1024 + bars
}

/// Dynamic shared memory of `pf_wgmma_fp4_expert` (`small`: `pf_wgmma_fp4_expert_s`): 1 KB alignment slack, the
/// ring (216 or 104 KB), the 6 KB scale ring, the tile's row tables (256 or 64 rows).
pub const fn pf_wgmma_fp4_smem(small: bool) -> usize {
    let (ring, rows) = if small { (104, 64) } else { (216, 256) };
    1024 + ring * 1024 + 12 * 512 + 2 * rows * 4
}
const _: () = assert!(pf_wgmma_fp4_smem(false) <= 227 * 1024, "one block per SM");
// Two blocks per SM: 228 KB per SM, less 1 KB the runtime keeps per block.
const _: () = assert!(
    2 * (pf_wgmma_fp4_smem(true) + 1024) <= 228 * 1024,
    "two blocks per SM"
);

/// The prefill attention kernels, in `PrefillKernels::attn` order: `pf_attn` (prefill_attn.cu: scores and
/// probabilities through shared memory, 2 key stages) and `pf_attn2s3` / `pf_attn2s4` (prefill_attn_fa.cu:
/// scores in registers, 3 or 4 key stages). Instances are `{name}_d{dim}`.
pub const PF_ATTN_KINDS: [&str; 3] = ["pf_attn", "pf_attn2s3", "pf_attn2s4"];

/// Instance names per kind and [`PF_ATTN_DIMS`] entry.
const PF_ATTN_NAMES: [[&str; 4]; 3] = [
    [
        "pf_attn_d64",
        "pf_attn_d128",
        "pf_attn_d256",
        "pf_attn_d512",
    ],
    [
        "pf_attn2s3_d64",
        "pf_attn2s3_d128",
        "pf_attn2s3_d256",
        "pf_attn2s3_d512",
    ],
    [
        "pf_attn2s4_d64",
        "pf_attn2s4_d128",
        "pf_attn2s4_d256",
        "pf_attn2s4_d512",
    ],
];

/// Dynamic shared memory of kind `kind` (index into [`PF_ATTN_KINDS`]) for head dim `dim`.
pub const fn pf_attn_smem(kind: usize, dim: usize) -> usize {
    match kind {
        0 => 256 * (dim + 8) + 2 * 2 * 64 * 40 + 4 * 64 * 33 + 4 * 256,
        // Q [64] + stages (kind + 2) x [32] key rows of dim + 8 bf16, 8 warps x 16 x 32 f32 scores, 64 f32
        // cos/sin.
        _ => 2 * (64 + 32 * (kind + 2)) * (dim + 8) + 4 * 8 * 16 * 32 + 4 * 64,
    }
}

/// Dynamic shared memory of `pf_index_score_d{dim}`.
pub fn pf_index_smem(dim: usize) -> usize {
    2 * 3 * 64 * (dim + 8) + 2 * 4 * 4 * PF_INDEX_TILE
}

/// The prefill kernels, resolved once with the module.
#[derive(Debug, Clone)]
pub struct PrefillKernels {
    /// [bm 64, bm 128] per weight format.
    pub gemm_bf16: [CudaFunction; 2],
    pub gemm_fp8: [CudaFunction; 2],
    pub gemm_fp4_expert: [CudaFunction; 2],
    /// Per [`PF_ATTN_KINDS`] entry: `{kind}_d{64, 128, 256, 512}`.
    pub attn: [[CudaFunction; 4]; 3],
    /// pf_index_score_d{64, 128}.
    pub index_score: [CudaFunction; 2],
    pub compress_pool: CudaFunction,
    pub compress_state: CudaFunction,
    pub ring_write: CudaFunction,
    pub moe_group: CudaFunction,
    /// The PF_WGMMA_VARIANTS of prefill_wgmma.cu: real kernels only in the sm_90a SASS of the fatbin, a
    /// trap elsewhere; see `GpuContext::has_wgmma`.
    pub wgmma: [CudaFunction; 4],
    /// pf_fp8_to_bf16: FP8 weights dequantised to bf16 for the bf16 wgmma GEMMs.
    pub fp8_to_bf16: CudaFunction,
    /// Whether the device granted each wgmma instance its shared memory.
    pub wgmma_fits: [bool; 4],
    /// [pf_wgmma_fp4_expert, pf_wgmma_fp4_expert_s] (prefill_wgmma_fp4.cu): the routed FP4 experts on wgmma
    /// (tiles of up to 256 / 64 rows), real only in the sm_90a SASS like `wgmma`; whether each one's shared
    /// memory was granted.
    pub wgmma_fp4: [CudaFunction; 2],
    pub wgmma_fp4_fits: [bool; 2],
    /// pf_kperm: x in the K order of pf_wgmma_fp4_expert (portable).
    pub kperm: CudaFunction,
    /// pf_swiglu_kperm: the routed SwiGLU written in that K order (portable).
    pub swiglu_kperm: CudaFunction,
    /// Whether the device granted each attention instance its shared memory (a GPU with less shared
    /// memory per block than an H200 cannot run the largest head dims: prefill then falls back to decode).
    pub attn_fits: [[bool; 4]; 3],
}

impl PrefillKernels {
    /// Whether every prefill kernel for head dim `dim` and indexer dim `index_dim` can run here.
    pub fn supports(&self, dim: usize, index_dim: usize) -> bool {
        let a = PF_ATTN_DIMS.iter().position(|&d| d == dim);
        let i = PF_INDEX_DIMS.contains(&index_dim);
        a.is_some_and(|a| self.attn_fits.iter().any(|f| f[a])) && i
    }
}

/// Head dims of the attention kernel instances, in `PrefillKernels::attn` order.
pub const PF_ATTN_DIMS: [usize; 4] = [64, 128, 256, 512];
/// Head dims of the indexer kernel instances.
pub const PF_INDEX_DIMS: [usize; 2] = [64, 128];

/// Every attention instance, and whether the device granted each its shared memory.
fn attn_kernels(
    module: &Arc<CudaModule>,
    fits_out: &mut [[bool; 4]; 3],
) -> Result<[[CudaFunction; 4]; 3]> {
    let kind = |k: usize| -> Result<[CudaFunction; 4]> {
        let n = &PF_ATTN_NAMES[k];
        Ok([
            super::kernel(module, n[0])?,
            super::kernel(module, n[1])?,
            super::kernel(module, n[2])?,
            super::kernel(module, n[3])?,
        ])
    };
    let attn = [kind(0)?, kind(1)?, kind(2)?];
    for (k, (fs, oks)) in attn.iter().zip(fits_out.iter_mut()).enumerate() {
        for ((f, d), ok) in fs.iter().zip(PF_ATTN_DIMS).zip(oks.iter_mut()) {
            *ok = fits(f, pf_attn_smem(k, d));
        }
    }
    Ok(attn)
}

/// Whether the device has `bytes` of shared memory per block for `f` (the attribute is refused above it).
fn fits(f: &CudaFunction, bytes: usize) -> bool {
    opt_in_smem(f, bytes).is_ok()
}

impl PrefillKernels {
    pub(crate) fn resolve(module: &Arc<CudaModule>) -> Result<Self> {
        let get = |name: &'static str| super::kernel(module, name);
        let pair = |a: &'static str, b: &'static str| -> Result<[CudaFunction; 2]> {
            let f = [get(a)?, get(b)?];
            opt_in_smem(&f[0], pf_gemm_smem(64))?;
            opt_in_smem(&f[1], pf_gemm_smem(128))?;
            Ok(f)
        };
        let mut attn_fits = [[false; 4]; 3];
        let attn = attn_kernels(module, &mut attn_fits)?;
        let index_score = [get("pf_index_score_d64")?, get("pf_index_score_d128")?];
        for (f, d) in index_score.iter().zip(PF_INDEX_DIMS) {
            opt_in_smem(f, pf_index_smem(d))?;
        }
        let wgmma = [
            get(PF_WGMMA_VARIANTS[0].name)?,
            get(PF_WGMMA_VARIANTS[1].name)?,
            get(PF_WGMMA_VARIANTS[2].name)?,
            get(PF_WGMMA_VARIANTS[3].name)?,
        ];
        let mut wgmma_fits = [false; 4];
        for ((f, v), ok) in wgmma
            .iter()
            .zip(PF_WGMMA_VARIANTS)
            .zip(wgmma_fits.iter_mut())
        {
            *ok = fits(f, pf_wgmma_smem(v));
        }
        let wgmma_fp4 = [get("pf_wgmma_fp4_expert")?, get("pf_wgmma_fp4_expert_s")?];
        let wgmma_fp4_fits = [
            fits(&wgmma_fp4[0], pf_wgmma_fp4_smem(false)),
            fits(&wgmma_fp4[1], pf_wgmma_fp4_smem(true)),
        ];
        Ok(PrefillKernels {
            gemm_bf16: pair("pf_gemm_bf16_m64", "pf_gemm_bf16_m128")?,
            gemm_fp8: pair("pf_gemm_fp8_m64", "pf_gemm_fp8_m128")?,
            gemm_fp4_expert: pair("pf_gemm_fp4_expert_m64", "pf_gemm_fp4_expert_m128")?,
            attn,
            index_score,
            compress_pool: get("pf_compress_pool")?,
            compress_state: get("pf_compress_state")?,
            ring_write: get("pf_ring_write")?,
            moe_group: get("pf_moe_group")?,
            fp8_to_bf16: get("pf_fp8_to_bf16")?,
            wgmma,
            wgmma_fits,
            wgmma_fp4,
            wgmma_fp4_fits,
            kperm: get("pf_kperm")?,
            swiglu_kperm: get("pf_swiglu_kperm")?,
            attn_fits,
        })
    }
}

/// `pf_gemm_*`: per group g, x[g] bf16 `[M, K]` (expert mode: rows gathered through `order`), w[g] (+ s[g]),
/// out[g] `[M, n[g]]` f32 or bf16 (expert mode: `[slots, n]`, row = slot).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfGemm {
    pub x: [u64; PF_GROUPS],
    pub w: [u64; PF_GROUPS],
    pub s: [u64; PF_GROUPS],
    pub out: [u64; PF_GROUPS],
    pub tiles: u64,
    pub order: u64,
    pub n: [i32; PF_GROUPS],
    pub m: i32,
    pub k: i32,
    pub out_bf16: i32,
    pub topk: i32,
    pub x_per_slot: i32,
    pub pad: i32,
}

/// `pf_wgmma_*`: per group g, x[g] bf16 `[M, K]` and w[g] bf16 `[n[g], K]`, out[g] `[M, n[g]]` f32 or bf16.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfWgmma {
    pub x: [u64; PF_GROUPS],
    pub w: [u64; PF_GROUPS],
    pub out: [u64; PF_GROUPS],
    pub n: [i32; PF_GROUPS],
    pub m: i32,
    pub k: i32,
    pub out_bf16: i32,
    pub pad: i32,
}

/// `pf_fp8_to_bf16`: per group g, w[g] e4m3 `[n[g], k]` with UE8M0 scales s[g] `[ceil(n/128), ceil(k/128)]`
/// -> out[g] bf16 `[n[g], k]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfDequant {
    pub w: [u64; PF_GROUPS],
    pub s: [u64; PF_GROUPS],
    pub out: [u64; PF_GROUPS],
    pub n: [i32; PF_GROUPS],
    pub k: i32,
    pub pad: i32,
}

/// `pf_kperm`: x bf16 `[rows, k]` -> out bf16 `[rows, pf_kperm_cols(k)]` in pf_wgmma_fp4_expert's K order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfKperm {
    pub x: u64,
    pub out: u64,
    pub rows: i32,
    pub k: i32,
}

/// `pf_swiglu_kperm`: g, u f32 `[slots, inter]`, wt f32 `[slots]` (0: none) -> out bf16
/// `[slots, pf_kperm_cols(inter)]`: moe_swiglu's h (limit, quant as there) in pf_wgmma_fp4_expert's K order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfSwiglu {
    pub g: u64,
    pub u: u64,
    pub wt: u64,
    pub out: u64,
    pub slots: i32,
    pub inter: i32,
    pub limit: f32,
    pub quant: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfAttn {
    pub q: u64,
    pub kv: u64,
    pub ring: u64,
    pub comp: u64,
    pub sel: u64,
    pub slots: u64,
    pub positions: u64,
    pub row0: u64,
    pub pos0: u64,
    pub sink: u64,
    pub freqs: u64,
    pub out: u64,
    pub heads: i32,
    pub dim: i32,
    pub window: i32,
    pub ratio: i32,
    pub cap: i32,
    pub k: i32,
    pub rdim: i32,
    pub groups: i32,
    pub rows: i32,
    pub scale: f32,
}

/// The C struct PfIndexScore: decode's AttnIndexScore core, then the first row and the rows of this launch.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfIndexScore {
    pub core: IndexScoreCore,
    pub row_begin: i32,
    pub scale: f32,
    /// Rows of the launch (set by the launcher).
    pub rows: i32,
    pub pad: i32,
}

/// The C struct PfCompress: the compressor head and tail shared with decode's AttnCompress, around the job
/// table.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfCompress {
    pub head: CompressHead,
    /// Pool: `[jobs][4]` (slot, w, row0, pos0); state: `[segments][4]` (slot, row0, pos0, len).
    pub jobs: u64,
    pub tail: CompressTail,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfRing {
    pub kv: u64,
    pub ring: u64,
    pub slots: u64,
    pub positions: u64,
    pub pos0: u64,
    pub seglen: u64,
    pub dim: i32,
    pub window: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PfGroup {
    pub ids: u64,
    pub order: u64,
    pub tiles: u64,
    pub slots: i32,
    pub experts: i32,
    pub bm: i32,
    pub pad: i32,
}

device_repr!(
    PfGemm,
    PfWgmma,
    PfDequant,
    PfKperm,
    PfSwiglu,
    PfAttn,
    PfIndexScore,
    PfCompress,
    PfRing,
    PfGroup
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_blocks_have_the_c_sizes() {
        // 34 pointers + 14 ints; 12 + 10; 6 + 8; 8 + 10; 6 + 2; 3 + 4.
        assert_eq!(std::mem::size_of::<PfGemm>(), 34 * 8 + 14 * 4);
        assert_eq!(std::mem::size_of::<PfWgmma>(), 24 * 8 + 12 * 4);
        assert_eq!(std::mem::size_of::<PfDequant>(), 24 * 8 + 10 * 4);
        assert_eq!(std::mem::size_of::<PfKperm>(), 2 * 8 + 2 * 4);
        assert_eq!(std::mem::size_of::<PfSwiglu>(), 4 * 8 + 4 * 4);
        assert_eq!(std::mem::size_of::<PfAttn>(), 12 * 8 + 10 * 4);
        assert_eq!(std::mem::size_of::<PfIndexScore>(), 6 * 8 + 10 * 4);
        assert_eq!(std::mem::offset_of!(PfIndexScore, row_begin), 6 * 8 + 6 * 4);
        assert_eq!(std::mem::size_of::<PfCompress>(), 8 * 8 + 10 * 4);
        assert_eq!(std::mem::offset_of!(PfCompress, tail), 5 * 8);
        assert_eq!(std::mem::size_of::<PfRing>(), 6 * 8 + 2 * 4);
        assert_eq!(std::mem::size_of::<PfGroup>(), 3 * 8 + 4 * 4);
    }

    #[test]
    fn shared_memory_fits_one_block() {
        for k in 0..PF_ATTN_KINDS.len() {
            assert!(pf_attn_smem(k, 512) <= 227 * 1024);
        }
        assert!(pf_gemm_smem(128) * 2 <= 227 * 1024);
        for v in PF_WGMMA_VARIANTS {
            assert!(pf_wgmma_smem(v) <= 227 * 1024, "{}", v.name);
        }
        assert!(pf_index_smem(128) <= 227 * 1024);
    }
}
