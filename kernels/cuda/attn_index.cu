// Lightning indexer, decode (spec 2.6): scores of the LIVE compressed entries.
//
// attn_index_score: score[slot, w] = scale * sum_j wts[row, j] * ReLU(<q[row, j], K[slot, w]>) for
//   w < n = (pos + 1) / ratio (only live entries: the cost grows with the context, not the capacity). Rows with
//   n <= k skip scoring (every entry is selected). q bf16 [rows, heads, dim]; wts f32 rows of stride
//   wts_stride; keys bf16 [slots, cap, dim]; scores f32 [slots, cap].
//   Tensor cores (mma.sync m16n8k16 bf16, f32 accumulation of the exact bf16 products): a warp takes 16
//   entries at a time as the m16 rows (A, 16-byte loads straight from the cache) against all heads as n8
//   column tiles (B, from q staged in shared memory). K is permuted inside each 32-wide chunk (lane t's 16
//   bytes at 8t hold logical pairs (2t, 2t+1) and (2t+8, 2t+9) of two mma steps) and q is read with the same
//   mapping (one 16-byte shared load per chunk and column tile; rows of dim/2 + 16 words: conflict-free).
//   The epilogue weighs ReLU(dot) per head and sums the heads in-thread, then over the 4 lanes of a row.
//   Launch: grid (blocks, rows), block 128; warps take 16-entry tiles (blockIdx.x * 4 + warp) + i * 4 *
//   gridDim.x. heads <= 64, dim % 32 == 0, dim <= 128.
// attn_index_topk (the top-k of these scores) is in attn_topk.cu.
// Variants (H200, B1, eager with ~5 us launch gaps): v1 CUDA-core scoring (lane = head, f32 FMA) 15 us at
//   pos 4095, 41 us at 65534. v2 (this): 8.4 / 9.0 us.
#include "common.cuh"

#define IX_MAX_HEADS 64
#define IX_MAX_DIM 128
#define IX_LDQ (IX_MAX_DIM / 2 + 16)  // words per staged q row (16 mod 32: conflict-free 16-byte loads)

struct AttnIndexScore {
    const u16* q;
    const float* wts;
    const u16* keys;
    const int* slots;
    const int* positions;
    float* scores;
    int wts_stride, heads, dim, cap, ratio, k;
    float scale;
    int pad;
};

extern "C" __global__ void __launch_bounds__(128) attn_index_score(AttnIndexScore p) {
    __shared__ __align__(16) u32 qs[IX_MAX_HEADS * IX_LDQ];
    __shared__ float ws[IX_MAX_HEADS];
    pdl_wait();
    const int row = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int slot = p.slots[row];
    int n = (p.positions[row] + 1) / p.ratio;
    n = n < p.cap ? n : p.cap;
    const int tiles = (n + 15) >> 4;
    if (n <= p.k || blockIdx.x * 4 >= tiles) return;
    const int ntn = (p.heads + 7) >> 3;  // n8 column tiles (heads padded with zero q and weight)
    const int words = p.dim >> 1, chunks = p.dim >> 5;
    for (int i = threadIdx.x; i < ntn * 8 * (words >> 2); i += blockDim.x) {
        const int h = i / (words >> 2), c = i - h * (words >> 2);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (h < p.heads) v = *((const uint4*)(p.q + ((u64)row * p.heads + h) * p.dim) + c);
        *(uint4*)(qs + h * IX_LDQ + c * 4) = v;
    }
    for (int h = threadIdx.x; h < ntn * 8; h += blockDim.x)
        ws[h] = h < p.heads ? p.wts[(u64)row * p.wts_stride + h] * p.scale : 0.f;
    __syncthreads();
    const u16* kb = p.keys + (u64)slot * p.cap * p.dim;
    float* out = p.scores + (u64)slot * p.cap;
    for (int tile = blockIdx.x * 4 + warp; tile < tiles; tile += gridDim.x * 4) {
        const int e0 = tile * 16 + g, e1 = e0 + 8;
        const u16* r0 = kb + (u64)min(e0, n - 1) * p.dim + 8 * t;
        const u16* r1 = kb + (u64)min(e1, n - 1) * p.dim + 8 * t;
        uint4 a0[4], a1[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            if (c < chunks) {
                a0[c] = *(const uint4*)(r0 + 32 * c);
                a1[c] = *(const uint4*)(r1 + 32 * c);
            }
        }
        float s0 = 0.f, s1 = 0.f;  // this lane's weighted sums for entries e0 and e1
        for (int nt = 0; nt < ntn; ++nt) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            const u32* qb = qs + (nt * 8 + g) * IX_LDQ + 4 * t;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                if (c >= chunks) break;
                const uint4 b = *(const uint4*)(qb + 16 * c);
                mma_bf16_16816(acc, a0[c].x, a1[c].x, a0[c].y, a1[c].y, b.x, b.y);
                mma_bf16_16816(acc, a0[c].z, a1[c].z, a0[c].w, a1[c].w, b.z, b.w);
            }
            const float w0 = ws[nt * 8 + 2 * t], w1 = ws[nt * 8 + 2 * t + 1];
            s0 += w0 * fmaxf(acc[0], 0.f) + w1 * fmaxf(acc[1], 0.f);
            s1 += w0 * fmaxf(acc[2], 0.f) + w1 * fmaxf(acc[3], 0.f);
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        if (t == 0) {
            if (e0 < n) out[e0] = s0;
            if (e1 < n) out[e1] = s1;
        }
    }
}
