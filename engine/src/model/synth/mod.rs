//! Random DeepSeek-V4 checkpoints in the real on-disk format (config.json, safetensors
//! shards, index), deterministic from a seed: the app's built-in demo model and test models
//! of any shape.
//!
//! The tensor list is the loader's own [`expected_tensors`], so a written checkpoint always
//! opens; the loader's list itself is pinned by the golden (independently written) checkpoints.

mod init;
mod quant;
mod rng;
mod spec;
mod writer;

pub use quant::{e2m1_encode, e4m3_encode, ue8m0_scale};
pub use rng::SplitMix64;
pub use spec::SynthSpec;
pub use writer::shard_name;

use crate::model::checkpoint::{expected_tensors, CONFIG_FILE};
use crate::model::config::ConfigError;
use std::path::Path;

/// Why a synthetic checkpoint could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("synthetic checkpoint spec: {0}")]
    Spec(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Writes the checkpoint described by `spec` into `dir` (created if missing). `config.json`
/// is written last, so an interrupted write leaves a directory that fails to open rather
/// than one that looks complete.
pub fn write_checkpoint(dir: &Path, spec: &SynthSpec) -> Result<(), SynthError> {
    let config_json = spec.config_json();
    let cfg = spec.model_config()?;
    std::fs::create_dir_all(dir).map_err(|source| SynthError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let tensors = expected_tensors(&cfg);
    writer::write_shards(dir, &tensors, spec.shards, spec.seed, cfg.n_routed_experts)?;
    writer::write_json(&dir.join(CONFIG_FILE), &config_json)
}
