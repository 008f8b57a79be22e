//! Decode GEMVs with FP8 activations (cuda/gemv_wq8.cu, sm_90a only): the official FP8 linear as e4m3 x e4m3
//! wgmma, for inputs that the official numerics quantise anyway (act_quant with 128-wide blocks). The ring's
//! grid, split-K plan and scratch; x comes as e4m3 codes plus f32 scales ([`GemvQ8X`]).
use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaStream, DeviceRepr};

use super::gemv::{GemvParams, GemvWeights, GEMV_GROUPS};
use super::gemv_plan::check_groups_and_scratch;
use super::gemv_q8::q8_allowed;
use super::gemv_ring::ring_splits_ok;
use super::gemv_wg::{resolve_ring, WgKernel, BLOCK_ROWS};
use crate::context::{nt_index, GpuContext};
use crate::error::{check, KernelError, Result};
use crate::launch::Args;
use crate::module::ModuleSource;

const NAME: &str = "gemv_wq8";

/// K values of one act_quant block (and of one K step).
pub const GEMV_Q8_BLOCK: usize = 128;

const KERNEL_NAMES: [&str; 4] = [
    "gemv_wq8_nt1",
    "gemv_wq8_nt2",
    "gemv_wq8_nt4",
    "gemv_wq8_nt8",
];

/// The FP8 inputs of a launch: per group g, `xq[g]` e4m3 codes `[b, k]` and `xs[g]` f32 scales
/// `[b, k / 128]` (what `launch_act_quant` with block 128 writes). Mirrors the C struct GemvQ8X.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GemvQ8X {
    pub xq: [u64; GEMV_GROUPS],
    pub xs: [u64; GEMV_GROUPS],
}

// SAFETY: #[repr(C)] arrays of u64 laid out as the C struct GemvQ8X in cuda/gemv_wq8.cu; no references.
unsafe impl DeviceRepr for GemvQ8X {}

/// `gemv_wq8_nt{1,2,4,8}`; `None` where no ring depth fits the device.
#[derive(Debug, Clone)]
pub struct Wq8Kernels {
    pub k: [Option<WgKernel>; 4],
}

/// Bytes of one stage: the x tile (1 KB per 8 batch columns), then the block's weight rows x 128 B; plus its
/// slot of the scale ring (16 B for the weight scale's word, 4 B per batch column: GQ8_SBYTES), reserved at every
/// width so the depths stay one rule (the kernel uses it at NT 4-8, GQ8_SCALE_RING; at NT 1-2 the slot's 48-80 B
/// leave the depth unchanged).
fn stage_bytes(nt: usize) -> usize {
    nt * 1024 + BLOCK_ROWS * 128 + 16 + nt * 32
}

impl Wq8Kernels {
    /// Resolves every instance (traps outside the sm_90a SASS: [`GpuContext::wq8_ring`] decides whether they
    /// run), each with the ring depth of [`resolve_ring`].
    pub(crate) fn resolve(module: &Arc<CudaModule>) -> Result<Self> {
        let one = |slot: usize| -> Result<Option<WgKernel>> {
            resolve_ring(
                super::kernel(module, KERNEL_NAMES[slot])?,
                stage_bytes(1 << slot),
            )
        };
        Ok(Wq8Kernels {
            k: [one(0)?, one(1)?, one(2)?, one(3)?],
        })
    }
}

impl GpuContext {
    /// The FP8-activation kernel for `rows` rows where it runs here: a cc 9.0 device with the nvcc fatbin.
    pub fn wq8_ring(&self, rows: usize) -> Option<&WgKernel> {
        if self.info.cc != (9, 0) || self.source != ModuleSource::Fatbin || !q8_allowed() {
            return None;
        }
        self.kernels.gemv_wq8.k[nt_index(rows)].as_ref()
    }

    /// y = dequant(xq) W^T over the first `groups` groups: `p` as for [`GpuContext::launch_gemv_grouped`] with
    /// FP8 weights (its `x` unused), `q` the e4m3 inputs; `splits` from `gemv_splits(.., GemvPath::Ring)`;
    /// `depth` ring stages (0: the default). Needs [`GpuContext::wq8_ring`] for `p.b` rows.
    ///
    /// # Safety
    /// For g < groups: `q.xq[g]` holds `b*k` bytes and `q.xs[g]` `b*k/128` f32, `p.w[g]` `n[g]*k` e4m3 bytes
    /// with `p.s[g]` their UE8M0 scales, `p.out[g]` `b*n[g]` outputs; `p.ws` / `p.cnt` hold `ws_len` f32 /
    /// `cnt_len` zeroed u32.
    pub unsafe fn launch_gemv_wq8(
        &self,
        s: &CudaStream,
        (groups, splits, depth): (usize, usize, usize),
        p: &GemvParams,
        q: &GemvQ8X,
        ws_len: usize,
        cnt_len: usize,
    ) -> Result<()> {
        let (b, k, nmax) = p.dims();
        let kern = self.wq8_ring(b).ok_or_else(|| KernelError::Shape {
            kernel: NAME,
            what: format!("no FP8-activation GEMV for {b} rows on this device"),
        })?;
        check_groups_and_scratch(NAME, p, (groups, splits), (ws_len, cnt_len))?;
        check(
            NAME,
            (1..=64).contains(&b)
                && k > 0
                && k.is_multiple_of(GEMV_Q8_BLOCK)
                && ring_splits_ok(splits, k, GemvWeights::Fp8),
            || format!("B {b} K {k} splits {splits} (K % {GEMV_Q8_BLOCK} == 0)"),
        )?;
        let (cfg, depth) = kern.launch_cfg(NAME, depth, (nmax, splits, groups))?;
        let mut a = Args::new();
        a.arg(p).arg(q).arg(&depth);
        // SAFETY: caller's contract; shapes, splits and scratch checked above; the kernel's dynamic shared memory
        // was raised to that of depth_max stages at resolve, and wq8_ring only hands out the sm_90a build.
        unsafe { self.launch_k(s, &kern.f, cfg, &mut a) }
    }
}
