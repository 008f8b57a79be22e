//! The model runner's kernels (mhc.cu, moe_route.cu, sample*.cu, synth.cu), resolved once.
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaModule};

use crate::error::Result;

/// Runner kernels; a field of [`crate::Kernels`].
#[derive(Debug, Clone)]
pub struct RunnerKernels {
    pub embed_streams: CudaFunction,
    /// hc_mix_partial24_mg{1,2,4,8} (block mixers), hc_mix_partial4_mg{1,2,4,8} (HC head): one per
    /// split of the 8 warps into mix groups (see ops::mhc `mix_groups`).
    pub hc_mix_partial: [[CudaFunction; 4]; 2],
    /// hc_post_mix{24,4}_mg{1,2,4,8}: the same after the previous mixer's HCPost (fused).
    pub hc_post_mix: [[CudaFunction; 4]; 2],
    /// hc_finish24, hc_finish4.
    pub hc_finish: [CudaFunction; 2],
    pub hc_post: CudaFunction,
    /// The prefill forms (mhc_wide.cu): hc_mix_tile24, hc_finish24_wide, hc_post8.
    pub hc_wide: HcWideKernels,
    pub moe_route: CudaFunction,
    /// moe_route + moe_group in one launch (ops::moe_route).
    pub moe_route_group: CudaFunction,
    pub moe_swiglu: CudaFunction,
    pub fake_quant_rows: CudaFunction,
    pub argmax_rows: CudaFunction,
    pub sample_rows: CudaFunction,
    pub synth_fill: CudaFunction,
}

/// mHC kernels for calls of many rows (see ops::mhc `tile_min`).
#[derive(Debug, Clone)]
pub struct HcWideKernels {
    pub tile: CudaFunction,
    pub finish: CudaFunction,
    pub post: CudaFunction,
}

impl RunnerKernels {
    pub(crate) fn resolve(module: &Arc<CudaModule>) -> Result<Self> {
        let get = |name: &'static str| super::kernel(module, name);
        let tile = get("hc_mix_tile24")?;
        super::opt_in_smem(&tile, super::mhc::TILE_SMEM)?;
        // Two 88 KB blocks per SM: ask for the largest shared-memory carveout.
        tile.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            100,
        )?;
        Ok(RunnerKernels {
            embed_streams: get("embed_streams")?,
            hc_mix_partial: [
                [
                    get("hc_mix_partial24_mg1")?,
                    get("hc_mix_partial24_mg2")?,
                    get("hc_mix_partial24_mg4")?,
                    get("hc_mix_partial24_mg8")?,
                ],
                [
                    get("hc_mix_partial4_mg1")?,
                    get("hc_mix_partial4_mg2")?,
                    get("hc_mix_partial4_mg4")?,
                    get("hc_mix_partial4_mg8")?,
                ],
            ],
            hc_post_mix: [
                [
                    get("hc_post_mix24_mg1")?,
                    get("hc_post_mix24_mg2")?,
                    get("hc_post_mix24_mg4")?,
                    get("hc_post_mix24_mg8")?,
                ],
                [
                    get("hc_post_mix4_mg1")?,
                    get("hc_post_mix4_mg2")?,
                    get("hc_post_mix4_mg4")?,
                    get("hc_post_mix4_mg8")?,
                ],
            ],
            hc_finish: [get("hc_finish24")?, get("hc_finish4")?],
            hc_post: get("hc_post")?,
            hc_wide: HcWideKernels {
                tile,
                finish: get("hc_finish24_wide")?,
                post: get("hc_post8")?,
            },
            moe_route: get("moe_route")?,
            moe_route_group: get("moe_route_group")?,
            moe_swiglu: get("moe_swiglu")?,
            fake_quant_rows: get("fake_quant_rows")?,
            argmax_rows: get("argmax_rows")?,
            sample_rows: get("sample_rows")?,
            synth_fill: get("synth_fill")?,
        })
    }
}
