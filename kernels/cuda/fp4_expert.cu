// Routed-expert FP4 (e2m1, per-32 UE8M0 scales) GEMV, grouped by expert, for decode.
//
// Math:    for each slot i = b*topk + k with expert e = ids[i]:
//          y[i, n] = sum_j x[r(i), j] * fp4(Wq[e, n, j]) * S[e, n, j / 32],  r(i) = i if x_per_slot else b.
//          (w1/w3 read the token's row: x_per_slot = 0; w2 reads each slot's own hidden row: x_per_slot = 1.)
// Layout:  Wq u8 [E, N, K/2], element 2m in the LOW nibble of byte m; S u8 UE8M0 [E, N, K/32]; x bf16
//          [rows, K]; y f32 or bf16 [B*topk, N]; ids i32 [B*topk] in device memory.
// Grouping: `moe_group` (one block) turns ids into groups on the device: meta = [num_groups,
//          group_expert[S], group_start[S+1], slots[S]] with S = B*topk, slots sorted by expert then by slot
//          (deterministic). Every expert's weights are then read ONCE for all the tokens that chose it.
// Launch:  fp4_expert_ntX: grid (ceil(N/32), min(E, S)), block 256; blocks past num_groups exit at once.
//          A block owns one expert and 32 rows; its 8 warps split K (256 per step) and reduce through shared
//          memory; the group's tokens are the mma N dimension (NT tiles of 8; larger groups loop).
// Compute: mma.sync m16n8k16 bf16 (sm_80+). 16 weight bytes = 32 fp4 values = exactly one scale group per
//          thread and row. Nibbles i and i+4 of a word form one bf16x2 (K permuted within the word, the same
//          permutation applied to x by byte_perm), each made with 2 shifts + 1 lop3 as a bf16 bit pattern
//          (value * 2^-126), then one packed bf16 multiply by 2^126 * S (exact: power of two).
// Constraints: K % 32 == 0, scale exponent byte <= 128 (scale <= 2; real scales are far smaller), E <= 1024.
#include "common.cuh"

#define FP4_MT 2

// bf16x2 of nibbles i and i+4 of w, as raw bits (value * 2^-126).
template <int I>
__device__ __forceinline__ u32 e2m1_pair_raw(u32 w) {
    const u32 sgn = (12 - 4 * I) >= 0 ? (w << (12 - 4 * I)) : (w >> (4 * I - 12));
    const u32 mag = (6 - 4 * I) >= 0 ? (w << (6 - 4 * I)) : (w >> (4 * I - 6));
    return (sgn & 0x80008000u) | (mag & 0x01c001c0u);
}

__device__ __forceinline__ u32 word4(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

template <int NT>
__device__ __forceinline__ void fp4_expert_body(const u16* __restrict__ x, const u8* __restrict__ w,
                                                const u8* __restrict__ s, const i32* __restrict__ meta,
                                                void* __restrict__ out, int S, int topk, int N, int K,
                                                int x_per_slot, int out_bf16) {
    __shared__ float red[4 * FP4_MT * NT * 4 * 32];
    const int grp = blockIdx.y;
    if (grp >= meta[0]) return;
    const i32* group_expert = meta + 1;
    const i32* group_start = meta + 1 + S;
    const i32* slots = meta + 2 + 2 * S;
    const int e = group_expert[grp];
    const int s0 = group_start[grp];
    const int cnt = group_start[grp + 1] - s0;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 32;
    const int kb2 = K >> 1, ks = K >> 5;
    const u8* we = w + (u64)e * N * kb2;
    const u8* se = s + (u64)e * N * ks;
    const uint4 zero = make_uint4(0, 0, 0, 0);

    int rows[FP4_MT][2];
#pragma unroll
    for (int mt = 0; mt < FP4_MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) rows[mt][h] = row0 + mt * 16 + h * 8 + g;

    for (int c0 = 0; c0 < cnt; c0 += NT * 8) {
        // x row pointer of this thread's B-fragment column in each n tile (null: past the group's end).
        const u16* xrow[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int col = c0 + j * 8 + g;
            if (col < cnt) {
                const int slot = slots[s0 + col];
                xrow[j] = x + (u64)(x_per_slot ? slot : slot / topk) * K;
            } else {
                xrow[j] = 0;
            }
        }
        float acc[FP4_MT * NT * 4];
#pragma unroll
        for (int i = 0; i < FP4_MT * NT * 4; ++i) acc[i] = 0.f;

        for (int kc = warp; kc * 128 < K; kc += 2 * 8) {
            // Two 128-wide K chunks per step (kc, kc + 8): 8 x 16 B weight loads in flight per thread.
            uint4 wv[2][FP4_MT][2];
            u32 f[2][FP4_MT][2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int k0 = (kc + c * 8) * 128 + t * 32;
#pragma unroll
                for (int mt = 0; mt < FP4_MT; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const bool ok = k0 < K && rows[mt][h] < N;
                        const u64 r = (u64)(ok ? rows[mt][h] : 0);
                        wv[c][mt][h] = ok ? ldg_stream(we + r * kb2 + (k0 >> 1)) : zero;
                        u32 es = ok ? (u32)se[r * ks + (k0 >> 5)] : 0u;
                        es = es > 128u ? 128u : es;
                        const u32 fb = (es + 126u) << 7;  // bf16 bits of 2^126 * 2^(es-127)
                        f[c][mt][h] = fb | (fb << 16);
                    }
            }
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int k0 = (kc + c * 8) * 128 + t * 32;
                // mma.sync needs the whole warp: skip a chunk only when no lane has data in it (lanes past K
                // carry zero weights and zero activations instead of branching).
                if (__all_sync(0xffffffffu, k0 >= K)) continue;
                const bool kin = k0 < K;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    // Weight fragments for k-steps 2q (p = 0) and 2q + 1 (p = 1) from word q of each row.
                    u32 a[2][FP4_MT][4];
#pragma unroll
                    for (int mt = 0; mt < FP4_MT; ++mt) {
                        const u32 w0 = word4(wv[c][mt][0], q), w1 = word4(wv[c][mt][1], q);
                        a[0][mt][0] = bf16x2_mul(e2m1_pair_raw<0>(w0), f[c][mt][0]);
                        a[0][mt][1] = bf16x2_mul(e2m1_pair_raw<0>(w1), f[c][mt][1]);
                        a[0][mt][2] = bf16x2_mul(e2m1_pair_raw<1>(w0), f[c][mt][0]);
                        a[0][mt][3] = bf16x2_mul(e2m1_pair_raw<1>(w1), f[c][mt][1]);
                        a[1][mt][0] = bf16x2_mul(e2m1_pair_raw<2>(w0), f[c][mt][0]);
                        a[1][mt][1] = bf16x2_mul(e2m1_pair_raw<2>(w1), f[c][mt][1]);
                        a[1][mt][2] = bf16x2_mul(e2m1_pair_raw<3>(w0), f[c][mt][0]);
                        a[1][mt][3] = bf16x2_mul(e2m1_pair_raw<3>(w1), f[c][mt][1]);
                    }
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        if (c0 + j * 8 >= cnt) break;  // warp-uniform: no token in this tile
                        // x[k0 + 8q .. + 8] as 4 words X[m] = (x[8q+2m], x[8q+2m+1]).
                        const uint4 xv = (xrow[j] && kin) ? ldg_keep(xrow[j] + k0 + 8 * q) : zero;
#pragma unroll
                        for (int p = 0; p < 2; ++p) {
                            const u32 lo = p ? xv.y : xv.x, hi = p ? xv.w : xv.z;
                            const u32 b0 = byte_perm(lo, hi, 0x5410);  // x[8q+2p], x[8q+2p+4]
                            const u32 b1 = byte_perm(lo, hi, 0x7632);  // x[8q+2p+1], x[8q+2p+5]
#pragma unroll
                            for (int mt = 0; mt < FP4_MT; ++mt)
                                mma_bf16_16816(&acc[(mt * NT + j) * 4], a[p][mt][0], a[p][mt][1], a[p][mt][2],
                                               a[p][mt][3], b0, b1);
                        }
                    }
                }
            }
        }

        block_reduce_8warps<FP4_MT * NT * 4>(acc, red);
        if (warp == 0) {
#pragma unroll
            for (int mt = 0; mt < FP4_MT; ++mt)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int row = row0 + mt * 16 + g + (i >> 1) * 8;
                        const int col = c0 + j * 8 + 2 * t + (i & 1);
                        if (row >= N || col >= cnt) continue;
                        store_out(out, (u64)slots[s0 + col] * N + row, acc[(mt * NT + j) * 4 + i], out_bf16);
                    }
        }
    }
}

#define FP4_EXPERT_KERNEL(NT)                                                                              \
    extern "C" __global__ void __launch_bounds__(256) fp4_expert_nt##NT(                                   \
        const u16* x, const u8* w, const u8* s, const i32* meta, void* out, int S, int topk, int N, int K, \
        int x_per_slot, int out_bf16) {                                                                    \
        fp4_expert_body<NT>(x, w, s, meta, out, S, topk, N, K, x_per_slot, out_bf16);                      \
    }
FP4_EXPERT_KERNEL(1)
FP4_EXPERT_KERNEL(2)
FP4_EXPERT_KERNEL(4)
FP4_EXPERT_KERNEL(8)

// Groups the S = B*topk slots by expert (one block of 1024 threads). Ids outside [0, E) are dropped.
// meta = [num_groups, group_expert[S], group_start[S+1], slots[S]].
extern "C" __global__ void __launch_bounds__(1024) moe_group(const i32* __restrict__ ids, int S, int E,
                                                             i32* __restrict__ meta) {
    __shared__ int cnt[1024], start[1024], gidx[1024];
    __shared__ int totals[2];
    const int tid = threadIdx.x, lane = tid & 31;
    for (int e = tid; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < S; i += blockDim.x) {
        const int e = ids[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (tid < 32) {  // exclusive scans of counts and of "expert is used", 32 experts at a time
        int run_c = 0, run_g = 0;
        for (int base = 0; base < E; base += 32) {
            const int e = base + lane;
            const int c = e < E ? cnt[e] : 0, used = c > 0 ? 1 : 0;
            int ic = c, ig = used;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int vc = __shfl_up_sync(0xffffffffu, ic, o), vg = __shfl_up_sync(0xffffffffu, ig, o);
                if (lane >= o) { ic += vc; ig += vg; }
            }
            if (e < E) { start[e] = run_c + ic - c; gidx[e] = run_g + ig - used; }
            run_c += __shfl_sync(0xffffffffu, ic, 31);
            run_g += __shfl_sync(0xffffffffu, ig, 31);
        }
        if (lane == 0) { totals[0] = run_g; totals[1] = run_c; }
    }
    __syncthreads();
    const int G = totals[0];
    i32* group_expert = meta + 1;
    i32* group_start = meta + 1 + S;
    i32* slots = meta + 2 + 2 * S;
    if (tid == 0) { meta[0] = G; group_start[G] = totals[1]; }
    for (int e = tid; e < E; e += blockDim.x)
        if (cnt[e] > 0) { group_expert[gidx[e]] = e; group_start[gidx[e]] = start[e]; }
    for (int i = tid; i < S; i += blockDim.x) {
        const int e = ids[i];
        if (e < 0 || e >= E) continue;
        int rank = 0;
        for (int j = 0; j < i; ++j) rank += ids[j] == e ? 1 : 0;
        slots[start[e] + rank] = i;
    }
}
