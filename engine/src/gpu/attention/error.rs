//! Errors of the GPU attention block (the runner may later move this to `gpu::error`).
use crate::model::checkpoint::CheckpointError;
use dsv4_kernels::cudarc::driver::DriverError;
use dsv4_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A checkpoint or configuration this implementation does not handle, with the reason.
    #[error("GPU attention: {0}")]
    Unsupported(String),
}

/// Returns `GpuError::Unsupported(what())` unless `ok`.
pub(crate) fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), GpuError> {
    if ok {
        Ok(())
    } else {
        Err(GpuError::Unsupported(what()))
    }
}
