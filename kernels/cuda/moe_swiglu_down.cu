// The routed w2 of a small decode batch with the SwiGLU in the same launch: every block of the fixed w2 kernel
// (fp4_expert_n4096k2048w2's grid) makes the SwiGLU of its group's slots itself, exactly as moe_swiglu computes
// it (swiglu_value, then fq_block per 128 values under official numerics), into shared memory, and runs
// fp4_expert_fixed on it. The same values, products and sums: the same bits as moe_swiglu followed by the w2
// launch, and no h written to global memory.
// Why:     at batch 1 moe_swiglu was a dependent launch of ~3.6 us on the critical path of every layer. Here each
//          block issues its first weight chunks (which need only the group table) and then makes the SwiGLU
//          (one round trip to L2 for g and u, 16 values a thread) while those copies are in flight.
// Launch:  grid (4096 / 64, min(E, slots)), block 128, as the w2 launch; a pass takes FP4_XS_COLS columns (a
//          group of more slots runs more passes, each remaking its columns' SwiGLU).
// Depends on fp4_expert.cu (fp4_expert_fixed), moe_route.cu (swiglu_value) and mhc_finish.cu (fq_block), all
// earlier in the sorted translation unit.
#include "common.cuh"

#define MOE_SD_N 4096  // the routed w2's rows (hidden size)
#define MOE_SD_K 2048  // its inputs (the experts' intermediate size)

// fp4_expert_fixed's x source for the fused launch: the SwiGLU of g and u ([slots, K] f32, the w1 / w3 outputs)
// times each slot's routing weight, as bf16 rows of K values at shared address `addr`.
template <int K>
struct Fp4SwigluXs {
    const float* g;
    const float* u;
    const float* wt;  // routing weights [slots] (null: 1)
    float limit;
    int quant;  // official numerics: FP8 fake quantisation per 128 (else rounding through bf16)
    u32 addr;

    // Columns 0 .. np of the pass (slots pslots[0 .. np]). Warp w makes the 128-blocks w, w + 4, ... of each
    // column, a lane 4 consecutive values (moe_swiglu's lane holds 4 strided ones: the same block maximum, so
    // the same scale, and the same value for each element), then a block barrier publishes them.
    __device__ __forceinline__ void prepare(const i32* pslots, int np) const {
        constexpr int NB = K / (128 * FP4_WARPS);
        static_assert(K % (128 * FP4_WARPS) == 0, "whole 128-blocks per warp");
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        for (int c = 0; c < np; ++c) {
            const int sl = pslots[c];
            const float w = wt ? wt[sl] : 1.f;
            float4 gv[NB], uv[NB];
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const u64 at = (u64)sl * K + (warp + b * FP4_WARPS) * 128 + lane * 4;
                gv[b] = *reinterpret_cast<const float4*>(g + at);
                uv[b] = *reinterpret_cast<const float4*>(u + at);
            }
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                float v[4] = {swiglu_value(gv[b].x, uv[b].x, w, limit, quant),
                              swiglu_value(gv[b].y, uv[b].y, w, limit, quant),
                              swiglu_value(gv[b].z, uv[b].z, w, limit, quant),
                              swiglu_value(gv[b].w, uv[b].w, w, limit, quant)};
                if (quant) fq_block(v);
                const u32 lo = (u32)f32_to_bf16(v[0]) | ((u32)f32_to_bf16(v[1]) << 16);
                const u32 hi = (u32)f32_to_bf16(v[2]) | ((u32)f32_to_bf16(v[3]) << 16);
                const u32 at = addr + (u32)((c * K + (warp + b * FP4_WARPS) * 128 + lane * 4) * 2);
                asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(at), "r"(lo), "r"(hi) : "memory");
            }
        }
        __syncthreads();
    }
};

extern "C" __global__ void __launch_bounds__(FP4_WARPS * 32, 6) fp4_swiglu_down_n4096k2048w2(
    const float* __restrict__ g, const float* __restrict__ u, const float* __restrict__ wt, float limit, int quant,
    const u8* w, const u8* s, const i32* meta, void* out, int S, int topk, int out_bf16) {
    __shared__ __align__(16) uint4 ring[FP4_ST][4][FP4_WARPS * 32];
    __shared__ u32 sring[FP4_SST][FP4_WARPS][32];
    __shared__ __align__(16) u16 xsh[FP4_XS_COLS * MOE_SD_K];
    pdl_wait();
    const Fp4SwigluXs<MOE_SD_K> xs{g, u, wt, limit, quant, smem_u32(xsh)};
    fp4_expert_fixed<MOE_SD_N, MOE_SD_K, 2, true>(nullptr, w, s, meta, out, S, topk, 1, out_bf16, ring, sring, xs);
}
