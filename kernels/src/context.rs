use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};

use crate::error::Result;
use crate::module::{self, ModuleSource};
use crate::probe::{self, GpuInfo};

/// Every kernel of the module, resolved once at start.
#[derive(Debug, Clone)]
pub struct Kernels {
    /// Grouped FP8 / bf16 GEMVs with in-kernel split-K (gemv.cu).
    pub gemv: crate::ops::gemv::GemvKernels,
    /// The ring GEMVs (gemv_ring.cu, mma.sync).
    pub gemv_ring: crate::ops::gemv_ring::RingKernels,
    /// The ring GEMVs on wgmma (gemv_wg.cu, sm_90a; see GpuContext::wg_ring).
    pub gemv_wg: crate::ops::gemv_wg::WgKernels,
    /// The FP8-activation GEMVs on wgmma (gemv_wq8.cu, sm_90a; see GpuContext::wq8_ring).
    pub gemv_wq8: crate::ops::gemv_wq8::Wq8Kernels,
    /// fp4_expert_mt{1,2}: 16 or 32 rows per warp (see ops::fp4_expert::Fp4Tune).
    pub fp4_expert: [CudaFunction; 2],
    /// fp4_expert_n{N}k{K}w{KW}: fp4_expert_mt2 with the model's sizes compiled in (ops::fp4_expert::FP4_FIXED).
    pub fp4_expert_fixed: Vec<(crate::ops::fp4_expert::Fp4Fixed, CudaFunction)>,
    /// fp4_routed_up_n2048k4096w4: the w1 / w3 pair with the routing in the same launch (ops::fp4_routed).
    pub fp4_routed_up: CudaFunction,
    /// fp4_swiglu_down_n4096k2048w2: the routed w2 with the SwiGLU in the same launch (ops::fp4_swiglu_down).
    pub fp4_swiglu_down: CudaFunction,
    /// fp4_to_device_layout: FP4 expert weights into the layout the expert kernels decode (ops::fp4_layout).
    pub fp4_layout: CudaFunction,
    /// fp4_rows_to_tiles: then their rows into 2 KB tiles where the shape allows (ops::fp4_layout).
    pub fp4_tiles: CudaFunction,
    /// fp4_scales_to_device_layout: their scales (ops::fp4_layout).
    pub fp4_scales_layout: CudaFunction,
    /// bf16_expert: routed experts of BF16 checkpoints (ops::bf16_expert).
    pub bf16_expert: CudaFunction,
    pub moe_group: CudaFunction,
    pub rmsnorm: CudaFunction,
    pub act_quant: CudaFunction,
    /// The model runner's kernels (mHC, routing, bf16 GEMV, sampling, synthetic fill).
    pub runner: crate::ops::runner::RunnerKernels,
    // attention kernels
    pub attn: crate::ops::attn_params::AttnKernels,
    /// Glue of the model split over ranks (split.cu).
    pub split: crate::ops::split::SplitKernels,
    /// The batched-prefill kernels (prefill_*.cu).
    pub prefill: crate::ops::prefill_params::PrefillKernels,
}

impl Kernels {
    fn resolve(module: &Arc<CudaModule>) -> Result<Self> {
        let get = |name: &'static str| crate::ops::kernel(module, name);
        let fp4_expert = [get("fp4_expert_mt1")?, get("fp4_expert_mt2")?];
        let fp4_expert_fixed = crate::ops::fp4_expert::FP4_FIXED
            .iter()
            .map(|f| Ok((*f, get(f.name)?)))
            .collect::<Result<Vec<_>>>()?;
        let fp4_routed_up = get("fp4_routed_up_n2048k4096w4")?;
        let fp4_swiglu_down = get("fp4_swiglu_down_n4096k2048w2")?;
        let fixed = fp4_expert_fixed.iter().map(|(_, f)| f);
        let fused = [&fp4_routed_up, &fp4_swiglu_down];
        for f in fp4_expert.iter().chain(fixed).chain(fused) {
            // Their cp.async rings set the blocks per SM (7 or 8): ask for the largest shared-memory carveout.
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )?;
        }
        Ok(Kernels {
            gemv: crate::ops::gemv::GemvKernels::resolve(module)?,
            gemv_ring: crate::ops::gemv_ring::RingKernels::resolve(module)?,
            gemv_wg: crate::ops::gemv_wg::WgKernels::resolve(module)?,
            gemv_wq8: crate::ops::gemv_wq8::Wq8Kernels::resolve(module)?,
            fp4_expert,
            fp4_expert_fixed,
            fp4_routed_up,
            fp4_swiglu_down,
            fp4_layout: get("fp4_to_device_layout")?,
            fp4_tiles: get("fp4_rows_to_tiles")?,
            fp4_scales_layout: get("fp4_scales_to_device_layout")?,
            bf16_expert: get("bf16_expert")?,
            moe_group: get("moe_group")?,
            rmsnorm: get("rmsnorm_bf16")?,
            act_quant: get("act_quant_bf16")?,
            runner: crate::ops::runner::RunnerKernels::resolve(module)?,
            // attention kernels
            attn: crate::ops::attn_params::AttnKernels::resolve(module)?,
            split: crate::ops::split::SplitKernels::resolve(module)?,
            prefill: crate::ops::prefill_params::PrefillKernels::resolve(module)?,
        })
    }
}

/// One device: context (event tracking off, so CUDA-graph capture works), a work stream, the kernels.
pub struct GpuContext {
    pub ctx: Arc<CudaContext>,
    /// A non-default stream: capture graphs on this (never on the legacy default stream).
    pub stream: Arc<CudaStream>,
    pub info: GpuInfo,
    pub kernels: Kernels,
    pub source: ModuleSource,
    /// Programmatic dependent launch for the launchers of this crate (see launch.rs).
    pub pdl: bool,
}

impl GpuContext {
    /// Creates the context on `ordinal`; fails with `KernelError::NoGpu` (never panics) without a driver.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::create(ordinal, false)
    }

    /// Like [`GpuContext::new`] but always compiles the kernels with NVRTC (tests the fallback path).
    pub fn new_nvrtc(ordinal: usize) -> Result<Self> {
        Self::create(ordinal, true)
    }

    fn create(ordinal: usize, force_nvrtc: bool) -> Result<Self> {
        // Probing first also guards CudaContext::new, which panics when libcuda is missing.
        probe::Gpu::probe_reason(ordinal)?;
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: called before any stream or allocation exists; we order cross-stream work ourselves
        // (cudarc's per-allocation events break CUDA-graph capture with STREAM_CAPTURE_ISOLATION).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let info = probe::info_of(&ctx)?;
        let (module, source) = module::load(&ctx, info.cc, force_nvrtc)?;
        let kernels = Kernels::resolve(&module)?;
        let pdl = crate::launch::pdl_wanted(info.cc.0);
        Ok(GpuContext {
            ctx,
            stream,
            info,
            kernels,
            source,
            pdl,
        })
    }
}

impl GpuContext {
    /// Launches `f` with `args` (PDL when enabled for this context).
    ///
    /// # Safety
    /// As [`crate::launch::launch`]: `args` match the kernel, addresses are valid, the kernel waits
    /// (`pdl_wait`) before touching memory that earlier kernels use.
    pub(crate) unsafe fn launch_k(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        args: &mut crate::launch::Args<'_>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { crate::launch::launch(stream, f, cfg, args, self.pdl) }
    }
}

/// Index into the `[nt1, nt2, nt4, nt8]` kernel arrays for `cols` mma columns (tokens), 1..=64.
pub(crate) fn nt_index(cols: usize) -> usize {
    match cols.div_ceil(8) {
        0 | 1 => 0,
        2 => 1,
        3 | 4 => 2,
        _ => 3,
    }
}
