// mHC: the end of each pre-mixer (spec 2.3), hc_finish{24,4}, after hc_mix_partial / hc_post_mix (mhc.cu holds
// the math, the layouts and the partial kernels).
//
// Launch:  grid rows, block 288 = 9 warps, one block per row. Warps 0-7 sum the row's chunk partials (each lane
//          its chunks in chunk order, then a warp sum: deterministic); then warp 8 computes post and the
//          Sinkhorn comb (M == 24, one matrix element per lane) while warps 0-7 collapse the streams with pre
//          (each thread evaluates the 4 pre coefficients itself), RMS-normalise and (yq) FP8-fake-quantise:
//          for the expert GEMVs from the f32 normalised values (ffn mixer), for the attention's FP8 wq_a/wkv
//          from the bf16 output (attention mixer; replaces the attention's own x-quant launch). After
//          hc_post_mix it also copies the scratch streams back into X (xcopy).
// Latency: at batch 1 the kernel is one block, i.e. a chain of dependent memory round trips, so every phase
//          issues all of its loads before the first use: the copy-back's loads together with the partial
//          sums' loads (all of a warp's mixes at once), the 4 x 16 stream values of a thread's 16 collapse
//          columns, the norm weights of each output phase. v4 looped with one or two loads per trip and took
//          ~13 us per call at batch 1 (86 calls per step). v6: the row's streams and the norm weights are
//          prefetched into L1 at the start (prefetch_l1), beside the partials' loads; the Sinkhorn's
//          4-sums issue their 3 shuffles at once. Arithmetic and order are v4's: the same bits.
//          v7 (trim2, unmeasured): a batch-1 launch walks its code once, so its time follows the distinct
//          instructions it executes (instruction fetch; kernels/BENCH_NOTES.md): y is written by the yq pass
//          (mhc_store_y only without yq), that pass takes one block per trip, the collapse's full rounds are
//          unguarded, the pre coefficients are one sigmoid per lane, the Sinkhorn loop is not unrolled.
//          hc_finish24: 4752 -> 2448 SASS instructions, ~2900 -> ~1450 on the D = 4096 path. Same bits.
// Depends on f32_to_e4m3 / e4m3_to_f32 (act_quant.cu), attn_inv_pow2 (attn_common.cu), mhc_sigmoid /
//          mhc_sinkhorn_lane (mhc.cu); fq_block is also used by moe_route.cu (later in the sorted translation unit).
// Constraints: n = 4, D % 8 == 0, D <= MHC_MAX_D (checked on the host).
#include "common.cuh"

#define MHC_FIN_WARPS 8  // collapse warps; warp 8 runs Sinkhorn
#define MHC_COPY_U 8     // 16-byte copy-back loads in flight per thread
#define MHC_COL_U 16     // collapse / output columns per thread per round (D = 4096: one round)
#define MHC_SUM_U 4      // chunks per lane per partial-sum round (4D = 16384: one round)

// Barrier of the 8 collapse warps of hc_finish (warp 8 runs Sinkhorn meanwhile and never joins).
__device__ __forceinline__ void mhc_bar8() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// Sum over the 8 collapse warps, in a fixed order.
__device__ __forceinline__ float mhc_block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    mhc_bar8();  // sh may still be read from a previous use
    if (lane == 0) sh[warp] = v;
    mhc_bar8();
    float r = 0.f;
#pragma unroll
    for (int i = 0; i < MHC_FIN_WARPS; ++i) r += sh[i];
    return r;
}

// FP8 fake quantisation (spec 5 act_quant, f32 in) of the 4 values a lane holds of one 128-block; invalid
// values are 0. Also used by moe_route.cu.
// The biased exponent se of that block's scale s = 2^(se - 127): the power of two at or above amax / 448 over
// the warp's 4 x 32 values (amax at least 1e-4). Shared with pf_swiglu_kperm (prefill_swiglu.cu).
__device__ __forceinline__ u32 fq_scale_exp(const float* v) {
    float amax = 0.f;
#pragma unroll
    for (int q = 0; q < 4; ++q) amax = fmaxf(amax, fabsf(v[q]));
    amax = fmaxf(warp_max(amax), 1e-4f);
    const u32 rb = __float_as_uint(amax / 448.0f);
    return ((rb >> 23) & 0xffu) + ((rb & 0x7fffffu) != 0u ? 1u : 0u);
}

// The quantise-dequantise itself: c = clamp(v / s, +-448), v = e4m3(c) * s, in few instructions (a decode
// launch is often bound by how many distinct instructions it walks: instruction-cache misses). The division by
// s = 2^k is a product with 2^-k: both are the correctly rounded v 2^-k (subnormal results too; s = inf, a block
// holding an infinity, gives 0 as v / inf does, and inf or NaN stay NaN). The e4m3 round trip runs on value pairs
// in hardware (sm_89+; round to nearest even like f32_to_e4m3; the clamped c is never NaN, so no NaN code; every
// finite e4m3 value is exact in f16, hence in f32), then the same product with s: f32_to_e4m3's bits.
// fq_block that also returns the block's e4m3 codes (byte q of codes: v[q]'s) and its scale s, so that code * s
// is the fake-quantised value: what the FP8-activation GEMVs read (GemvQ8X).
__device__ __forceinline__ void fq_block_codes(float* v, u32& codes, float& s) {
    const u32 se = fq_scale_exp(v);
    s = __uint_as_float(se << 23);
    const float rs = attn_inv_pow2(s);  // 2^-k from the bits (attn_common.cu; 0 for s = inf)
    codes = 0u;
#pragma unroll
    for (int q = 0; q < 4; q += 2) {
        const float c0 = fminf(fmaxf(v[q] * rs, -448.f), 448.f), c1 = fminf(fmaxf(v[q + 1] * rs, -448.f), 448.f);
        float f0, f1;
        unsigned short e;
        asm("{\n.reg .b16 h0, h1;\n.reg .b32 h;\n"
            "cvt.rn.satfinite.e4m3x2.f32 %2, %4, %3;\n"
            "cvt.rn.f16x2.e4m3x2 h, %2;\n"
            "mov.b32 {h0, h1}, h;\n"
            "cvt.f32.f16 %0, h0;\n"
            "cvt.f32.f16 %1, h1;\n}"
            : "=f"(f0), "=f"(f1), "=h"(e)
            : "f"(c0), "f"(c1));
        codes |= (u32)e << (8 * q);
        v[q] = f0 * s;
        v[q + 1] = f1 * s;
    }
}

__device__ __forceinline__ void fq_block(float* v) {
    u32 codes;
    float s;
    fq_block_codes(v, codes, s);
}

// Sums of the row's partials into sred[0..M] (warps 0-7, warp w: mixes w, w + 8, ...). A lane adds its chunks
// lane, lane + 32, ... in that order (the round size only batches the loads), then one warp sum per mix.
template <int M>
__device__ __forceinline__ void mhc_partial_sums(const float* __restrict__ ws, int chunks, int rows, int row,
                                                 float* sred) {
    constexpr int MW = (M + MHC_FIN_WARPS) / MHC_FIN_WARPS;  // ceil((M + 1) / 8) mixes per warp
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp >= MHC_FIN_WARPS) return;
    float s[MW];
#pragma unroll
    for (int i = 0; i < MW; ++i) s[i] = 0.f;
    for (int ch0 = lane; ch0 < chunks; ch0 += 32 * MHC_SUM_U) {
        float v[MW][MHC_SUM_U];
#pragma unroll
        for (int i = 0; i < MW; ++i)
#pragma unroll
            for (int u = 0; u < MHC_SUM_U; ++u) {
                const int m = warp + MHC_FIN_WARPS * i, ch = ch0 + 32 * u;
                v[i][u] = m <= M && ch < chunks ? ws[((u64)ch * rows + row) * (M + 1) + m] : 0.f;
            }
#pragma unroll
        for (int i = 0; i < MW; ++i)
#pragma unroll
            for (int u = 0; u < MHC_SUM_U; ++u)
                if (warp + MHC_FIN_WARPS * i <= M && ch0 + 32 * u < chunks) s[i] += v[i][u];
    }
    // The MW warp sums share their shuffles (warp_sums_scatter: warp_sum's bits).
    const float t = warp_sums_scatter<MW>(s);
    const int m = warp + MHC_FIN_WARPS * warp_sums_index<MW>(lane);
    if (warp_sums_leader<MW>(lane) && m <= M) sred[m] = t;
}

// post and comb (Sinkhorn) of a block mixer into mix[row] (one warp).
__device__ __forceinline__ void mhc_post_comb(const float* sred, float rho, const float* scale, const float* base,
                                              float hc_eps, int iters, float* mo) {
    const int lane = threadIdx.x & 31;
    if (lane < MHC_N) mo[lane] = 2.f * mhc_sigmoid(sred[4 + lane] * rho * scale[1] + base[4 + lane]);
    const float l = lane < 16 ? sred[8 + (lane & 15)] * rho * scale[2] + base[8 + (lane & 15)] : 0.f;
    const float p = mhc_sinkhorn_lane(l, hc_eps, iters);
    if (lane < 16) mo[4 + lane] = p;
}

// The copy-back of n bf16 (n % 8 == 0, 16-byte aligned) in two halves, so that its loads are in flight while the
// partial sums load: mhc_copy_load takes the first MHC_COPY_U rounds of the block, mhc_copy_store writes them and
// copies whatever is left (rows wider than MHC_COPY_U x 16 B x 288 threads) in further rounds.
__device__ __forceinline__ void mhc_copy_load(const u16* __restrict__ src, int n, uint4* v) {
    const uint4* s = (const uint4*)src;
#pragma unroll
    for (int u = 0; u < MHC_COPY_U; ++u) {
        const int i = threadIdx.x + u * blockDim.x;
        if (i < (n >> 3)) v[u] = s[i];
    }
}

__device__ __forceinline__ void mhc_copy_store(const u16* __restrict__ src, u16* __restrict__ dst, int n,
                                               const uint4* v) {
    const int n16 = n >> 3, first = MHC_COPY_U * blockDim.x;
    uint4* d = (uint4*)dst;
#pragma unroll
    for (int u = 0; u < MHC_COPY_U; ++u) {
        const int i = threadIdx.x + u * blockDim.x;
        if (i < n16) d[i] = v[u];
    }
    for (int base = first; base < n16; base += first) {
        uint4 w[MHC_COPY_U];
        mhc_copy_load(src + (u64)base * 8, n - base * 8, w);
#pragma unroll
        for (int u = 0; u < MHC_COPY_U; ++u) {
            const int i = base + threadIdx.x + u * blockDim.x;
            if (i < n16) d[i] = w[u];
        }
    }
}

// One column of the collapse, a = bf16(sum_j pre_j x_j) as f32, and a sum of squares' step, spelled out as nvcc
// compiled the plain expressions (a chain of fmas from 0): shared with hc_finish24_wide (mhc_wide.cu).
__device__ __forceinline__ float mhc_collapse_col(const float* pre, const float* x) {
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < MHC_N; ++j) a = __fmaf_rn(pre[j], x[j], a);
    return bf16_to_f32(f32_to_bf16(a));
}
__device__ __forceinline__ float mhc_sq_add(float ss, float af) { return __fmaf_rn(af, af, ss); }

// rho = (mean(x^2) + eps)^-1/2 of the row and the 4 pre coefficients (warps 0-7 hold s0 and bj_lane = base[lane % 4]).
__device__ __forceinline__ float mhc_rho(const float* sred, int m, int nd, float eps) {
    return 1.f / sqrtf(sred[m] / (float)nd + eps);
}
// Lane l evaluates coefficient l % 4 and the warp shares them by shuffles: one inlined copy of the sigmoid (expf
// and a reciprocal) instead of 4 (a batch-1 launch walks its code once, so its time follows the distinct
// instructions it executes). Each coefficient is the same expression of the same values as before: the same
// bits. Needs the whole warp (warps 0-7 are full and converged here).
__device__ __forceinline__ void mhc_pre_coefs(const float* sred, float rho, float s0, float bj_lane, float hc_eps,
                                              float* pre) {
    const int j = threadIdx.x & (MHC_N - 1);
    const float pj = mhc_sigmoid(sred[j] * rho * s0 + bj_lane) + hc_eps;
#pragma unroll
    for (int k = 0; k < MHC_N; ++k) pre[k] = __shfl_sync(0xffffffffu, pj, k);
}

// One column c of the collapse into av[c] from its 4 stream values, its square added to ss.
__device__ __forceinline__ float mhc_collapse_at(const u16 (&raw)[MHC_N], const float* pre, int c, float ss,
                                                 float* av) {
    float x[MHC_N];
#pragma unroll
    for (int j = 0; j < MHC_N; ++j) x[j] = bf16_to_f32(raw[j]);
    const float af = mhc_collapse_col(pre, x);
    av[c] = af;
    return mhc_sq_add(ss, af);
}

// a = bf16(sum_j pre_j x_j) at the thread's columns c = tid, tid + 256, ... into av; returns the thread's sum of
// squares, added in column order. A round whose 16 columns are all in the row (every round when D % 4096 == 0)
// issues its 64 loads together, unguarded; a partial round (the row's end) takes one column per trip. v6 guarded
// every load of every round: ~250 more instructions on the batch-1 path (each fetched once per launch).
__device__ __forceinline__ float mhc_collapse(const u16* __restrict__ xr, int D, const float* pre, float* av) {
    float ss = 0.f;
    for (int c0 = threadIdx.x; c0 < D; c0 += 256 * MHC_COL_U) {
        if (c0 + 256 * (MHC_COL_U - 1) < D) {
            u16 raw[MHC_COL_U][MHC_N];
#pragma unroll
            for (int u = 0; u < MHC_COL_U; ++u)
#pragma unroll
                for (int j = 0; j < MHC_N; ++j) raw[u][j] = xr[j * D + c0 + 256 * u];
#pragma unroll
            for (int u = 0; u < MHC_COL_U; ++u) ss = mhc_collapse_at(raw[u], pre, c0 + 256 * u, ss, av);
        } else {
#pragma unroll 1
            for (int c = c0; c < D; c += 256) {
                u16 raw[MHC_N];
#pragma unroll
                for (int j = 0; j < MHC_N; ++j) raw[j] = xr[j * D + c];
                ss = mhc_collapse_at(raw, pre, c, ss, av);
            }
        }
    }
    return ss;
}

// y = bf16(norm_w * (a * inv)) at the thread's columns.
__device__ __forceinline__ void mhc_store_y(const float* __restrict__ norm_w, const float* av, float inv, int D,
                                            u16* __restrict__ yr) {
    for (int c0 = threadIdx.x; c0 < D; c0 += 256 * MHC_COL_U) {
        float w[MHC_COL_U];
#pragma unroll
        for (int u = 0; u < MHC_COL_U; ++u) w[u] = c0 + 256 * u < D ? norm_w[c0 + 256 * u] : 0.f;
#pragma unroll
        for (int u = 0; u < MHC_COL_U; ++u) {
            const int c = c0 + 256 * u;
            if (c < D) yr[c] = f32_to_bf16(w[u] * (av[c] * inv));
        }
    }
}

// norm_w at a lane's 4 columns of the 128-block at b0 (0 past the row).
__device__ __forceinline__ void mhc_load_w4(const float* __restrict__ norm_w, int b0, int D, float (&w)[4]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int q = 0; q < 4; ++q) w[q] = b0 + q * 32 + lane < D ? norm_w[b0 + q * 32 + lane] : 0.f;
}

// y = bf16(norm_w * (a * inv)) and its FP8 fake-quantised copy yq in one pass, one 128-block per warp and trip
// (blocks warp, warp + 8, ...): yq from the f32 normalised values, or (yq_bf16) from y's bf16 values, the same
// bits as attn_row_prep of y. y's values are mhc_store_y's expression at the same columns: the same bits. With
// ycr / ycsr (D % 128 == 0) also yq's e4m3 codes [D] and block scales [D / 128]: code * scale = yq.
// v7: one trip per block, not unrolled (v6 unrolled 8 blocks, of which D = 4096 walked 4, plus mhc_store_y's 16
// columns: ~1000 more instructions that a batch-1 launch fetches once each); the next block's norm weights are
// loaded one trip ahead, so a trip waits for no load but its first (they are in L1: prefetched at the start).
__device__ __forceinline__ void mhc_store_yq(const float* __restrict__ norm_w, const float* av, float inv, int D,
                                             int yq_bf16, u16* __restrict__ yr, u16* __restrict__ yqr,
                                             u8* __restrict__ ycr, float* __restrict__ ycsr) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float w[4];
    mhc_load_w4(norm_w, warp * 128, D, w);
#pragma unroll 1
    for (int b0 = warp * 128; b0 < D; b0 += MHC_FIN_WARPS * 128) {  // warp-uniform: fq_block's shuffles
        float wn[4];
        mhc_load_w4(norm_w, b0 + MHC_FIN_WARPS * 128, D, wn);
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int c = b0 + q * 32 + lane;
            const float o = c < D ? w[q] * (av[c] * inv) : 0.f;
            const u16 yb = f32_to_bf16(o);
            if (c < D) yr[c] = yb;
            v[q] = yq_bf16 ? bf16_to_f32(yb) : o;
        }
        u32 codes;
        float sc;
        fq_block_codes(v, codes, sc);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int c = b0 + q * 32 + lane;
            if (c < D) yqr[c] = f32_to_bf16(v[q]);
            if (ycr && c < D) ycr[c] = (u8)(codes >> (8 * q));
            w[q] = wn[q];
        }
        if (ycsr && lane == 0) ycsr[b0 >> 7] = sc;
    }
}

template <int M>
__device__ void mhc_finish_body(const u16* __restrict__ X, const float* __restrict__ ws, int chunks, int rows,
                                int D, const float* scale, const float* base, const float* __restrict__ norm_w,
                                float eps, float hc_eps, int iters, float* mix, u16* __restrict__ y,
                                u16* __restrict__ yq, int yq_bf16, u8* __restrict__ yc, float* __restrict__ ycs,
                                u16* __restrict__ xcopy) {
    __shared__ float sred[M + 1];
    __shared__ float sh[MHC_FIN_WARPS];
    __shared__ float av[MHC_MAX_D];  // the collapsed row (bf16 values)
    const int row = blockIdx.x, warp = threadIdx.x >> 5, nd = MHC_N * D;
    const u16* xr = X + (u64)row * nd;
    uint4 cp[MHC_COPY_U];
    if (xcopy) mhc_copy_load(xr, nd, cp);
    float s0 = 0.f, bj = 0.f;  // weights (bj: base[lane % 4]): loaded beside the partials
    // The row's streams (read by the collapse after the partial sums) and the norm weights (read by the output
    // phases; the 43 layers' do not stay in L2 between steps) into L1 now. Loading them into registers
    // instead doubled the kernel's registers (82 -> 158: half the blocks per SM for prefill).
    prefetch_l1(xr, nd * 2);
    prefetch_l1(norm_w, D * 4);
    if (warp < MHC_FIN_WARPS) {
        s0 = scale[0];
        bj = base[threadIdx.x & (MHC_N - 1)];
    }
    mhc_partial_sums<M>(ws, chunks, rows, row, sred);
    if (xcopy) mhc_copy_store(xr, xcopy + (u64)row * nd, nd, cp);
    __syncthreads();
    const float rho = mhc_rho(sred, M, nd, eps);
    if (warp == MHC_FIN_WARPS) {
        if (M == MHC_MIX) mhc_post_comb(sred, rho, scale, base, hc_eps, iters, mix + (u64)row * MHC_MIX);
        return;
    }
    float pre[MHC_N];
    mhc_pre_coefs(sred, rho, s0, bj, hc_eps, pre);
    const float ss = mhc_collapse(xr, D, pre, av);
    const float inv = 1.f / sqrtf(mhc_block_sum(ss, sh) / (float)D + eps);  // its barriers publish av
    if (yq)
        mhc_store_yq(norm_w, av, inv, D, yq_bf16, y + (u64)row * D, yq + (u64)row * D,
                     yc ? yc + (u64)row * D : nullptr, ycs ? ycs + (u64)row * (D >> 7) : nullptr);
    else
        mhc_store_y(norm_w, av, inv, D, y + (u64)row * D);
}

#define MHC_FINISH_KERNEL(M)                                                                                     \
    extern "C" __global__ void __launch_bounds__(288)                                                            \
        hc_finish##M(const u16* X, const float* ws, int chunks, int rows, int D, const float* scale,             \
                     const float* base, const float* norm_w, float eps, float hc_eps, int iters, float* mix,     \
                     u16* y, u16* yq, int yq_bf16, u8* yc, float* ycs, u16* xcopy) {                             \
        pdl_wait();                                                                                              \
        mhc_finish_body<M>(X, ws, chunks, rows, D, scale, base, norm_w, eps, hc_eps, iters, mix, y, yq, yq_bf16, \
                           yc, ycs, xcopy);                                                                      \
    }
MHC_FINISH_KERNEL(24)
MHC_FINISH_KERNEL(4)
#undef MHC_FINISH_KERNEL
