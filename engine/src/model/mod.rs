//! Model description: config, checkpoint loading and quantisation formats.

pub mod checkpoint;
pub mod config;
mod config_check;
pub mod synth;

pub use config::{AttentionKind, ConfigError, ExpertFormat, LinearFormat, ModelConfig, Yarn};
pub use config_check::CSA_RATIO;
