// MoE routing and expert activations for decode (spec 2.8, 5), all on the device.
//
// moe_route: scores s_e = sqrt(softplus(l_e)) from the f32 gate logits [rows, E]; hash layers take the
//          expert ids from tid2eid[token] (i32 [vocab, topk]); others take the top-k of s_e + bias_e
//          (descending, ties to the lower id, like the CPU reference); weights = s_idx / sum s_idx * scale.
//          Outputs ids i32 [rows*topk] (feeds moe_group) and weights f32 [rows*topk].
//          Launch: grid rows, block 32 (one warp); top-k by k warp argmax rounds on registers.
// moe_route_group: moe_route then moe_group (moe_group.cu) in one launch (one block, or the last block, groups).
// moe_swiglu: h = silu(min(g, L)) * clamp(u, -L, L) * wt (L = swiglu_limit, no clamp when L <= 0); either
//          rounded to bf16, or (quant != 0, official numerics) FP8 act-quant fake-quantised from f32 in blocks of 128
//          along the row (a shorter last block when I % 128 != 0, as the CPU reference does). g, u f32 [S, I]
//          (w1 / w3 outputs), wt f32 [S] or null (shared expert: 1), out bf16 [S, I].
//          Launch: grid ceil(S * ceil(I/128) / 8), block 256: one warp per 128-block, 4 values per lane. The value
//          itself is swiglu_value (shared with the prefill's pf_swiglu_kperm, prefill_swiglu.cu).
// fake_quant_rows: the same FP8 fake quantisation of a bf16 [rows, D] tensor (any D, tail block shorter),
//          out may alias x. Needed because act_quant_bf16 requires D % 128 == 0 (tiny models have D = 32).
// Depends on fq_block from mhc.cu, f32_to_e4m3 / e4m3_to_f32 from act_quant.cu and moe_group_block from
// moe_group.cu (same translation unit; all sort first).
#include "common.cuh"

#define QBLOCK 128

__device__ __forceinline__ float route_softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// Not inlined on purpose: a routing launch is one warp walking its code once, so its time follows the distinct
// instructions it executes (instruction-cache misses: ncu showed `no_inst` stalls, 13.7 us per sqrt-softplus
// launch at batch 1 against 6 us for hash layers). Inlined, the 8 scores per lane and the weight's score were
// 9 copies of expf + log1pf + sqrtf (~17000 SASS instructions in the kernel); called, one copy stays cached.
// The same f32 operations either way: the same bits.
__device__ __noinline__ float route_score(float logit) { return sqrtf(route_softplus(logit)); }

// Order-preserving u32 key of a biased score: a > b as floats iff key(a) > key(b); -0 keys as +0, so float
// ties are key ties; NaN keys 0, below every number (never chosen, as with the float compares of v1).
__device__ __forceinline__ u32 route_key(float v) {
    if (v != v) return 0u;
    const u32 b = __float_as_uint(v + 0.0f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Read-only f32 load that the compiler keeps where it is written (see route_row).
__device__ __forceinline__ float route_ldg(const float* p) {
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 warp_max_u32(u32 v) {
    u32 r;
    asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}

__device__ __forceinline__ u32 warp_min_u32(u32 v) {
    u32 r;
    asm volatile("redux.sync.min.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}

// A lane's best remaining expert (largest key, lowest j on ties) among its NPL experts lane + 32 j.
template <int NPL>
__device__ __forceinline__ void route_local_best(const u32* key, u32& bk, int& bj) {
    bk = 0u;
    bj = 0;
#pragma unroll
    for (int j = 0; j < NPL; ++j)
        if (key[j] > bk) {
            bk = key[j];
            bj = j;
        }
}

// One warp routes one row, all in registers (E <= 32 NPL): lane l scores experts l + 32 j (or reads those scores
// from `scores` [rows, E] when the block computed them beforehand, see moe_route_group); each top-k round
// is a warp max of the lanes' best keys (redux) and a warp min of the ids holding it (ties to the lower id,
// like the CPU reference), then the winning lane drops that expert. Lane k keeps the k-th id and, after the
// rounds, re-evaluates its score.
// v1 kept the scores in shared memory and ran each round as a scan plus a 5-step two-value butterfly; the
// weights were one lane's serial loop. Outputs (ids, weights) are v1's bits; sid (shared, may be null)
// also receives the ids, for the grouping of the same block.
template <int NPL, bool PRE>
__device__ __forceinline__ void route_row(const float* __restrict__ logits, const float* __restrict__ bias,
                                          const i32* __restrict__ tid2eid, const i32* __restrict__ tokens, int E,
                                          int topk, float route_scale, i32* ids, float* wts, int row, int* sid,
                                          const float* scores) {
    const int lane = threadIdx.x & 31;
    const float* sr = PRE ? scores + row * E : nullptr;  // PRE: the row's scores, computed by the block
    const float* lr = logits + (u64)row * E;
    int id = 0x7fffffff;
    if (tid2eid) {
        if (lane < topk) id = tid2eid[(u64)tokens[row] * topk + lane];
    } else {
        // All loads first, branch-free (clamped indices; volatile, so none is sunk under a branch next to its
        // use): the first version loaded each (logit, bias) pair under its own `e < E` branch right before the
        // expf, 8 dependent round trips (13.7 us per launch at batch 1 against 12.5 for v1).
        u32 key[NPL];
        float l[NPL], b[NPL];
        const float* bp = bias ? bias : lr;
#pragma unroll
        for (int j = 0; j < NPL; ++j) {
            const int e = min(lane + 32 * j, E - 1);
            if (!PRE) l[j] = route_ldg(lr + e);
            b[j] = route_ldg(bp + e);
        }
#pragma unroll
        for (int j = 0; j < NPL; ++j) {
            const float sc = PRE ? sr[min(lane + 32 * j, E - 1)] : route_score(l[j]);
            key[j] = lane + 32 * j < E ? route_key(bias ? sc + b[j] : sc) : 0u;
        }
        u32 bk;
        int bj;
        route_local_best<NPL>(key, bk, bj);
        for (int k = 0; k < topk; ++k) {
            const u32 mk = warp_max_u32(bk);
            const u32 win = warp_min_u32(mk != 0u && bk == mk ? (u32)(lane + 32 * bj) : 0x7fffffffu);
            if (lane == k) id = (int)win;
            if (mk != 0u && (int)(win & 31u) == lane) {
#pragma unroll
                for (int j = 0; j < NPL; ++j)
                    if (j == (int)(win >> 5)) key[j] = 0u;
                route_local_best<NPL>(key, bk, bj);
            }
        }
    }
    // The chosen expert's score again (the same f32 operations as for its key: the same bits).
    const bool has = lane < topk && id >= 0 && id < E;
    const float s_k = has ? (PRE ? sr[id] : route_score(lr[id])) : __int_as_float(0x7fc00000);
    float sum = 0.f;  // v1's order: k = 0, 1, ...
    for (int k = 0; k < topk; ++k) sum += __shfl_sync(0xffffffffu, s_k, k);
    if (lane < topk) {
        ids[(u64)row * topk + lane] = id;
        wts[(u64)row * topk + lane] = s_k / sum * route_scale;
        if (sid) sid[row * topk + lane] = id;
    }
}

// route_row at the register width E needs (checked on the host: E <= 1024); `scores` (E <= 256 only) as there.
__device__ __forceinline__ void route_row_any(const float* __restrict__ logits, const float* __restrict__ bias,
                                              const i32* __restrict__ tid2eid, const i32* __restrict__ tokens,
                                              int E, int topk, float route_scale, i32* ids, float* wts, int row,
                                              int* sid, const float* scores) {
    if (scores)
        route_row<8, true>(logits, bias, tid2eid, tokens, E, topk, route_scale, ids, wts, row, sid, scores);
    else if (E <= 256)
        route_row<8, false>(logits, bias, tid2eid, tokens, E, topk, route_scale, ids, wts, row, sid, nullptr);
    else
        route_row<32, false>(logits, bias, tid2eid, tokens, E, topk, route_scale, ids, wts, row, sid, nullptr);
}

extern "C" __global__ void __launch_bounds__(32) moe_route(
    const float* __restrict__ logits, const float* __restrict__ bias, const i32* __restrict__ tid2eid,
    const i32* __restrict__ tokens, int E, int topk, float route_scale, i32* __restrict__ ids,
    float* __restrict__ wts) {
    pdl_wait();
    route_row_any(logits, bias, tid2eid, tokens, E, topk, route_scale, ids, wts, blockIdx.x, nullptr, nullptr);
}

// moe_group_block's result for S <= 32 slots, by one warp (lane i = slot i, ids sid[i] in shared memory):
// rank = earlier slots of the same expert (match_any), start = valid slots of lower experts, group index =
// distinct lower experts; no barriers, atomics or scans. The same meta as moe_group_block.
__device__ __forceinline__ void route_group_warp(const int* sid, int S, int E, i32* __restrict__ meta) {
    const int lane = threadIdx.x & 31;
    const int e = lane < S ? sid[lane] : -1;
    const bool valid = e >= 0 && e < E;
    const u32 same = __match_any_sync(0xffffffffu, valid ? e : -1);
    const int rank = __popc(same & ((1u << lane) - 1u));
    const u32 valids = __ballot_sync(0xffffffffu, valid);
    const u32 leaders = __ballot_sync(0xffffffffu, valid && rank == 0);
    int start = 0, gidx = 0;
    for (int j = 0; j < S; ++j) {
        const int ej = __shfl_sync(0xffffffffu, e, j);
        const bool lower = ((valids >> j) & 1u) && ej < e;
        start += lower ? 1 : 0;
        gidx += lower && ((leaders >> j) & 1u) ? 1 : 0;
    }
    i32* group_expert = meta + 1;
    i32* group_start = meta + 1 + S;
    i32* slots = meta + 2 + 2 * S;
    if (valid) {
        slots[start + rank] = lane;
        if (rank == 0) {
            group_expert[gidx] = e;
            group_start[gidx] = start;
        }
    }
    if (lane == 0) {
        const int G = __popc(leaders);
        meta[0] = G;
        group_start[G] = __popc(valids);
    }
}

// moe_route and moe_group (moe_group.cu) in one launch; warp w of block b routes row b * warps + w exactly as
// moe_route does. Two shapes (the launcher picks by rows):
// - one block (rows <= ROUTE_GROUP_ONE_BLOCK, one warp per row, at least 8 warps): when the rows' scores fit the
//   scratch (sqrt-softplus layers, E <= 256, rows * E <= MOE_ROUTE_SCORES), every thread of the block first scores
//   (row, expert) pairs into it, one route_score each, and after a barrier the routing warps read them: at batch 1
//   a lane's 8 scores were 8 dependent calls of ~100 instructions, the longest stretch of the launch. The same
//   f32 operations per score: the same bits. The ids also go to shared memory; after one barrier warp 0 groups
//   them (route_group_warp) when rows * topk <= 32, else the block runs moe_group_block (which reuses the score
//   scratch: the barrier separates the last score read from its first write). No device counter, fences or
//   atomics: at batch 1 v1 (below, then for every batch) took 12.5 us per layer.
// - grid ceil(rows / 4), block 128: the last block to finish (a device counter, `counter`, zero between
//   launches: that block resets it) groups all rows' ids into meta. Ordering: block_arrives_last (common.cuh),
//   then the last block reads the ids from L2 (moe_group_block), so it sees every block's writes.
#define MOE_ROUTE_SCORES 5120  // moe_group_block's scratch (ints), also the one-block path's score scratch
extern "C" __global__ void __launch_bounds__(512) moe_route_group(
    const float* __restrict__ logits, const float* __restrict__ bias, const i32* __restrict__ tid2eid,
    const i32* __restrict__ tokens, int E, int topk, float route_scale, i32* ids, float* wts, int rows,
    i32* __restrict__ meta, int* counter, int early) {
    pdl_wait();
    if (early) pdl_trigger();  // the expert blocks are placed now and wait for the table (launcher: route_early)
    __shared__ __align__(16) int sm[MOE_ROUTE_SCORES];  // moe_group_block's scratch; one block: the scores first
    const int warp = threadIdx.x >> 5, row = blockIdx.x * (blockDim.x >> 5) + warp;
    const int S = rows * topk;
    if (gridDim.x == 1) {
        __shared__ int sid[512];  // rows * topk <= 32 x 16 (launcher)
        float* scores = nullptr;
        if (!tid2eid && E <= 256 && rows * E <= MOE_ROUTE_SCORES) {  // block-uniform
            scores = reinterpret_cast<float*>(sm);
            for (int i = threadIdx.x; i < rows * E; i += blockDim.x) scores[i] = route_score(route_ldg(logits + i));
            __syncthreads();
        }
        if (row < rows)
            route_row_any(logits, bias, tid2eid, tokens, E, topk, route_scale, ids, wts, row, sid, scores);
        __syncthreads();  // the block's ids, in shared memory and in global memory (moe_group_block reads those)
        if (S <= 32) {
            if (warp == 0) route_group_warp(sid, S, E, meta);
        } else {
            moe_group_block(ids, S, E, meta, sm);
        }
        return;
    }
    if (row < rows)
        route_row_any(logits, bias, tid2eid, tokens, E, topk, route_scale, ids, wts, row, nullptr, nullptr);
    // The last block to arrive (block_arrives_last: the others' ids are visible to it) groups, and resets the counter.
    if (!block_arrives_last(reinterpret_cast<u32*>(counter), gridDim.x)) return;
    moe_group_block(ids, S, E, meta, sm);
}

// One SwiGLU value as moe_swiglu computes it: silu(min(g, L)) * clamp(u, -L, L) * w, rounded through bf16 unless
// `quant` (official numerics quantise from the f32 value, as the f32 references do). pf_swiglu_kperm
// (prefill_swiglu.cu) uses it too: one expression, so both kernels give the same bits.
__device__ __forceinline__ float swiglu_value(float gg, float uu, float w, float limit, int quant) {
    if (limit > 0.f) {
        gg = fminf(gg, limit);
        uu = fminf(fmaxf(uu, -limit), limit);
    }
    const float h = gg / (1.f + expf(-gg)) * uu * w;
    return quant ? h : bf16_to_f32(f32_to_bf16(h));
}

extern "C" __global__ void __launch_bounds__(256) moe_swiglu(const float* __restrict__ g,
                                                             const float* __restrict__ u,
                                                             const float* __restrict__ wt, u16* __restrict__ out,
                                                             int S, int I, float limit, int quant, int early) {
    pdl_wait();
    if (early) pdl_trigger();  // SwigluAct::early: the next kernel's blocks are placed now
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
        v[q] = swiglu_value(g[(u64)s * I + c], u[(u64)s * I + c], w, limit, quant);
    }
    if (quant) fq_block(v);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int c = c0 + q * 32 + lane;
        if (c < I) out[(u64)s * I + c] = f32_to_bf16(v[q]);
    }
}

extern "C" __global__ void __launch_bounds__(256) fake_quant_rows(const u16* x, u16* out, int rows, int D) {
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
