//! `fp4_expert`: grouped routed-expert GEMV over FP4 weights (see cuda/fp4_expert.cu), and `moe_group`
//! (cuda/moe_group.cu).
use cudarc::driver::{CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use half::bf16;

use super::gemv::GemvOut;
use super::{grid, int, ptr, ptr_mut};
use crate::context::GpuContext;
use crate::error::{check, Result};
use crate::launch::Args;

const NAME: &str = "fp4_expert";

/// i32 elements of the `meta` buffer that `moe_group` fills for `slots` = B * topk, plus the counter of
/// `moe_route_group` (the buffer's last element, whatever the launch's rows): allocate it zeroed (the
/// kernel leaves the counter at zero after each launch).
pub fn moe_group_meta_len(slots: usize) -> usize {
    3 + 3 * slots
}

/// Shape of one grouped expert GEMV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertShape {
    /// Tokens.
    pub b: usize,
    /// Experts per token.
    pub topk: usize,
    /// Experts in the weight buffer.
    pub experts: usize,
    /// Output rows per expert.
    pub n: usize,
    /// Input width (logical fp4 values per row).
    pub k: usize,
    /// Input row per slot (w2: each slot has its own hidden vector) instead of per token (w1, w3).
    pub x_per_slot: bool,
}

impl ExpertShape {
    fn slots(&self) -> usize {
        self.b * self.topk
    }
}

/// Launch tuning of `fp4_expert` (the kernel's header comment has the measurements behind the defaults). With
/// 32-row warps at the model's shapes and default K split the launchers run a fixed-size kernel ([`FP4_FIXED`]);
/// `mt` leaves the bits alone (each output is the same sums in the same order; tests/gpu/expert_fixed.rs compares
/// them bit for bit), `kw` changes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp4Tune {
    /// Warps that split K for each row group (1, 2 or 4; a block's 4 warps cover 4 / kw row groups).
    pub kw: usize,
    /// 16-row mma tiles per warp (1 or 2): a row group is 16 * mt rows.
    pub mt: usize,
}

impl Fp4Tune {
    /// The default for `shape`: 32-row warps, K split so that each warp streams about 8 of the 128-wide
    /// chunks (kw 4 for K = 4096, kw 2 for K = 2048). Measured (kbench, BENCH_NOTES 2026-11-30, with the
    /// device layouts): 32-row warps beat 16-row ones at every batch, batch 1 included (w1 19.3 vs 20.2 us),
    /// and for w2 (K = 2048) kw 2 beat kw 4 at batch 64 (336 vs 356 us) and tied below. The rule reads the
    /// shape's K only, never the batch or the group count, so a token's bits are the same at every batch.
    pub fn for_shape(shape: &ExpertShape) -> Self {
        let chunks = shape.k.div_ceil(128);
        Fp4Tune {
            kw: (chunks / 8).clamp(1, 4),
            mt: 2,
        }
    }

    /// Rows of one expert that a block of 4 warps covers.
    pub(super) fn block_rows(&self) -> usize {
        16 * self.mt * 4 / self.kw
    }
}

/// One of the kernels with the model's sizes compiled in (`fp4_expert_fixed` in cuda/fp4_expert.cu): the same
/// bits as fp4_expert_mt2 with `kw`, fewer instructions; the launchers take it for 32-row warps whenever the
/// shape and `kw` match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp4Fixed {
    pub n: usize,
    pub k: usize,
    pub kw: usize,
    pub name: &'static str,
}

/// The fixed-size kernels: the routed w1 / w3 (2048 x 4096) and w2 (4096 x 2048) of DeepSeek-V4-Flash with the
/// default K split (Fp4Tune::for_shape).
pub const FP4_FIXED: [Fp4Fixed; 2] = [
    Fp4Fixed {
        n: 2048,
        k: 4096,
        kw: 4,
        name: "fp4_expert_n2048k4096w4",
    },
    Fp4Fixed {
        n: 4096,
        k: 2048,
        kw: 2,
        name: "fp4_expert_n4096k2048w2",
    },
];

impl GpuContext {
    /// The kernel a launch of `shape` with `tune` runs: a fixed-size one where one matches, else fp4_expert_mtM.
    fn fp4_kernel(&self, shape: &ExpertShape, tune: Fp4Tune) -> &CudaFunction {
        let fixed = self
            .kernels
            .fp4_expert_fixed
            .iter()
            .find(|(f, _)| tune.mt == 2 && f.n == shape.n && f.k == shape.k && f.kw == tune.kw);
        match fixed {
            Some((_, func)) => func,
            None => &self.kernels.fp4_expert[tune.mt.clamp(1, 2) - 1],
        }
    }

    /// Groups the B*topk expert ids (i32, device) by expert into `meta` (see [`moe_group_meta_len`]).
    /// Run once per MoE layer; w1, w3 and w2 launches reuse it.
    pub fn launch_moe_group(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        ids: &impl DevicePtr<i32>,
        meta: &mut impl DevicePtrMut<i32>,
    ) -> Result<()> {
        let s = shape.slots();
        check(NAME, s > 0 && ids.len() >= s, || {
            format!("ids has {} entries, need {s}", ids.len())
        })?;
        check(NAME, (1..=1024).contains(&shape.experts), || {
            format!("{} experts > 1024", shape.experts)
        })?;
        let need = moe_group_meta_len(s);
        check(NAME, meta.len() >= need, || {
            format!("meta has {}, need {need}", meta.len())
        })?;
        let (si, ei) = (int(NAME, "slots", s)?, int(NAME, "experts", shape.experts)?);
        let (ip, mp) = (ptr(ids, stream), ptr_mut(meta, stream));
        // 256 threads: every loop strides by the block, and at decode sizes (S <= 384, E = 256) the
        // barriers of 32 mostly idle warps cost more than the work (ncu, S = 6: 69% of warp time at barriers).
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&ip).arg(&si).arg(&ei).arg(&mp);
        // SAFETY: moe_group(ids, S, E, meta); ids holds S ids, meta holds 2 + 3S ints (checked above).
        unsafe { self.launch_k(stream, &self.kernels.moe_group, cfg, &mut l) }?;
        Ok(())
    }

    /// y[slot, n] for every slot, reading each selected expert's weights once. `w` u8 [E, N, K/2],
    /// `scale` u8 UE8M0 [E, N, K/32], `x` bf16 [B or B*topk, K], `meta` from [`Self::launch_moe_group`],
    /// `out` [B*topk, N].
    #[allow(clippy::too_many_arguments)]
    pub fn launch_fp4_expert<W: DevicePtr<u8>>(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        w: &W,
        scale: &W,
        meta: &impl DevicePtr<i32>,
        out: GemvOut<'_>,
    ) -> Result<()> {
        let tune = Fp4Tune::for_shape(shape);
        self.launch_fp4_expert_tuned(stream, shape, x, w, scale, meta, out, tune)
    }

    /// [`Self::launch_fp4_expert`] with an explicit [`Fp4Tune`] (benchmarks and tests of every variant).
    #[allow(clippy::too_many_arguments)]
    pub fn launch_fp4_expert_tuned<W: DevicePtr<u8>>(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        w: &W,
        scale: &W,
        meta: &impl DevicePtr<i32>,
        out: GemvOut<'_>,
        tune: Fp4Tune,
    ) -> Result<()> {
        let m = Fp4Mat { w, scale, out };
        let func = self.fp4_kernel(shape, tune);
        self.fp4_launch(stream, func, shape, x, [Some(m), None], meta, tune, false)
    }

    /// [`Self::launch_fp4_expert_tuned`] (one matrix) or [`Self::launch_fp4_expert_pair`] (two) on the generic
    /// kernel fp4_expert_mtM even where a fixed-size one matches: the reference those are tested against, and
    /// the baseline of benchmarks.
    pub fn launch_fp4_expert_generic<W: DevicePtr<u8>>(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        mats: [Option<Fp4Mat<'_, W>>; 2],
        meta: &impl DevicePtr<i32>,
        tune: Fp4Tune,
    ) -> Result<()> {
        let func = &self.kernels.fp4_expert[tune.mt.clamp(1, 2) - 1];
        self.fp4_launch(stream, func, shape, x, mats, meta, tune, false)
    }

    /// Two matrices of the same shape over the same `x` and grouping in ONE launch (the routed w1 and w3):
    /// the same bits as two [`Self::launch_fp4_expert_tuned`] calls with `tune` (None: the default for
    /// `shape`), one fewer dependent launch.
    pub fn launch_fp4_expert_pair<W: DevicePtr<u8>>(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        mats: [Fp4Mat<'_, W>; 2],
        meta: &impl DevicePtr<i32>,
        tune: Option<Fp4Tune>,
    ) -> Result<()> {
        let tune = tune.unwrap_or_else(|| Fp4Tune::for_shape(shape));
        let [a, b] = mats;
        check(NAME, a.out.bf16 == b.out.bf16, || {
            "paired outputs differ in type".into()
        })?;
        let func = self.fp4_kernel(shape, tune);
        self.fp4_launch(
            stream,
            func,
            shape,
            x,
            [Some(a), Some(b)],
            meta,
            tune,
            false,
        )
    }

    /// [`Self::launch_fp4_expert`] of `m` when `meta` was written two or more launches before this one (the routed
    /// w2 after a separate SwiGLU launch): a fixed-size kernel's blocks then issue their first weight chunks before
    /// they wait for the previous kernel (x's producer), so under PDL those loads overlap its run. The same bits.
    pub fn launch_fp4_expert_table_ready<W: DevicePtr<u8>>(
        &self,
        stream: &CudaStream,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        m: Fp4Mat<'_, W>,
        meta: &impl DevicePtr<i32>,
    ) -> Result<()> {
        let tune = Fp4Tune::for_shape(shape);
        let func = self.fp4_kernel(shape, tune);
        self.fp4_launch(stream, func, shape, x, [Some(m), None], meta, tune, true)
    }

    /// One launch over one or two matrices (grid z picks the matrix); `pre_issue`: see
    /// [`Self::launch_fp4_expert_table_ready`].
    #[allow(clippy::too_many_arguments)]
    fn fp4_launch<W: DevicePtr<u8>>(
        &self,
        stream: &CudaStream,
        func: &CudaFunction,
        shape: &ExpertShape,
        x: &impl DevicePtr<bf16>,
        mats: [Option<Fp4Mat<'_, W>>; 2],
        meta: &impl DevicePtr<i32>,
        tune: Fp4Tune,
        pre_issue: bool,
    ) -> Result<()> {
        check(
            NAME,
            matches!(tune.kw, 1 | 2 | 4) && matches!(tune.mt, 1 | 2),
            || format!("{tune:?}: need kw 1, 2 or 4 and mt 1 or 2"),
        )?;
        let (s, n, k) = (shape.slots(), shape.n, shape.k);
        check(NAME, (1..=64).contains(&shape.b), || {
            format!("batch {} not in 1..=64", shape.b)
        })?;
        check(NAME, n > 0 && k > 0 && k.is_multiple_of(32), || {
            format!("need N > 0, K % 32 == 0: N {n} K {k}")
        })?;
        let xrows = if shape.x_per_slot { s } else { shape.b };
        check(NAME, x.len() >= xrows * k, || {
            format!("x has {}, need {}", x.len(), xrows * k)
        })?;
        check(NAME, meta.len() >= moe_group_meta_len(s), || {
            "meta too short".into()
        })?;
        // (w, s, out) per matrix; the kernel takes the second as byte offsets from the first (zero when
        // absent: grid z = 1 never applies them).
        let mut p = [(0u64, 0u64, 0u64); 2];
        let mut out_bf16 = 0i32;
        let mut z = 0usize;
        for m in mats.iter().flatten() {
            check_mat(shape, m)?;
            p[z] = (ptr(m.w, stream), ptr(m.scale, stream), m.out.ptr);
            out_bf16 = m.out.bf16;
            z += 1;
        }
        check(NAME, z > 0, || "no matrix".into())?;
        if z == 1 {
            p[1] = p[0];
        }
        let d = (
            p[1].0.wrapping_sub(p[0].0),
            p[1].1.wrapping_sub(p[0].1),
            p[1].2.wrapping_sub(p[0].2),
        );
        let ints = [s, shape.topk, n, k, usize::from(shape.x_per_slot), tune.kw];
        let names = ["slots", "topk", "N", "K", "x_per_slot", "kw"];
        let mut iv = [0i32; 6];
        for (i, (v, name)) in ints.iter().zip(names).enumerate() {
            iv[i] = int(NAME, name, *v)?;
        }
        let (xp, mp) = (ptr(x, stream), ptr(meta, stream));
        // A block covers block_rows() rows of one group; blocks past the device's group count exit.
        let cfg = LaunchConfig {
            grid_dim: (
                grid(NAME, n.div_ceil(tune.block_rows()))?,
                grid(NAME, shape.experts.min(s))?,
                grid(NAME, z)?,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Args::new();
        l.arg(&xp).arg(&p[0].0).arg(&p[0].1).arg(&mp).arg(&p[0].2);
        l.arg(&d.0).arg(&d.1).arg(&d.2);
        for v in &iv[..5] {
            l.arg(v);
        }
        let pre = i32::from(pre_issue);
        l.arg(&out_bf16).arg(&iv[5]).arg(&pre);
        // SAFETY: fp4_expert_mtX or fp4_expert_n{N}k{K}w{KW} (x, w, s, meta, out, dw, ds, dout, S, topk, N, K,
        // x_per_slot, out_bf16, kw, pre_issue: the caller's word that meta is complete); buffers checked above
        // for `shape` (check_mat for each matrix; block z reads matrix z at base + z * offset); a fixed-size
        // kernel is only passed in (fp4_kernel) when its N, K and kw are the shape's and the tune's; expert ids come
        // from meta, which moe_group only fills with ids in [0, E).
        unsafe { self.launch_k(stream, func, cfg, &mut l) }?;
        Ok(())
    }
}

/// One matrix of a grouped FP4 expert launch: weights u8 [E, N, K/2], scales u8 UE8M0 [E, N, K/32] and
/// the output [B*topk, N].
pub struct Fp4Mat<'a, W: DevicePtr<u8>> {
    pub w: &'a W,
    pub scale: &'a W,
    pub out: GemvOut<'a>,
}

/// The buffer lengths of one matrix for `shape`.
pub(super) fn check_mat<W: DevicePtr<u8>>(shape: &ExpertShape, m: &Fp4Mat<'_, W>) -> Result<()> {
    let (e, n, k, s) = (shape.experts, shape.n, shape.k, shape.slots());
    check(NAME, m.w.len() >= e * n * k / 2, || {
        format!("w has {} bytes, need {}", m.w.len(), e * n * k / 2)
    })?;
    let slen = e * n * k / 32;
    check(NAME, m.scale.len() >= slen, || {
        format!("scale has {} bytes, need {slen}", m.scale.len())
    })?;
    check(NAME, m.out.len >= s * n, || {
        format!("out has {}, need {}", m.out.len, s * n)
    })
}
