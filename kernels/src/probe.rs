use cudarc::driver::{sys, CudaContext};

use crate::error::{KernelError, Result};

/// What [`Gpu::probe`] found on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0) for H200, (12, 0) for RTX PRO 6000 Blackwell.
    pub cc: (i32, i32),
    pub sm_count: u32,
    pub total_mem: usize,
}

/// Entry point for finding a GPU.
pub struct Gpu;

impl Gpu {
    /// Looks at device 0. `Ok(None)` with the reason in `Err`-free form when there is no driver or no device:
    /// never panics (cudarc's `CudaContext::new` panics without libcuda, so check that first).
    pub fn probe() -> Result<Option<GpuInfo>> {
        match Self::probe_reason(0) {
            Ok(info) => Ok(Some(info)),
            Err(KernelError::NoGpu(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Like [`Gpu::probe`] but says why no GPU is usable (`KernelError::NoGpu(reason)`).
    pub fn probe_reason(ordinal: usize) -> Result<GpuInfo> {
        // SAFETY: only tries to dlopen libcuda; no CUDA call is made.
        if !unsafe { sys::is_culib_present() } {
            return Err(KernelError::NoGpu(
                "libcuda (the NVIDIA driver) is not installed".into(),
            ));
        }
        let count = CudaContext::device_count().map_err(|e| {
            KernelError::NoGpu(format!(
                "driver present but cuInit/device count failed: {e}"
            ))
        })?;
        if count <= ordinal as i32 {
            return Err(KernelError::NoGpu(format!(
                "{count} CUDA device(s), asked for #{ordinal}"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        info_of(&ctx)
    }
}

impl Gpu {
    /// Every usable GPU, or why there is none (no driver, no device, ...). Never panics.
    pub fn probe_all() -> std::result::Result<Vec<GpuInfo>, String> {
        let first = Self::probe_reason(0).map_err(|e| e.to_string())?;
        let count = CudaContext::device_count().map_err(|e| e.to_string())?;
        let mut all = vec![first];
        for ordinal in 1..count.max(1) as usize {
            all.extend(Self::probe_reason(ordinal).ok());
        }
        Ok(all)
    }
}

pub(crate) fn info_of(ctx: &CudaContext) -> Result<GpuInfo> {
    let sms = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    Ok(GpuInfo {
        ordinal: ctx.ordinal(),
        name: ctx.name()?,
        cc: ctx.compute_capability()?,
        sm_count: u32::try_from(sms).unwrap_or(1),
        total_mem: ctx.total_mem()?,
    })
}
