//! Deterministic random fill of device buffers (see cuda/synth.cu), for full-size synthetic models.
use cudarc::driver::{CudaStream, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::{int, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};

const NAME: &str = "synth_fill";

/// What to write. Each variant fixes the element size it expects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fill {
    /// u8: random e4m3 codes, |v| in [1/8, 3.75] (rms ~1.2).
    E4m3,
    /// u8: two random e2m1 codes per byte (rms 2.93).
    Fp4,
    /// u8: one byte everywhere (UE8M0 scales).
    Byte(u8),
    /// f32: normal-ish * std + mean.
    F32 { std: f32, mean: f32 },
    /// bf16: normal-ish * std + mean.
    Bf16 { std: f32, mean: f32 },
    /// i32: uniform in [0, n).
    Below(u32),
}

impl Fill {
    fn mode(self) -> (i32, f32, f32, usize) {
        match self {
            Fill::E4m3 => (0, 0.0, 0.0, 1),
            Fill::Fp4 => (1, 0.0, 0.0, 1),
            Fill::Byte(b) => (2, f32::from(b), 0.0, 1),
            Fill::F32 { std, mean } => (3, std, mean, 4),
            Fill::Bf16 { std, mean } => (4, std, mean, 2),
            Fill::Below(n) => (5, n as f32, 0.0, 4),
        }
    }
}

impl GpuContext {
    /// Fills `buf` (elements of `T`, whose size must match `fill`) from `seed`.
    pub fn launch_synth_fill<T>(
        &self,
        stream: &CudaStream,
        buf: &mut impl DevicePtrMut<T>,
        seed: u64,
        fill: Fill,
    ) -> Result<()> {
        let (mode, a, b, size) = fill.mode();
        check(NAME, size == std::mem::size_of::<T>(), || {
            format!("{fill:?} needs {size}-byte elements")
        })?;
        check(NAME, !matches!(fill, Fill::Below(0)), || "Below(0)".into())?;
        let n = buf.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let blocks = int(NAME, "blocks", buf.len().div_ceil(256).min(65535))? as u32;
        let p = ptr_mut(buf, stream);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(&self.kernels.runner.synth_fill);
        l.arg(&p).arg(&n).arg(&seed).arg(&mode).arg(&a).arg(&b);
        // SAFETY: synth_fill(p, n, seed, mode, a, b) writes n elements of the mode's size, which equals
        // size_of::<T>() (checked), into a buffer of n elements.
        unsafe { l.launch(cfg) }?;
        Ok(())
    }
}
