//! `fp4_to_device_layout`: FP4 expert weights from the checkpoint's nibble order into the device layout that
//! the expert kernels decode (see cuda/common.cuh `fp4_pairs` and cuda/fp4_layout.cu). The CPU twin is
//! [`crate::reference::formats::fp4_device_word`].
use cudarc::driver::{CudaStream, DevicePtrMut, LaunchConfig};

use super::ptr_mut;
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "fp4_to_device_layout";

impl GpuContext {
    /// Rewrites `w` (FP4 weights u8 [.., K/2] with K % 32 == 0, as read from a checkpoint) in place into the
    /// device layout. Run exactly once per buffer, before any expert kernel reads it: a second run permutes
    /// the bits again.
    pub fn launch_fp4_to_device_layout(
        &self,
        stream: &CudaStream,
        w: &mut impl DevicePtrMut<u8>,
    ) -> Result<()> {
        let bytes = w.len();
        check(NAME, bytes % 4 == 0, || {
            format!("{bytes} bytes: not whole 32-bit words")
        })?;
        if bytes == 0 {
            return Ok(());
        }
        let words = (bytes / 4) as u64;
        // One pass over memory at load: 2048 blocks of 256 threads stride through any size.
        let blocks = words.div_ceil(256).min(2048) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let p = ptr_mut(w, stream);
        let mut l = Args::new();
        l.arg(&p).arg(&words);
        // SAFETY: fp4_to_device_layout(w, words) reads and writes `words` u32 of w, which holds 4 * words
        // bytes (checked above); cudarc allocations are 256-byte aligned and callers pass whole buffers or
        // slices at multiples of 4 bytes.
        unsafe { self.launch_k(stream, &self.kernels.fp4_layout, cfg, &mut l) }?;
        Ok(())
    }
}
