// MoE routing and expert activations for decode (spec 2.8, 5), all on the device.
//
// moe_route: scores s_e = sqrt(softplus(l_e)) from the f32 gate logits [rows, E]; hash layers take the
//          expert ids from tid2eid[token] (i32 [vocab, topk]); others take the top-k of s_e + bias_e
//          (descending, ties to the lower id, like the CPU reference); weights = s_idx / sum s_idx * scale.
//          Outputs ids i32 [rows*topk] (feeds moe_group) and weights f32 [rows*topk].
//          Launch: grid rows, block 32 (one warp); top-k by k warp argmax rounds.
// moe_route_group: moe_route then moe_group (fp4_expert.cu) in one launch (the last block groups).
// moe_swiglu: h = silu(min(g, L)) * clamp(u, -L, L) * wt (L = swiglu_limit, no clamp when L <= 0); either
//          rounded to bf16, or (quant != 0, official numerics) FP8 act-quant fake-quantised from f32 in blocks of 128
//          along the row (a shorter last block when I % 128 != 0, as the CPU reference does). g, u f32 [S, I]
//          (w1 / w3 outputs), wt f32 [S] or null (shared expert: 1), out bf16 [S, I].
//          Launch: grid ceil(S * ceil(I/128) / 8), block 256: one warp per 128-block, 4 values per lane.
// fake_quant_rows: the same FP8 fake quantisation of a bf16 [rows, D] tensor (any D, tail block shorter),
//          out may alias x. Needed because act_quant_bf16 requires D % 128 == 0 (tiny models have D = 32).
// Depends on fq_block from mhc.cu, f32_to_e4m3 / e4m3_to_f32 from act_quant.cu and moe_group_block from
// fp4_expert.cu (same translation unit; all sort first).
#include "common.cuh"

#define QBLOCK 128

__device__ __forceinline__ float route_softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// One warp routes one row: scores in shared memory (score, biased: [E] each, chosen: [topk] of this warp),
// each top-k round a lane-local scan plus a 5-step butterfly (v1 used a 256-thread block with two barriers
// per round: ~19 us per layer for gate + route + group).
__device__ __forceinline__ void route_row(const float* __restrict__ logits, const float* __restrict__ bias,
                                          const i32* __restrict__ tid2eid, const i32* __restrict__ tokens, int E,
                                          int topk, float route_scale, i32* ids, float* wts, int row, float* score,
                                          float* biased, int* chosen) {
    const int lane = threadIdx.x & 31;
    for (int e = lane; e < E; e += 32) {
        const float s = sqrtf(route_softplus(logits[(u64)row * E + e]));
        score[e] = s;
        biased[e] = bias ? s + bias[e] : s;
    }
    __syncwarp();
    if (tid2eid) {
        if (lane < topk) chosen[lane] = tid2eid[(u64)tokens[row] * topk + lane];
    } else {
        for (int k = 0; k < topk; ++k) {
            float v = -INFINITY;
            int i = 0x7fffffff;
            for (int e = lane; e < E; e += 32)
                if (biased[e] > v || (biased[e] == v && e < i)) {
                    v = biased[e];
                    i = e;
                }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, v, o);
                const int oi = __shfl_xor_sync(0xffffffffu, i, o);
                if (ov > v || (ov == v && oi < i)) {
                    v = ov;
                    i = oi;
                }
            }
            if (lane == 0) {
                chosen[k] = i;
                biased[i] = -INFINITY;
            }
            __syncwarp();
        }
    }
    __syncwarp();
    if (lane == 0) {
        float sum = 0.f;
        for (int k = 0; k < topk; ++k) sum += score[chosen[k]];
        for (int k = 0; k < topk; ++k) {
            ids[(u64)row * topk + k] = chosen[k];
            wts[(u64)row * topk + k] = score[chosen[k]] / sum * route_scale;
        }
    }
}

extern "C" __global__ void __launch_bounds__(32) moe_route(
    const float* __restrict__ logits, const float* __restrict__ bias, const i32* __restrict__ tid2eid,
    const i32* __restrict__ tokens, int E, int topk, float route_scale, i32* __restrict__ ids,
    float* __restrict__ wts) {
    pdl_trigger();
    pdl_wait();
    __shared__ float score[1024];
    __shared__ float biased[1024];
    __shared__ int chosen[16];
    route_row(logits, bias, tid2eid, tokens, E, topk, route_scale, ids, wts, blockIdx.x, score, biased, chosen);
}

// moe_route and moe_group (fp4_expert.cu) in one launch: grid ceil(rows / 4), block 128; warp w of block b
// routes row 4b + w exactly as moe_route does, then the last block to finish (a device counter, `counter`,
// zero between launches: that block resets it) groups all rows' ids into meta as moe_group does. Saves one
// dependent launch per MoE layer while the routing keeps one warp per row. Measured (H200, full-size bench,
// graph replay, with an earlier fp4_expert build): against moe_route + moe_group +0.04 / +0.05 / +0.07 ms
// per step at batch 1 / 8 / 64, i.e. no gain within the run-to-run noise (~0.01-0.08 ms): the fences, the
// counter atomic and the grouping on 128 instead of 256 threads cost about what the launch gap saved. Ordering: every block fences its
// ids before counting itself in; the last block fences after seeing the full count and reads the ids from
// L2 (moe_group_block), so it sees every block's writes.
#define RG_WARPS 4
extern "C" __global__ void __launch_bounds__(RG_WARPS * 32) moe_route_group(
    const float* __restrict__ logits, const float* __restrict__ bias, const i32* __restrict__ tid2eid,
    const i32* __restrict__ tokens, int E, int topk, float route_scale, i32* ids, float* wts, int rows,
    i32* __restrict__ meta, int* counter) {
    pdl_trigger();
    pdl_wait();
    // Routing needs 2 x 1024 floats per warp, grouping 5120 ints: the phases share one buffer.
    __shared__ __align__(16) float sm[RG_WARPS * 2048];
    __shared__ int chosen[RG_WARPS][16];
    __shared__ int last;
    const int warp = threadIdx.x >> 5, row = blockIdx.x * RG_WARPS + warp;
    if (row < rows)
        route_row(logits, bias, tid2eid, tokens, E, topk, route_scale, ids, wts, row, sm + warp * 2048,
                  sm + warp * 2048 + 1024, chosen[warp]);
    __threadfence();  // this thread's ids and weights are visible device-wide before the block counts itself
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    moe_group_block(ids, rows * topk, E, meta, reinterpret_cast<int*>(sm));
    if (threadIdx.x == 0) *counter = 0;
}

extern "C" __global__ void __launch_bounds__(256) moe_swiglu(const float* __restrict__ g,
                                                             const float* __restrict__ u,
                                                             const float* __restrict__ wt, u16* __restrict__ out,
                                                             int S, int I, float limit, int quant) {
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int nb = (I + QBLOCK - 1) / QBLOCK;
    const int blk = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (blk >= S * nb) return;
    const int s = blk / nb, c0 = (blk % nb) * QBLOCK;
    const float w = wt ? wt[s] : 1.f;
    float v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int c = c0 + q * 32 + lane;
        v[q] = 0.f;
        if (c >= I) continue;
        float gg = g[(u64)s * I + c], uu = u[(u64)s * I + c];
        if (limit > 0.f) {
            gg = fminf(gg, limit);
            uu = fminf(fmaxf(uu, -limit), limit);
        }
        const float h = gg / (1.f + expf(-gg)) * uu * w;
        v[q] = quant ? h : bf16_to_f32(f32_to_bf16(h));  // quantise from f32 (as the f32 references do)
    }
    if (quant) fq_block(v);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int c = c0 + q * 32 + lane;
        if (c < I) out[(u64)s * I + c] = f32_to_bf16(v[q]);
    }
}

extern "C" __global__ void __launch_bounds__(256) fake_quant_rows(const u16* x, u16* out, int rows, int D) {
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int nb = (D + QBLOCK - 1) / QBLOCK;
    const int blk = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (blk >= rows * nb) return;
    const int r = blk / nb, c0 = (blk % nb) * QBLOCK;
    float v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int c = c0 + q * 32 + lane;
        v[q] = c < D ? bf16_to_f32(x[(u64)r * D + c]) : 0.f;
    }
    fq_block(v);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int c = c0 + q * 32 + lane;
        if (c < D) out[(u64)r * D + c] = f32_to_bf16(v[q]);
    }
}
