//! The CUDA model runner: device weights, a preallocated workspace, one decode step over `rows` rows
//! (embed → blocks → HC head → head → argmax), CUDA-graph replay per batch-size bucket, and the
//! [`GpuBackend`] the engine thread drives.
//!
//! Checkpoints: FP8 linears with FP4 experts (the published format: decode, batched prefill, split
//! over GPUs) or BF16 linears with BF16 experts (one GPU; prompts fed as decode steps). Anything
//! else fails to load with [`RunnerError::Unsupported`] and runs on the CPU backend instead.

pub mod attention;
mod backend;
mod error;
mod graph;
mod load;
mod model;
mod moe;
pub mod multi;
pub mod prefill;
pub mod probe;
pub(crate) mod sampling;
pub(crate) mod seqs;
mod slots;
mod synth;
mod weights;
mod workspace;

pub use backend::{GpuBackend, GpuOptions, MAX_ROWS};
pub use error::RunnerError;
pub use graph::GraphSet;
pub use model::{GpuModel, StepInput};
pub use moe::Hook;
pub use prefill::{prefill_attention, PrefillHook, PrefillSeg, PrefillWs};
pub use probe::{probe_gpu, GpuProbe};
pub use weights::{block_dense_bytes, BankPlan, ExpertBank, ModelWeightsDev};
pub use workspace::Workspace;
