// Lightning-indexer scores of many queries (batched prefill, spec 2.6), on tensor cores.
//
// Math:   for query row r (position pos, slot `slot`) and every visible entry w < n = min((pos + 1) / ratio, cap):
//         score[r, w] = sum_h (scale * wts[r, h]) * ReLU(<q[r, h], K[slot, w]>), f32 accumulation of bf16
//         products (the decode kernel attn_index_score computes the same sum in another order). Rows with
//         n <= k are skipped: attn_index_topk selects all their entries without reading scores. The
//         compressor ran over the whole call first, so entries completed inside the call are visible exactly
//         to the queries at or after their last token (n is computed from each row's own position).
// Layout: q bf16 [rows, heads, dim]; wts row r at wts + r*wts_stride (f32, unscaled); keys bf16 [slots, cap, dim];
//         scores f32, row r at scores + (r - row_begin)*cap (a group of rows at a time, see the launcher).
// Launch: grid (splits, rows of the group), block 128 (4 warps, warp w = heads 16w..16w+15; heads <= 64);
//         entry tiles of 64 go round-robin to the splits, double-buffered with cp.async. A warp keeps its q
//         fragments in registers; per tile it computes the 16 x 64 logits with mma.sync, applies ReLU and the
//         head weights, sums its 16 heads with shuffles; the 4 warps' sums are added in a fixed order.
//         Dynamic shared memory pf_index_smem(dim): q [64][dim+8] + 2 key tiles [64][dim+8] bf16 + 4x64 f32.
// Constraints: dim in {64, 128}.
// Variants tried: none measured yet (first version).
#include "common.cuh"

#define PFI_ET 64

struct PfIndexScore {
    const u16* q;
    const float* wts;
    const u16* keys;
    const int* slots;
    const int* positions;
    float* scores;
    int wts_stride, heads, dim, cap, ratio, k, row_begin;
    float scale;
};

template <int DIM>
__device__ __forceinline__ void pf_index_body(const PfIndexScore& p) {
    constexpr int LD = DIM + 8, CPR = DIM / 8;
    extern __shared__ __align__(16) u8 pf_dyn_smem[];
    u16* Qs = (u16*)pf_dyn_smem;      // [64][LD]
    u16* Ks = Qs + 64 * LD;           // [2][ET][LD]
    float* red = (float*)(Ks + 2 * PFI_ET * LD);  // [4][ET]
    const int r = p.row_begin + blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int pos = p.positions[r], slot = p.slots[r];
    const int n = min((pos + 1) / p.ratio, p.cap);
    if (n <= p.k) return;
    const int ntiles = (n + PFI_ET - 1) / PFI_ET;
    if ((int)blockIdx.x >= ntiles) return;

    for (int c = tid; c < 64 * CPR; c += 128) {
        const int h = c / CPR, part = c - h * CPR;
        const bool ok = h < p.heads;
        const u16* src = ok ? p.q + ((u64)r * p.heads + h) * DIM + part * 8 : p.q;
        pf_cp16(smem_u32(Qs + h * LD + part * 8), src, ok);
    }
    const u16* kb = p.keys + (u64)slot * p.cap * DIM;
    auto load_keys = [&](int tile, u16* dst) {
        for (int c = tid; c < PFI_ET * CPR; c += 128) {
            const int j = c / CPR, part = c - j * CPR, e = tile * PFI_ET + j;
            const bool ok = e < n;
            pf_cp16(smem_u32(dst + j * LD + part * 8), ok ? (const void*)(kb + (u64)e * DIM + part * 8) : (const void*)kb,
                    ok);
        }
    };
    load_keys(blockIdx.x, Ks);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    u32 qa[DIM / 16][4];
#pragma unroll
    for (int kk = 0; kk < DIM / 16; ++kk) pf_frag_a(Qs, LD, warp * 16, kk * 16, qa[kk]);
    const int h0 = warp * 16 + gq, h1 = h0 + 8;
    const float w0 = h0 < p.heads ? p.wts[(u64)r * p.wts_stride + h0] * p.scale : 0.f;
    const float w1 = h1 < p.heads ? p.wts[(u64)r * p.wts_stride + h1] * p.scale : 0.f;
    int it = 0;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x, ++it) {
        const u16* Kt = Ks + (it & 1) * PFI_ET * LD;
        const int nxt = tile + gridDim.x;
        if (nxt < ntiles) {
            load_keys(nxt, Ks + ((it + 1) & 1) * PFI_ET * LD);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int nb = 0; nb < PFI_ET / 16; ++nb) {
            float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int kk = 0; kk < DIM / 16; ++kk) {
                u32 b0[2], b1[2];
                pf_frag_b(Kt, LD, nb * 16, kk * 16, b0, b1);
                pf_mma(s[0], qa[kk], b0);
                pf_mma(s[1], qa[kk], b1);
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    float v = w0 * fmaxf(s[nt][i], 0.f) + w1 * fmaxf(s[nt][2 + i], 0.f);
                    v += __shfl_xor_sync(0xffffffffu, v, 4);
                    v += __shfl_xor_sync(0xffffffffu, v, 8);
                    v += __shfl_xor_sync(0xffffffffu, v, 16);
                    if (gq == 0) red[warp * PFI_ET + nb * 16 + nt * 8 + 2 * tq + i] = v;
                }
        }
        __syncthreads();
        if (tid < PFI_ET) {
            const int e = tile * PFI_ET + tid;
            if (e < n)
                p.scores[(u64)(r - p.row_begin) * p.cap + e] =
                    ((red[tid] + red[PFI_ET + tid]) + red[2 * PFI_ET + tid]) + red[3 * PFI_ET + tid];
        }
    }
}

#define PF_INDEX_KERNEL(D) \
    extern "C" __global__ void __launch_bounds__(128) pf_index_score_d##D(PfIndexScore p) { pf_index_body<D>(p); }
PF_INDEX_KERNEL(64)
PF_INDEX_KERNEL(128)
