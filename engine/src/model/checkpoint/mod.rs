//! Checkpoint loading: `model.safetensors.index.json` plus memory-mapped shards, every tensor
//! checked by name, dtype and shape against the config; FP8/FP4 dequantisation (spec §4).
//!
//! PUBLIC API CONTRACT (used by the reference model; keep these signatures):
//! - `Checkpoint::open(dir) -> Result<Checkpoint, CheckpointError>`: reads config.json and the index,
//!   maps every shard lazily, validates every expected tensor's header (dtype, shape) without
//!   touching tensor data.
//! - `Checkpoint::config(&self) -> &ModelConfig`
//! - `Checkpoint::load_f32(&self, name) -> Result<DenseTensor, CheckpointError>`: dequantised f32
//!   (BF16/F32 converted; FP8 x block scale; FP4 x per-32 scale), `stored` says which.
//! - `Checkpoint::load_i64(&self, name) -> Result<(Vec<usize>, Vec<i64>), CheckpointError>`

use super::config::ModelConfig;

/// How a tensor was stored on disk before dequantisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredAs {
    F32,
    Bf16,
    /// FP8 e4m3 with 128x128 UE8M0 block scales.
    Fp8,
    /// FP4 e2m1 packed in an I8 container with per-32 UE8M0 scales.
    Fp4,
}

impl StoredAs {
    /// Whether the official runtime runs this weight as an FP8/FP4 GEMM (and so
    /// fake-quantises the activation feeding it).
    pub fn is_quantized(self) -> bool {
        matches!(self, StoredAs::Fp8 | StoredAs::Fp4)
    }
}

/// A tensor dequantised to f32, row-major.
#[derive(Debug, Clone)]
pub struct DenseTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    pub stored: StoredAs,
}

/// Anything that goes wrong opening or reading a checkpoint; always names the file and tensor.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Config(#[from] super::config::ConfigError),
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error("{file}: tensor `{tensor}`: {message}")]
    Tensor {
        file: String,
        tensor: String,
        message: String,
    },
}

/// An opened checkpoint directory (placeholder until the loader lands).
pub struct Checkpoint {
    config: ModelConfig,
}

impl Checkpoint {
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
}
