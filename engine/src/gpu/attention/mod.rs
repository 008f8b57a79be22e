//! The attention block on the GPU for decode (spec §2.4-2.7, §3): every kernel from the normalised block
//! input `a` to the attention output, with the per-sequence caches of `slots` sequences.
//!
//! - [`AttnLayer`]: device weights of one block (FP8 linears read directly, see `layer.rs`).
//! - [`AttnState`]: window ring, compressed KV, indexer keys and compressor states per slot.
//! - [`decode`]: one token per row, graph-capturable; [`StepMeta`] carries slots/positions on the device.
mod acts;
mod decode;
mod error;
mod layer;
pub mod rank;
mod rope;
pub(crate) mod row_prep;
mod scratch;
mod stack;
mod stages;
mod state;
mod step;
mod synth;

pub use acts::AttnActs;
pub use decode::{decode, decode_heads, decode_profiled, DecodeIn};
pub use error::GpuError;
pub(crate) use layer::upload_linear;
pub use layer::{AttnLayer, CompressorDev, Fp8Linear, IndexerDev};
pub use rope::rope_freqs;
pub(crate) use scratch::gemv_need;
pub use scratch::{AttnScratch, MAX_ROWS};
pub(crate) use stack::{stack_compressors, AttnWeightSource};
pub(crate) use stages::{compress_params, index_score_shape};
pub use state::{AttnSnapshot, AttnState, CompCache, StepMeta};
pub use step::Q8In;
pub use step::StageMarks;
pub(crate) use step::{grouped_gemv, Job};
pub(crate) use step::{grouped_gemv_q8, q8_engaged};

use dsv4_kernels::cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

/// Device address of a buffer read by a kernel. Event tracking is off in `GpuContext`, so the guard cudarc
/// returns does nothing and is dropped at once.
pub(crate) fn dptr<T>(b: &impl DevicePtr<T>, s: &CudaStream) -> u64 {
    b.device_ptr(s).0
}

/// Device address of a buffer written by a kernel.
pub(crate) fn dptr_mut<T>(b: &mut impl DevicePtrMut<T>, s: &CudaStream) -> u64 {
    b.device_ptr_mut(s).0
}
