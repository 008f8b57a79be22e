use cudarc::driver::DriverError;
use cudarc::nvrtc::CompileError;

/// Everything a kernel call or the kernel module can fail with.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("no usable GPU: {0}")]
    NoGpu(String),
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    #[error("NVRTC compile failed: {0:?}")]
    Nvrtc(Box<CompileError>),
    #[error("kernel cache {path}: {source}")]
    Cache {
        path: String,
        source: std::io::Error,
    },
    #[error("kernel `{name}` missing from the module: {source}")]
    MissingKernel {
        name: &'static str,
        source: DriverError,
    },
    #[error("{kernel}: bad shape: {what}")]
    Shape { kernel: &'static str, what: String },
    #[error("{kernel}: not available here: {why}")]
    Unavailable { kernel: &'static str, why: String },
}

impl From<CompileError> for KernelError {
    fn from(e: CompileError) -> Self {
        KernelError::Nvrtc(Box::new(e))
    }
}

pub type Result<T> = std::result::Result<T, KernelError>;

/// Returns a shape error for `kernel` unless `ok`.
pub(crate) fn check(kernel: &'static str, ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(KernelError::Shape {
            kernel,
            what: what(),
        })
    }
}
