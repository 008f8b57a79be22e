//! The runner's error type: everything a load or a step can fail with, with context.

use super::attention::GpuError;
use crate::model::checkpoint::CheckpointError;
use dsv4_kernels::cudarc::driver::DriverError;
use dsv4_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("GPU kernel: {0}")]
    Kernel(#[from] KernelError),
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    #[error("attention: {0}")]
    Attention(#[from] GpuError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("the model does not fit on the GPU: {0}")]
    DoesNotFit(String),
    #[error("the GPU runner does not support this model: {0}")]
    Unsupported(String),
    #[error("step of {rows} rows exceeds the workspace's {max} rows")]
    TooManyRows { rows: usize, max: usize },
    #[error("CUDA graph capture produced no graph for batch {0}")]
    NoGraph(usize),
    #[error("collective: {0}")]
    Collective(String),
    #[error("split over GPUs: {0}")]
    Split(String),
    #[error(transparent)]
    Load(#[from] crate::parallel::load::LoadError),
}
