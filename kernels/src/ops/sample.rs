//! Sampling on the device: greedy (cuda/sample.cu) and filtered (cuda/sample_filters.cu).
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::{grid, int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};

const NAME: &str = "argmax_rows";
const SAMPLE: &str = "sample_rows";

/// f64 values per row of [`GpuContext::launch_sample_rows`]'s params: temperature, top_k, top_p,
/// min_p, uniform.
pub const SAMPLE_PARAMS_PER_ROW: usize = 5;

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

    /// One token per row drawn with that row's filters (see cuda/sample_filters.cu for the exact
    /// rule; greedy rows take the argmax). `logits` f32 [rows, vocab]; `params` f64
    /// [rows, SAMPLE_PARAMS_PER_ROW]; `scratch` f32 [rows, vocab] (overwritten); `out` i32 [rows].
    #[allow(clippy::too_many_arguments)]
    pub fn launch_sample_rows(
        &self,
        stream: &CudaStream,
        rows: usize,
        vocab: usize,
        logits: &impl DevicePtr<f32>,
        params: &impl DevicePtr<f64>,
        scratch: &mut impl DevicePtrMut<f32>,
        out: &mut impl DevicePtrMut<i32>,
    ) -> Result<()> {
        let n = rows * vocab;
        check(
            SAMPLE,
            rows > 0
                && vocab > 0
                && logits.len() >= n
                && scratch.len() >= n
                && params.len() >= rows * SAMPLE_PARAMS_PER_ROW
                && out.len() >= rows,
            || {
                format!(
                    "logits {} params {} scratch {} out {} for {rows} x {vocab}",
                    logits.len(),
                    params.len(),
                    scratch.len(),
                    out.len()
                )
            },
        )?;
        let vi = int(SAMPLE, "vocab", vocab)?;
        let (lp, pp) = (ptr(logits, stream), ptr(params, stream));
        let (sp, op) = (ptr_mut(scratch, stream), ptr_mut(out, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(SAMPLE, rows)?, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(&self.kernels.runner.sample_rows);
        l.arg(&lp).arg(&vi).arg(&pp).arg(&sp).arg(&op);
        // SAFETY: sample_rows(logits, V, params, scratch, out); lengths checked above.
        unsafe { l.launch(cfg) }?;
        Ok(())
    }
}
