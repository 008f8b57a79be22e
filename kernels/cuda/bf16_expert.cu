// Routed-expert GEMV over bf16 weights, grouped by expert (the BF16-checkpoint counterpart of fp4_expert.cu).
//
// Math:    for each slot i = b*topk + t with expert e = ids[i]:
//          y[i, n] = sum_j x[r(i), j] * W[e, n, j],  r(i) = i if x_per_slot else b (w2 reads each slot's row).
// Layout:  W bf16 [E, N, K] (checkpoint layout, experts concatenated); x bf16 [rows, K]; y f32 or bf16
//          [B*topk, N]; meta from `moe_group` (moe_group.cu): [num_groups, group_expert[S], group_start[S+1],
//          slots[S]], so the expert ids stay on the device and the launch is graph-capturable.
// Launch:  bf16_expert: grid (ceil(N / 8), min(E, S), matrices), block 256 = 8 warps; blockIdx.z = 1 reads
//          (w_b, out_b) instead of (w, out), so w1 and w3 run as one launch. Blocks past num_groups exit. A warp
//          owns one row n of one group's expert: its lanes stride K in 16-byte chunks (8 values), each chunk
//          of the row is read once per pass of up to BFX_TOK tokens of the group (more tokens: further passes,
//          the row then comes from L2). f32 accumulation in K order per lane, then a fixed-order warp sum:
//          deterministic, independent of the batch's other groups.
// Constraints: K % 8 == 0 (16-byte rows), E <= 1024 (moe_group).
#include "common.cuh"

#define BFX_WARPS 8  // warps (rows) per block
#define BFX_TOK 8    // tokens per pass over a row

// acc + sum of the 8 products of two 16-byte bf16 chunks, in element order.
__device__ __forceinline__ float bfx_dot8(const uint4& a, const uint4& b, float acc) {
    const u32 av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        acc = fmaf(bf16_to_f32((u16)(av[i] & 0xffffu)), bf16_to_f32((u16)(bv[i] & 0xffffu)), acc);
        acc = fmaf(bf16_to_f32((u16)(av[i] >> 16)), bf16_to_f32((u16)(bv[i] >> 16)), acc);
    }
    return acc;
}

extern "C" __global__ void __launch_bounds__(256)
    bf16_expert(const u16* __restrict__ x, const u16* w, const i32* __restrict__ meta, void* out, const u16* w_b,
                void* out_b, int S, int topk, int N, int K, int x_per_slot, int out_bf16) {
    pdl_wait();
    if (blockIdx.z) {  // the second matrix of a paired launch (routed w1 + w3: same x, same groups)
        w = w_b;
        out = out_b;
    }
    const int g = blockIdx.y;
    if (g >= meta[0]) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * BFX_WARPS + warp;
    if (n >= N) return;  // whole warps only: no block-wide barrier below
    const int e = meta[1 + g], first = meta[1 + S + g], last = meta[2 + S + g];
    const i32* slots = meta + 2 + 2 * S;
    const int chunks = K >> 3;
    const u16* wrow = w + ((u64)e * N + n) * (u64)K;
    for (int t0 = first; t0 < last; t0 += BFX_TOK) {
        const int nt = min(BFX_TOK, last - t0);  // warp-uniform
        const u16* xr[BFX_TOK];
        float acc[BFX_TOK];
#pragma unroll
        for (int t = 0; t < BFX_TOK; ++t) {
            const int slot = slots[t0 + min(t, nt - 1)];
            xr[t] = x + (u64)(x_per_slot ? slot : slot / topk) * (u64)K;
            acc[t] = 0.f;
        }
        for (int c = lane; c < chunks; c += 32) {
            const uint4 wv = ldg_keep(wrow + 8 * c);
#pragma unroll
            for (int t = 0; t < BFX_TOK; ++t)
                if (t < nt) acc[t] = bfx_dot8(wv, ldg_keep(xr[t] + 8 * c), acc[t]);
        }
#pragma unroll
        for (int t = 0; t < BFX_TOK; ++t) {
            if (t < nt) {
                const float v = warp_sum(acc[t]);
                if (lane == 0) store_out(out, (u64)slots[t0 + t] * (u64)N + n, v, out_bf16);
            }
        }
    }
}
