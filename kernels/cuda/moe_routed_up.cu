// The routed w1 / w3 pair of a small decode batch with its routing in the same launch: every block of the fixed
// w1 / w3 kernel (fp4_expert_n2048k4096w4's grid) first routes the rows itself, exactly as moe_route_group's
// one-block path does (the block scores every (row, expert) pair into shared memory, one warp per row runs
// route_row, warp 0 groups the ids with route_group_warp), then runs fp4_expert_fixed with that group table read
// from shared memory. Block (0, 0, 0) also writes ids, wts and meta for the launches after it (the SwiGLU, w2, the
// HCPost). The same code on the same inputs: the same bits as moe_route_group followed by the pair launch.
// Why:     at batch 1 the routing was a one-block launch of ~7 us on the critical path (a dependent launch, a
//          chain of round trips in one SM), after which every expert block read the group table back from L2
//          before its first weight load. Here each block routes in parallel with all the others and reads the
//          table from its own shared memory; the 256 scores per row cost each block two route_score calls a
//          thread.
// Launch:  grid (2048 / 32, min(E, rows * topk), 2), block 128, as the pair launch; rows <= 4 (one routing warp
//          per row), rows * topk <= 32 (route_group_warp), E <= 256 (the scores fit the block's scratch). Hash
//          layers (tid2eid) route by the token's row of the table and score nothing up front.
// Depends on fp4_expert.cu (fp4_expert_fixed, the rings) and moe_route.cu (route_score, route_ldg,
//          route_row_any, route_group_warp), both earlier in the sorted translation unit.
#include "common.cuh"

#define MOE_RU_ROWS 4    // routing warps: the block's 4 warps, one row each
#define MOE_RU_SLOTS 32  // rows * topk: route_group_warp's one warp

// The routing of every block: ids (block (0, 0, 0): also ids, wts and meta in global memory) into smeta.
// Not inlined: its registers (route_row's 8 keys, logits and biases a lane) then do not add to the expert body's,
// which must stay within 72 for 7 blocks per SM (inlined, the prologue spilled ~300 bytes a thread).
__device__ __noinline__ void routed_up_route(const float* __restrict__ logits, const float* __restrict__ bias,
                                             const i32* __restrict__ tid2eid, const i32* __restrict__ tokens,
                                             int E, int topk, float route_scale, i32* ids, float* wts, int rows,
                                             i32* meta, float* scores, int* sid, i32* own_ids, float* own_wts,
                                             i32* smeta, bool lead) {
    const int warp = threadIdx.x >> 5, S = rows * topk;
    float* sc = nullptr;
    if (!tid2eid) {  // block-uniform; rows * E <= 4 * 256 (launcher)
        sc = scores;
        for (int i = threadIdx.x; i < rows * E; i += blockDim.x) sc[i] = route_score(route_ldg(logits + i));
        __syncthreads();
    }
    if (warp < rows)
        route_row_any(logits, bias, tid2eid, tokens, E, topk, route_scale, lead ? ids : own_ids,
                      lead ? wts : own_wts, warp, sid, sc);
    __syncthreads();  // sid complete
    if (warp == 0) route_group_warp(sid, S, E, smeta);
    if (lead && warp == 1) route_group_warp(sid, S, E, meta);
    __syncthreads();  // smeta complete
}

extern "C" __global__ void __launch_bounds__(FP4_WARPS * 32, 7) fp4_routed_up_n2048k4096w4(
    const u16* x, const u8* w, const u8* s, void* out, u64 dw, u64 ds, u64 dout, int out_bf16,
    const float* __restrict__ logits, const float* __restrict__ bias, const i32* __restrict__ tid2eid,
    const i32* __restrict__ tokens, int E, int topk, float route_scale, i32* ids, float* wts, int rows, i32* meta) {
    __shared__ __align__(16) uint4 ring[FP4_ST][4][FP4_WARPS * 32];
    __shared__ u32 sring[FP4_SST][FP4_WARPS][32];
    __shared__ float scores[MOE_RU_ROWS * 256];
    __shared__ int sid[MOE_RU_SLOTS];
    __shared__ i32 smeta[2 + 3 * MOE_RU_SLOTS];
    __shared__ i32 own_ids[MOE_RU_SLOTS];  // the other blocks' ids / wts: nobody reads them
    __shared__ float own_wts[MOE_RU_SLOTS];
    pdl_wait();
    const bool lead = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    routed_up_route(logits, bias, tid2eid, tokens, E, topk, route_scale, ids, wts, rows, meta, scores, sid, own_ids,
                    own_wts, smeta, lead);
    fp4_expert_fixed<2048, 4096, 4>(x, (const u8*)((u64)w + blockIdx.z * dw), (const u8*)((u64)s + blockIdx.z * ds),
                                    smeta, (void*)((u64)out + blockIdx.z * dout), rows * topk, topk, 0, out_bf16,
                                    ring, sring);
}
