//! `act_quant`: per-block FP8 e4m3 quantisation with UE8M0 scales (see cuda/act_quant.cu).
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use half::bf16;

use super::{grid, int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "act_quant";

impl GpuContext {
    fn act_quant_check(&self, x_len: usize, rows: usize, d: usize, block: usize) -> Result<i32> {
        check(
            NAME,
            block.is_multiple_of(32) && (32..=256).contains(&block),
            || format!("block {block}"),
        )?;
        check(NAME, rows > 0 && d > 0 && d.is_multiple_of(block), || {
            format!("d {d} not a multiple of {block}")
        })?;
        check(NAME, x_len >= rows * d, || {
            format!("x has {x_len}, need {}", rows * d)
        })?;
        int(NAME, "blocks", rows * d / block)
    }

    fn act_quant_launch(
        &self,
        stream: &CudaStream,
        nblocks: i32,
        block: usize,
        p: [u64; 4],
    ) -> Result<()> {
        let gi = int(NAME, "block", block)?;
        let cfg = LaunchConfig {
            grid_dim: (grid(NAME, (nblocks as usize).div_ceil(8))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&p[0])
            .arg(&nblocks)
            .arg(&gi)
            .arg(&p[1])
            .arg(&p[2])
            .arg(&p[3]);
        // SAFETY: act_quant_bf16(x, nblocks, G, q, scales, deq); callers checked every non-null buffer holds
        // nblocks*G values (x, q, deq) or nblocks scales; null outputs are skipped by the kernel.
        unsafe { self.launch_k(stream, &self.kernels.act_quant, cfg, &mut l) }?;
        Ok(())
    }

    /// Quantises `x` bf16 [rows, d] to e4m3 codes `q` [rows, d] and f32 scales [rows, d/block].
    #[allow(clippy::too_many_arguments)]
    pub fn launch_act_quant(
        &self,
        stream: &CudaStream,
        rows: usize,
        d: usize,
        block: usize,
        x: &impl DevicePtr<bf16>,
        q: &mut impl DevicePtrMut<u8>,
        scales: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let nb = self.act_quant_check(x.len(), rows, d, block)?;
        check(NAME, q.len() >= rows * d, || "q too short".into())?;
        check(NAME, scales.len() >= rows * d / block, || {
            "scales too short".into()
        })?;
        let p = [
            ptr(x, stream),
            ptr_mut(q, stream),
            ptr_mut(scales, stream),
            0,
        ];
        self.act_quant_launch(stream, nb, block, p)
    }

    /// The QAT simulation `Q8(x, block)`: writes bf16(e4m3(x/s) * s) to `out` (may be `x`'s own buffer
    /// only through a separate launch on a copy: pass distinct buffers from safe code).
    #[allow(clippy::too_many_arguments)]
    pub fn launch_act_quant_fake(
        &self,
        stream: &CudaStream,
        rows: usize,
        d: usize,
        block: usize,
        x: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<bf16>,
    ) -> Result<()> {
        let nb = self.act_quant_check(x.len(), rows, d, block)?;
        check(NAME, out.len() >= rows * d, || "out too short".into())?;
        let p = [ptr(x, stream), 0, 0, ptr_mut(out, stream)];
        self.act_quant_launch(stream, nb, block, p)
    }
}
