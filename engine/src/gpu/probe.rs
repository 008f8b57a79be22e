//! Whether the GPU runner can be used here, without ever panicking when there is no driver.

use dsv4_kernels::{Gpu, GpuInfo, KernelError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuProbe {
    Available(GpuInfo),
    /// Why not, for a line like "no CUDA driver: using the CPU backend".
    Unavailable(String),
}

impl GpuProbe {
    /// One line for the app or CLI.
    pub fn describe(&self) -> String {
        match self {
            GpuProbe::Available(i) => format!(
                "CUDA: {} (cc {}.{}, {} SMs, {:.0} GiB)",
                i.name,
                i.cc.0,
                i.cc.1,
                i.sm_count,
                i.total_mem as f64 / (1u64 << 30) as f64
            ),
            GpuProbe::Unavailable(why) => format!("{why}: using the CPU backend"),
        }
    }
}

/// Looks at GPU 0 (checks for libcuda before touching CUDA).
pub fn probe_gpu() -> GpuProbe {
    match Gpu::probe_reason(0) {
        Ok(info) => GpuProbe::Available(info),
        Err(KernelError::NoGpu(why)) => {
            GpuProbe::Unavailable(format!("no usable CUDA GPU ({why})"))
        }
        Err(e) => GpuProbe::Unavailable(format!("CUDA error ({e})")),
    }
}
