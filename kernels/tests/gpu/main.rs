//! GPU kernel tests against the CPU references, on random inputs of awkward shapes. Each test prints
//! "SKIP" and passes when no GPU/driver is present.
mod argmax;
mod bf16_expert;
mod common;
mod expert;
mod expert_fixed;
mod gemv;
mod gemv_tile;
mod gemv_wq8;
mod mhc;
mod moe_route;
mod norm_quant;
mod peer;
mod prefill_attn;
mod prefill_gemm;
mod prefill_index;
mod prefill_swiglu;
mod prefill_wgmma;
mod prefill_wgmma_fp4;
mod routed_up;
mod split;
mod swiglu_down;
