// BF16 weight x bf16 activation GEMV / skinny GEMM for decode: the MoE gate ([E, D]) and the vocabulary
// head ([vocab, D], 1 GB at full size: it must run at memory bandwidth).
//
// Math:    y[b, n] = sum_k x[b, k] * W[n, k], f32 accumulation, b < B <= 64; y f32 or bf16 [B, N].
// Layout:  x bf16 [B, K]; W bf16 [N, K] row-major (checkpoint layout); optional split-K workspace
//          f32 [splits, B, N], summed by gemv_splitk_reduce (fp8_gemv.cu) in a fixed order.
// Launch:  grid (ceil(N/32), splits), block 256 = 8 warps. A block owns 32 rows (two m16 tiles); its warps
//          take 64-wide K blocks round-robin and reduce through shared memory (block_reduce_8warps).
//          NT = ceil(B/8) batch tiles of 8 (bf16_gemv_nt1/2/4/8): tensor cores at every batch size, since
//          at B = 64 the head is 68 GFLOP, too much for f32 FMAs (~1 ms) but ~0.1 ms on mma.sync.
// Compute: mma.sync m16n8k16 bf16 (sm_80+, same on sm_90 and sm_120). Each thread streams 16 bytes
//          (8 weights) per row and 32-wide chunk; K is permuted within a thread's 8 values (words 0/2 form
//          the k16 mma's low half, 1/3 its high half), and the activations are read with the same mapping, so
//          no shuffles are needed. 8 x 16 B weight loads are issued before the first mma.
// Constraints: K % 8 == 0 (16-byte rows), 1 <= B <= 64.
#include "common.cuh"

#define BG_WARPS 8
#define BG_MT 2
#define BG_KB 64

template <int NT>
__device__ __forceinline__ void bf16_gemv_body(const u16* __restrict__ x, const u16* __restrict__ w,
                                               void* __restrict__ out, float* __restrict__ ws, int B, int N,
                                               int K, int out_bf16) {
    __shared__ float red[4 * BG_MT * NT * 4 * 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 32;
    const int kblocks = (K + BG_KB - 1) / BG_KB;

    const u16* wr[BG_MT][2];
    bool rv[BG_MT][2];
#pragma unroll
    for (int mt = 0; mt < BG_MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + mt * 16 + h * 8 + g;
            rv[mt][h] = r < N;
            wr[mt][h] = w + (u64)(r < N ? r : N - 1) * K;
        }

    float acc[BG_MT * NT * 4];
#pragma unroll
    for (int i = 0; i < BG_MT * NT * 4; ++i) acc[i] = 0.f;

    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int kb = blockIdx.y * BG_WARPS + warp; kb < kblocks; kb += gridDim.y * BG_WARPS) {
        uint4 wv[2][BG_MT][2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int k0 = kb * BG_KB + c * 32 + t * 8;
#pragma unroll
            for (int mt = 0; mt < BG_MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    wv[c][mt][h] = (k0 < K && rv[mt][h]) ? ldg_stream(wr[mt][h] + k0) : zero;
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int k0 = kb * BG_KB + c * 32 + t * 8;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int b = j * 8 + g;
                const bool ok = k0 < K && b < B;
                const uint4 xv = ok ? ldg_keep(x + (u64)b * K + k0) : zero;
#pragma unroll
                for (int st = 0; st < 2; ++st) {
                    const u32 b0 = st == 0 ? xv.x : xv.z;
                    const u32 b1 = st == 0 ? xv.y : xv.w;
#pragma unroll
                    for (int mt = 0; mt < BG_MT; ++mt) {
                        const uint4& w0 = wv[c][mt][0];
                        const uint4& w1 = wv[c][mt][1];
                        mma_bf16_16816(&acc[(mt * NT + j) * 4], st == 0 ? w0.x : w0.z, st == 0 ? w1.x : w1.z,
                                       st == 0 ? w0.y : w0.w, st == 0 ? w1.y : w1.w, b0, b1);
                    }
                }
            }
        }
    }

    block_reduce_8warps<BG_MT * NT * 4>(acc, red);
    if (warp != 0) return;
#pragma unroll
    for (int mt = 0; mt < BG_MT; ++mt)
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

#define BF16_GEMV_KERNEL(NT)                                                                        \
    extern "C" __global__ void __launch_bounds__(256) bf16_gemv_nt##NT(                             \
        const u16* x, const u16* w, void* out, float* ws, int B, int N, int K, int out_bf16) {      \
        bf16_gemv_body<NT>(x, w, out, ws, B, N, K, out_bf16);                                       \
    }
BF16_GEMV_KERNEL(1)
BF16_GEMV_KERNEL(2)
BF16_GEMV_KERNEL(4)
BF16_GEMV_KERNEL(8)
