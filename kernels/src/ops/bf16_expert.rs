//! `bf16_expert`: grouped routed-expert GEMV over bf16 weights (see cuda/bf16_expert.cu), for checkpoints
//! that store the routed experts in BF16. Grouping by `moe_group`, as for the FP4 experts.
use cudarc::driver::{CudaStream, DevicePtr, LaunchConfig};
use half::bf16;

use super::fp4_expert::{moe_group_meta_len, ExpertShape};
use super::gemv::GemvOut;
use super::{grid, int, ptr};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "bf16_expert";

/// Rows of one expert per block (one per warp; the kernel's BFX_WARPS).
const ROWS_PER_BLOCK: usize = 8;

impl GpuContext {
    /// y[slot, n] for every slot, reading each selected expert's rows once per 8 of its tokens. `w` bf16
    /// [E, N, K], `x` bf16 [B or B*topk, K], `meta` from [`Self::launch_moe_group`], `out` [B*topk, N].
    pub fn launch_bf16_expert<W: DevicePtr<bf16>>(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        w: &W,
        meta: &impl DevicePtr<i32>,
        out: GemvOut<'_>,
    ) -> Result<()> {
        self.bf16x_launch(stream, shape, x, [Some((w, out)), None], meta)
    }

    /// Two matrices of the same shape over the same `x` and grouping in ONE launch (the routed w1 and w3):
    /// the same bits as two [`Self::launch_bf16_expert`] calls.
    pub fn launch_bf16_expert_pair<W: DevicePtr<bf16>>(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        mats: [(&W, GemvOut<'_>); 2],
        meta: &impl DevicePtr<i32>,
    ) -> Result<()> {
        let [a, b] = mats;
        check(NAME, a.1.bf16 == b.1.bf16, || {
            "paired outputs differ in type".into()
        })?;
        self.bf16x_launch(stream, shape, x, [Some(a), Some(b)], meta)
    }

    /// One launch over one or two (weights, output) matrices (grid z picks the matrix).
    fn bf16x_launch<W: DevicePtr<bf16>>(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        mats: [Option<(&W, GemvOut<'_>)>; 2],
        meta: &impl DevicePtr<i32>,
    ) -> Result<()> {
        let (n, k, e) = (shape.n, shape.k, shape.experts);
        let s = shape.b * shape.topk;
        check(NAME, (1..=64).contains(&shape.b) && shape.topk > 0, || {
            format!("batch {} not in 1..=64 or top-k 0", shape.b)
        })?;
        check(NAME, (1..=1024).contains(&e), || {
            format!("{e} experts not in 1..=1024")
        })?;
        check(NAME, n > 0 && k > 0 && k.is_multiple_of(8), || {
            format!("need N > 0, K % 8 == 0: N {n} K {k}")
        })?;
        let xrows = if shape.x_per_slot { s } else { shape.b };
        check(NAME, x.len() >= xrows * k, || {
            format!("x has {}, need {}", x.len(), xrows * k)
        })?;
        check(NAME, meta.len() >= moe_group_meta_len(s), || {
            "meta too short".into()
        })?;
        // (w, out) per matrix; the second repeats the first when absent (never read: grid z = 1).
        let mut p = [(0u64, 0u64); 2];
        let (mut out_bf16, mut z) = (0i32, 0usize);
        for (w, out) in mats.iter().flatten() {
            check(NAME, w.len() >= e * n * k, || {
                format!("w has {} elements, need {}", w.len(), e * n * k)
            })?;
            check(NAME, out.len >= s * n, || {
                format!("out has {}, need {}", out.len, s * n)
            })?;
            p[z] = (ptr(*w, stream), out.ptr);
            out_bf16 = out.bf16;
            z += 1;
        }
        check(NAME, z > 0, || "no matrix".into())?;
        if z == 1 {
            p[1] = p[0];
        }
        let ints = [s, shape.topk, n, k, usize::from(shape.x_per_slot)];
        let names = ["slots", "topk", "N", "K", "x_per_slot"];
        let mut iv = [0i32; 5];
        for (i, (v, name)) in ints.iter().zip(names).enumerate() {
            iv[i] = int(NAME, name, *v)?;
        }
        let (xp, mp) = (ptr(x, stream), ptr(meta, stream));
        // Fixed grid (graph-capturable): blocks past the device's group count exit.
        let cfg = LaunchConfig {
            grid_dim: (
                grid(NAME, n.div_ceil(ROWS_PER_BLOCK))?,
                grid(NAME, e.min(s))?,
                grid(NAME, z)?,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&xp).arg(&p[0].0).arg(&mp).arg(&p[0].1);
        l.arg(&p[1].0).arg(&p[1].1);
        for v in &iv {
            l.arg(v);
        }
        l.arg(&out_bf16);
        // SAFETY: bf16_expert(x, w, meta, out, w_b, out_b, S, topk, N, K, x_per_slot, out_bf16); buffers
        // checked above for each matrix; expert ids come from meta, which moe_group only fills with ids in
        // [0, E).
        unsafe { self.launch_k(stream, &self.kernels.bf16_expert, cfg, &mut l) }?;
        Ok(())
    }
}
