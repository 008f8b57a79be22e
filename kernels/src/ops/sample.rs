//! Greedy sampling on the device (see cuda/sample.cu).
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::{grid, int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};

const NAME: &str = "argmax_rows";

impl GpuContext {
    /// `out[r] = argmax logits[r, :]` (ties to the smaller id). `logits` f32 [rows, vocab], `out` i32 [rows].
    pub fn launch_argmax_rows(
        &self,
        stream: &CudaStream,
        rows: usize,
        vocab: usize,
        logits: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<i32>,
    ) -> Result<()> {
        check(
            NAME,
            rows > 0 && vocab > 0 && logits.len() >= rows * vocab && out.len() >= rows,
            || {
                format!(
                    "logits {} out {} for {rows} x {vocab}",
                    logits.len(),
                    out.len()
                )
            },
        )?;
        let vi = int(NAME, "vocab", vocab)?;
        let (lp, op) = (ptr(logits, stream), ptr_mut(out, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, rows)?, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(&self.kernels.runner.argmax_rows);
        l.arg(&lp).arg(&vi).arg(&op);
        // SAFETY: argmax_rows(logits, V, out); lengths checked above.
        unsafe { l.launch(cfg) }?;
        Ok(())
    }
}
