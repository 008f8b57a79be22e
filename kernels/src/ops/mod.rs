//! Typed launchers, one file per kernel family. Each checks shapes on the host, then launches on the given
//! stream. Device buffers are passed as anything cudarc can give a device pointer for (CudaSlice, CudaView,
//! CudaViewMut), so callers can hand in slices of larger buffers.
pub mod act_quant;
// attention kernels
pub mod attn_launch;
pub mod attn_params;
pub mod bf16_expert;
pub mod fp4_expert;
pub mod fp4_layout;
pub mod fp4_routed;
pub mod fp4_swiglu_down;
pub mod gemv;
pub(crate) mod gemv_plan;
pub mod gemv_q8;
pub mod gemv_ring;
pub(crate) mod gemv_tile;
pub mod gemv_wg;
pub mod gemv_wq8;
pub mod mhc;
pub mod moe_route;
pub mod peer;
// batched prefill kernels
pub mod prefill_launch;
pub mod prefill_params;
pub mod prefill_wgmma;
pub mod prefill_wgmma_fp4;
pub mod prefill_wgmma_ws;
pub mod rmsnorm;
pub mod runner;
pub mod sample;
pub mod split;
pub mod synth;

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaModule, CudaStream, DevicePtr, DevicePtrMut};

use crate::error::{KernelError, Result};

/// A `usize` from environment variable `name` (the A/B and tuning knobs); None when unset or not a number.
pub fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Kernel `name` of the module (a missing one names itself in the error).
pub(crate) fn kernel(module: &Arc<CudaModule>, name: &'static str) -> Result<CudaFunction> {
    module
        .load_function(name)
        .map_err(|source| KernelError::MissingKernel { name, source })
}

/// Lets `f` use `bytes` of dynamic shared memory (opt-in above the 48 KB default); an error where the device
/// has less per block.
pub(crate) fn opt_in_smem(f: &CudaFunction, bytes: usize) -> Result<()> {
    let b = i32::try_from(bytes).unwrap_or(i32::MAX);
    f.set_attribute(
        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        b,
    )?;
    Ok(())
}

/// Raw device address of a read-only buffer. Event tracking is off (see GpuContext::new), so the guard that
/// cudarc returns does nothing and can be dropped at once.
pub(crate) fn ptr<T>(buf: &impl DevicePtr<T>, stream: &CudaStream) -> u64 {
    let (p, _guard) = buf.device_ptr(stream);
    p
}

/// Raw device address of a written buffer.
pub(crate) fn ptr_mut<T>(buf: &mut impl DevicePtrMut<T>, stream: &CudaStream) -> u64 {
    let (p, _guard) = buf.device_ptr_mut(stream);
    p
}

/// Converts a dimension to the kernel's `int`, or a shape error.
pub(crate) fn int(kernel: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Shape {
        kernel,
        what: format!("{what} = {v} exceeds i32"),
    })
}

/// Grid dimension as u32, or a shape error.
pub(crate) fn grid(kernel: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| KernelError::Shape {
        kernel,
        what: format!("grid {v} exceeds u32"),
    })
}
