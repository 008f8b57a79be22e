//! CUDA kernels: sources, build and load, typed launchers. Knows nothing of models or chat.
//!
//! - [`Gpu::probe`] says whether a usable GPU is present, without ever panicking.
//! - [`GpuContext::new`] creates the context and a stream, loads the kernel module once (embedded fatbin, or
//!   NVRTC when the crate was built without nvcc) and resolves every kernel, so a missing one fails at start.
//! - One typed launcher per kernel on [`GpuContext`] (`launch_*`), with shape checks.
//! - [`reference`] holds plain f32 CPU versions of every kernel and the number-format codecs.
mod context;
mod error;
pub mod fatbin;
mod launch;
mod module;
mod ops;
mod probe;
pub mod reference;

pub use context::{GpuContext, Kernels};
pub use error::{KernelError, Result};
pub use module::{compile_ptx, ModuleSource, EMBEDDED_FATBIN, KERNEL_SOURCE};
pub use ops::env_usize;
pub use ops::fp4_expert::{moe_group_meta_len, ExpertShape, Fp4Fixed, Fp4Mat, Fp4Tune, FP4_FIXED};
pub use ops::fp4_routed::{
    fp4_routed_up_fits, RoutedUpRoute, FP4_ROUTED_UP_ROWS, FP4_ROUTED_UP_SHAPE,
};
pub use ops::fp4_swiglu_down::{fp4_swiglu_down_fits, SwigluIn, FP4_SWIGLU_DOWN_SHAPE};
pub use ops::gemv::{
    gemv_cnt_len, gemv_splits, gemv_splits_max, gemv_ws_len, GemvOut, GemvParams, GemvPlan,
    GemvScratch, GemvWeights, RingTune, GEMV_GROUPS, GEMV_ROW_TILE,
};
pub use ops::gemv_q8::{gemv_q8_min_rows, Q8Kernel, FP8X_MAX_ROWS};
pub use ops::gemv_ring::{GemvPath, RING_ROWS_MIN};
pub use ops::gemv_wq8::{GemvQ8X, GEMV_Q8_BLOCK};
pub use ops::mhc::{hc_workspace_len, HcCodes, HcPost, HcPostF, HcPre, HC_MIX, HC_STREAMS};
pub use ops::moe_route::{RouteBy, RouteShape, SwigluAct};
pub use ops::peer::{peer_access_possible, PeerAllReduce, PEER_RANKS};
pub use ops::sample::SAMPLE_PARAMS_PER_ROW;
pub use ops::split::RANK_MAX;
pub use ops::synth::Fill;
// attention kernels
pub use ops::attn_params as attn;
// batched prefill kernels
pub use ops::prefill_launch::pf_max_tiles;
pub use ops::prefill_params as prefill;
pub use ops::prefill_wgmma::PF_WGMMA_BM;
pub use ops::prefill_wgmma_fp4::{pf_kperm_cols, PF_WGMMA_FP4_BM, PF_WGMMA_FP4_SMALL_BM};
pub use probe::{Gpu, GpuInfo};

/// Re-exported so callers use the same cudarc types as the launchers.
pub use cudarc;
pub use half::bf16;
