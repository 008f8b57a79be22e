//! `rmsnorm`: y = bf16(w * x * (mean(x^2) + eps)^-1/2) per row (see cuda/rmsnorm.cu).
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use half::bf16;

use super::{grid, int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "rmsnorm";

impl GpuContext {
    /// `x` bf16 [rows, d], `w` f32 [d], `y` bf16 [rows, d].
    #[allow(clippy::too_many_arguments)]
    pub fn launch_rmsnorm(
        &self,
        stream: &CudaStream,
        rows: usize,
        d: usize,
        eps: f32,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<f32>,
        y: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        check(NAME, rows > 0 && d > 0, || format!("rows {rows} d {d}"))?;
        check(NAME, x.len() >= rows * d && y.len() >= rows * d, || {
            "x or y shorter than rows*d".into()
        })?;
        check(NAME, w.len() >= d, || {
            format!("w has {}, need {d}", w.len())
        })?;
        let di = int(NAME, "d", d)?;
        let (xp, wp, yp) = (ptr(x, stream), ptr(w, stream), ptr_mut(y, stream));
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, rows)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&xp).arg(&wp).arg(&yp).arg(&di).arg(&eps);
        // SAFETY: rmsnorm_bf16(x, w, y, D, eps) with grid = rows; x, y hold rows*D and w holds D (checked).
        unsafe { self.launch_k(stream, &self.kernels.rmsnorm, cfg, &mut l) }?;
        Ok(())
    }
}
