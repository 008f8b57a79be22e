//! Plain f32 CPU references for every kernel, and the number-format codecs they share. Obvious loops on
//! purpose: these define what the kernels must compute.
pub mod formats;
pub mod mhc;
mod ops;
pub mod prefill;
pub mod split;

pub use ops::{act_quant, bf16_expert, fp4_expert, fp8_gemv, fp8_gemv_abs, rmsnorm, ActQuant};
