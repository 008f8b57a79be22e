// Grouped GEMVs of the attention block, split-K reduced inside the kernel (one launch per projection step).
//
// Math: for each group g < groups (blockIdx.z): y_g[b, n] = sum_k x_g[b, k] * W_g[n, k], b < B <= 64,
//   n < n[g], f32 accumulation; y_g f32 or bf16 [B, n[g]], x_g bf16 [B, K]. Groups share K, B and the output
//   type; their W, x, y are independent pointers, so the 8 wo_a groups, wq_a + wkv (same x) and wq_b + the
//   indexer's wq_b (same x) each take one launch.
// attn_fp8_gemv_ntX: W e4m3 + UE8M0 128x128 scales; the block body is fp8_gemv_body of fp8_gemv.cu (declared
//   here, defined later in the same translation unit: the build concatenates the .cu files by name).
// attn_bf16_gemv_ntX: W bf16 (the stacked compressor / weights_proj matrix). Tensor cores like fp8_gemv: a
//   block owns 32 rows (two m16 tiles), its 8 warps take 64-wide K chunks round-robin; per chunk a thread
//   loads 16 bytes (8 bf16) of each of its 4 rows at k0 + 8t for the two 32-wide halves: 8 x 16 B in flight.
//   K is permuted inside each 32-wide half (logical k pairs (2t, 2t+1) and (2t+8, 2t+9) of mma step st are
//   physical k0 + 8t + 4st + {0,1} and {2,3}); x gets the same permutation for free (same per-thread words).
// Split-K (gridDim.y > 1): partials go to ws[g][split][B][n[g]]; the last block of each (group, row tile) to
//   arrive (counter in cnt, reset by that block, so graph replays see zeros) sums them in split order — the
//   order of gemv_splitk_reduce, so results are bit-identical to the two-launch path.
// Launch: grid (ceil(nmax/32), splits, groups), block 256. fp8: K % 16 == 0; bf16: K % 8 == 0.
// Variants / timings (H200, eager step with events, each incl. ~5 us launch gap): wo_a as 8 fp8_gemv +
//   gemv_splitk_reduce launches (16 launches, ~60-70 us at B1) -> one grouped launch, 20 us at B1/B8, 64 us
//   at B64; wq_a + wkv 10 us (B1) / 25 (B64); wq_b + indexer wq_b 20 / 78; wo_b 17 / 50. bf16 (CSA 2624 x
//   4096): the warp-per-row CUDA-core kernel -> this one: 14 us at B1, 42 us at B64 (HCA 1024 rows: 9 / 28).
//   Correctness: engine/tests/gpu_attention_gemv.rs (fp8 bit-exact vs fp8_gemv, bf16 <= 0.3% of the bound).
#include "common.cuh"

#define ATTN_GEMV_GROUPS 8

struct AttnGemv {
    const u16* x[ATTN_GEMV_GROUPS];
    const void* w[ATTN_GEMV_GROUPS];
    const u8* s[ATTN_GEMV_GROUPS];  // fp8 scales (unused for bf16)
    void* out[ATTN_GEMV_GROUPS];
    float* ws;  // [groups, splits, B, nmax] f32 when split
    u32* cnt;   // [groups, ceil(nmax/32)] zeros when split
    int n[ATTN_GEMV_GROUPS];
    int B, K, nmax, out_bf16;
};

template <int NT>
__device__ __forceinline__ void fp8_gemv_body(const u16* __restrict__ x, const u8* __restrict__ w,
                                              const u8* __restrict__ s, void* __restrict__ out,
                                              float* __restrict__ ws, int B, int N, int K, int out_bf16);

__device__ __forceinline__ float* attn_gemv_ws(const AttnGemv& p, int g) {
    return gridDim.y > 1 ? p.ws + (u64)g * gridDim.y * p.B * p.nmax : nullptr;
}

// Called by every thread after this block's partials are stored: the last block of the row tile reduces.
__device__ __forceinline__ void attn_splitk_finish(const AttnGemv& p, int g, int N) {
    __shared__ int last;
    const int tiles = (p.nmax + 31) >> 5;
    __threadfence();  // this block's partials are visible before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* c = p.cnt + (u64)g * tiles + blockIdx.x;
        last = atomicAdd(c, 1u) == gridDim.y - 1u;
        if (last) atomicExch(c, 0u);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float* ws = attn_gemv_ws(p, g);
    const int row0 = blockIdx.x * 32;
    for (int i = threadIdx.x; i < 32 * p.B; i += blockDim.x) {
        const int row = row0 + (i & 31), b = i >> 5;
        if (row >= N) continue;
        float v = 0.f;
        for (int sp = 0; sp < (int)gridDim.y; ++sp) v += __ldcg(ws + ((u64)sp * p.B + b) * N + row);
        store_out(p.out[g], (u64)b * N + row, v, p.out_bf16);
    }
}

__device__ __forceinline__ u32 attn_word(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

template <int NT>
__device__ __forceinline__ void attn_bf16_body(const u16* __restrict__ x, const u16* __restrict__ w,
                                               void* __restrict__ out, float* __restrict__ ws, int B, int N,
                                               int K, int out_bf16) {
    __shared__ float red[4 * 2 * NT * 4 * 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 32;
    const int chunks = (K + 63) >> 6;
    const u16* wr[2][2];
    bool rv[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + mt * 16 + h * 8 + g;
            rv[mt][h] = r < N;
            wr[mt][h] = w + (u64)(r < N ? r : N - 1) * K;
        }
    float acc[2 * NT * 4];
#pragma unroll
    for (int i = 0; i < 2 * NT * 4; ++i) acc[i] = 0.f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int kc = blockIdx.y * 8 + warp; kc < chunks; kc += gridDim.y * 8) {
        uint4 wv[2][2][2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int k0 = kc * 64 + c * 32 + t * 8;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    wv[c][mt][h] = (k0 < K && rv[mt][h]) ? ldg_stream(wr[mt][h] + k0) : zero;
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int k0 = kc * 64 + c * 32 + t * 8;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int b = j * 8 + g;
                const bool ok = k0 < K && b < B;
                const uint4 xv = ok ? ldg_keep(x + (u64)b * K + k0) : zero;
#pragma unroll
                for (int st = 0; st < 2; ++st) {
                    const u32 b0 = attn_word(xv, 2 * st), b1 = attn_word(xv, 2 * st + 1);
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt)
                        mma_bf16_16816(&acc[(mt * NT + j) * 4], attn_word(wv[c][mt][0], 2 * st),
                                       attn_word(wv[c][mt][1], 2 * st), attn_word(wv[c][mt][0], 2 * st + 1),
                                       attn_word(wv[c][mt][1], 2 * st + 1), b0, b1);
                }
            }
        }
    }
    block_reduce_8warps<2 * NT * 4>(acc, red);
    if (warp != 0) return;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
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

template <int NT, bool FP8>
__device__ __forceinline__ void attn_gemv_grouped(const AttnGemv& p) {
    const int g = blockIdx.z, N = p.n[g];
    if (blockIdx.x * 32 >= N) return;  // the whole block: this group has fewer row tiles than the largest
    float* ws = attn_gemv_ws(p, g);
    if (FP8)
        fp8_gemv_body<NT>(p.x[g], (const u8*)p.w[g], p.s[g], p.out[g], ws, p.B, N, p.K, p.out_bf16);
    else
        attn_bf16_body<NT>(p.x[g], (const u16*)p.w[g], p.out[g], ws, p.B, N, p.K, p.out_bf16);
    if (gridDim.y > 1) attn_splitk_finish(p, g, N);
}

#define ATTN_GEMV_KERNELS(NT)                                                                              \
    extern "C" __global__ void __launch_bounds__(256) attn_fp8_gemv_nt##NT(AttnGemv p) {                   \
        attn_gemv_grouped<NT, true>(p);                                                                    \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(256) attn_bf16_gemv_nt##NT(AttnGemv p) {                  \
        attn_gemv_grouped<NT, false>(p);                                                                   \
    }
ATTN_GEMV_KERNELS(1)
ATTN_GEMV_KERNELS(2)
ATTN_GEMV_KERNELS(4)
ATTN_GEMV_KERNELS(8)
