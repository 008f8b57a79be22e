//! Shared helpers of the kernel-level GPU tests (gpu_attention_kernels, gpu_attention_topk): the context,
//! deterministic inputs and raw device addresses for the parameter blocks.
#![allow(dead_code)]

use dsv4_kernels::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use dsv4_kernels::{Gpu, GpuContext};

/// A context on GPU 0, or None (after a SKIP line naming `test`) without a usable GPU.
pub fn gpu(test: &str) -> Option<GpuContext> {
    match Gpu::probe() {
        Ok(Some(_)) => Some(GpuContext::new(0).expect("GPU context")),
        other => {
            eprintln!("SKIP {test}: no usable GPU ({other:?})");
            None
        }
    }
}

/// Deterministic values in [-1, 1).
pub fn rnd(i: usize, seed: usize) -> f32 {
    let mut z = (i as u64) ^ ((seed as u64) << 40) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z >> 40) as f32 / 16_777_216.0) * 2.0 - 1.0
}

pub fn addr<T>(ctx: &GpuContext, b: &CudaSlice<T>) -> u64 {
    b.device_ptr(&ctx.stream).0
}

pub fn addr_mut<T>(ctx: &GpuContext, b: &mut CudaSlice<T>) -> u64 {
    b.device_ptr_mut(&ctx.stream).0
}
