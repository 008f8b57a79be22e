// FP8 (e4m3, 128x128 UE8M0 block scales) weight x bf16 activation GEMV/skinny GEMM for decode.
//
// Math:    y[b, n] = sum_k x[b, k] * e4m3(W[n, k]) * S[n / 128, k / 128]      b < B <= 64, f32 accumulation.
// Layout:  x bf16 [B, K] row-major; W u8 [N, K] row-major (checkpoint layout, read directly, no dequantised
//          copy); S u8 UE8M0 [ceil(N/128), ceil(K/128)]; y f32 or bf16 [B, N]; optional workspace f32
//          [splits, B, N] for split-K partial sums (then `fp8_gemv_reduce` sums them in a fixed order).
// Launch:  grid (ceil(N/32), splits), block 256 = 8 warps. A block owns 32 rows (two m16 tiles); its warps
//          take 128-wide K blocks round-robin (kb = split*8 + warp, step 8*splits), then reduce through shared
//          memory. NT = ceil(B/8) batch tiles of 8 (kernels fp8_gemv_nt1/2/4/8).
// Compute: tensor cores for every batch size (mma.sync m16n8k16 bf16, sm_80+: runs on sm_90 and sm_120).
//          Each thread loads 16 weight bytes per row with one 16-byte streaming load; an e4m3 byte becomes a
//          bf16 by moving its bits (value * 2^-120), then one packed bf16 multiply by 2^120 * S (exact: power
//          of two, e4m3 has 3 mantissa bits) applies the block scale before the mma. K is permuted inside each
//          16-byte chunk (pairs (b0,b2) and (b1,b3)) so the conversion is 2-3 ALU ops per 2 weights; the
//          activations get the same permutation with two byte_perms per fragment.
// Constraints: K % 16 == 0 (16-byte row alignment; K need not be a multiple of 128: partial chunks load
//          zeros), N any, 1 <= B <= 64, scale exponent byte <= 134 (scale <= 2^7; real scales are < 1).
// Variants / timings: see BENCH_NOTES.md.
#include "common.cuh"

#define GEMV_WARPS 8
#define GEMV_MT 2

// 4 e4m3 bytes (b0..b3) -> bf16x2 raw bit patterns, value * 2^-120: lo = (b0, b2), hi = (b1, b3).
__device__ __forceinline__ void e4m3x4_raw(u32 w, u32& lo, u32& hi) {
    lo = ((w << 8) & 0x80008000u) | ((w << 4) & 0x07f007f0u);
    hi = (w & 0x80008000u) | ((w >> 4) & 0x07f007f0u);
}

__device__ __forceinline__ u32 word_of(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

template <int NT>
__device__ __forceinline__ void fp8_gemv_body(const u16* __restrict__ x, const u8* __restrict__ w,
                                              const u8* __restrict__ s, void* __restrict__ out,
                                              float* __restrict__ ws, int B, int N, int K, int out_bf16) {
    __shared__ float red[4 * GEMV_MT * NT * 4 * 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 32;
    const int kblocks = (K + 127) >> 7;
    const u8* srow = s + (u64)(row0 >> 7) * kblocks;

    const u8* wr[GEMV_MT][2];
    bool rv[GEMV_MT][2];
#pragma unroll
    for (int mt = 0; mt < GEMV_MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + mt * 16 + h * 8 + g;
            rv[mt][h] = r < N;
            wr[mt][h] = w + (u64)(r < N ? r : N - 1) * K;
        }

    float acc[GEMV_MT * NT * 4];
#pragma unroll
    for (int i = 0; i < GEMV_MT * NT * 4; ++i) acc[i] = 0.f;

    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int kb = blockIdx.y * GEMV_WARPS + warp; kb < kblocks; kb += gridDim.y * GEMV_WARPS) {
        // Issue every weight load of this 128-wide K block before using any: 8 x 16 B in flight per thread.
        uint4 wv[2][GEMV_MT][2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int k0 = kb * 128 + c * 64 + t * 16;
#pragma unroll
            for (int mt = 0; mt < GEMV_MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    wv[c][mt][h] = (k0 < K && rv[mt][h]) ? ldg_stream(wr[mt][h] + k0) : zero;
        }
        u32 e = srow[kb];
        e = e > 134u ? 134u : e;
        u32 f = (e + 120u) << 7;  // bf16 bits of 2^120 * 2^(e-127)
        f |= f << 16;

#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int k0 = kb * 128 + c * 64 + t * 16;
            u32 a[4][GEMV_MT][4];
#pragma unroll
            for (int st = 0; st < 4; ++st)
#pragma unroll
                for (int mt = 0; mt < GEMV_MT; ++mt) {
                    u32 lo0, hi0, lo1, hi1;
                    e4m3x4_raw(word_of(wv[c][mt][0], st), lo0, hi0);
                    e4m3x4_raw(word_of(wv[c][mt][1], st), lo1, hi1);
                    a[st][mt][0] = bf16x2_mul(lo0, f);
                    a[st][mt][1] = bf16x2_mul(lo1, f);
                    a[st][mt][2] = bf16x2_mul(hi0, f);
                    a[st][mt][3] = bf16x2_mul(hi1, f);
                }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int b = j * 8 + g;
                const bool ok = k0 < K && b < B;
                const u16* xp = x + (u64)(ok ? b : 0) * K + (ok ? k0 : 0);
                const uint4 x0 = ok ? ldg_keep(xp) : zero;
                const uint4 x1 = ok ? ldg_keep(xp + 8) : zero;
                const u32 X[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int st = 0; st < 4; ++st) {
                    const u32 b0 = byte_perm(X[2 * st], X[2 * st + 1], 0x5410);  // x[4st], x[4st+2]
                    const u32 b1 = byte_perm(X[2 * st], X[2 * st + 1], 0x7632);  // x[4st+1], x[4st+3]
#pragma unroll
                    for (int mt = 0; mt < GEMV_MT; ++mt)
                        mma_bf16_16816(&acc[(mt * NT + j) * 4], a[st][mt][0], a[st][mt][1], a[st][mt][2],
                                       a[st][mt][3], b0, b1);
                }
            }
        }
    }

    block_reduce_8warps<GEMV_MT * NT * 4>(acc, red);
    if (warp != 0) return;
#pragma unroll
    for (int mt = 0; mt < GEMV_MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + mt * 16 + g + (i >> 1) * 8;
                const int b = j * 8 + 2 * t + (i & 1);
                if (row >= N || b >= B) continue;
                const float v = acc[(mt * NT + j) * 4 + i];
                if (gridDim.y == 1) store_out(out, (u64)b * N + row, v, out_bf16);
                else ws[((u64)blockIdx.y * B + b) * N + row] = v;
            }
}

#define FP8_GEMV_KERNEL(NT)                                                                               \
    extern "C" __global__ void __launch_bounds__(256) fp8_gemv_nt##NT(                                    \
        const u16* x, const u8* w, const u8* s, void* out, float* ws, int B, int N, int K, int out_bf16) { \
        fp8_gemv_body<NT>(x, w, s, out, ws, B, N, K, out_bf16);                                           \
    }
FP8_GEMV_KERNEL(1)
FP8_GEMV_KERNEL(2)
FP8_GEMV_KERNEL(4)
FP8_GEMV_KERNEL(8)

// Sums split-K partials ws[splits, total] in split order (deterministic) and stores f32 or bf16.
extern "C" __global__ void gemv_splitk_reduce(const float* __restrict__ ws, void* __restrict__ out, int splits,
                                              int total, int out_bf16) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float v = 0.f;
    for (int sp = 0; sp < splits; ++sp) v += ws[(u64)sp * total + i];
    store_out(out, (u64)i, v, out_bf16);
}
