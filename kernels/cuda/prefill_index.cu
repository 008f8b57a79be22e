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
// Launch: grid (splits, ceil(rows / 2)), block 128 (4 warps, warp w = heads 16w..16w+15; heads <= 64); a block
//         takes two consecutive rows: when they share a slot (one sequence) each key tile and each key fragment
//         serves both (the second row's q fragments in registers beside the first's), else the rows run in turn.
//         Entry tiles of 64 go round-robin to the splits, double-buffered with cp.async. A warp keeps its q
//         fragments in registers; per tile it computes the 16 x 64 logits with mma.sync, applies ReLU and the
//         head weights, sums its 16 heads with shuffles; the 4 warps' sums are added in a fixed order. A row's
//         arithmetic does not depend on its partner (the same bits alone or paired).
//         Dynamic shared memory pf_index_smem(dim): q [64][dim+8] + 2 key tiles [64][dim+8] bf16 + 2x4x64 f32.
// Constraints: dim in {64, 128}.
// Variants (H200, 8192-token prefill call of the full-size model, ncu): one row per block 16.7 ms per call (63
//         launches, 265 us each); two rows per block: see kernels/BENCH_NOTES.md (ninth session).
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
    int rows, pad;  // rows of this launch (row_begin .. row_begin + rows - 1)
};

// Visible entries of row r, or 0 when the row is skipped (n <= k: top-k takes every entry unscored).
__device__ __forceinline__ int pf_index_visible(const PfIndexScore& p, int r) {
    const int n = min((p.positions[r] + 1) / p.ratio, p.cap);
    return n <= p.k ? 0 : n;
}

// Queues the 64-entry key tile `tile` (entries past n zero-filled) into dst.
template <int DIM>
__device__ __forceinline__ void pf_index_keys(const u16* kb, int tile, int n, u16* dst) {
    constexpr int LD = DIM + 8, CPR = DIM / 8;
    for (int c = threadIdx.x; c < PFI_ET * CPR; c += 128) {
        const int j = c / CPR, part = c - j * CPR, e = tile * PFI_ET + j;
        const bool ok = e < n;
        pf_cp16(smem_u32(dst + j * LD + part * 8), ok ? (const void*)(kb + (u64)e * DIM + part * 8) : (const void*)kb,
                ok);
    }
}

// Queues row r's query heads (64 rows of the tile, heads past p.heads zero) into dst.
template <int DIM>
__device__ __forceinline__ void pf_index_q(const PfIndexScore& p, int r, u16* dst) {
    constexpr int LD = DIM + 8, CPR = DIM / 8;
    for (int c = threadIdx.x; c < 64 * CPR; c += 128) {
        const int h = c / CPR, part = c - h * CPR;
        const bool ok = h < p.heads;
        const u16* src = ok ? p.q + ((u64)r * p.heads + h) * DIM + part * 8 : p.q;
        pf_cp16(smem_u32(dst + h * LD + part * 8), src, ok);
    }
}

// The scores of R rows (R = 1, or 2 rows of one slot) over this block's tiles: every row's arithmetic is the
// same whatever R (the same mma sequence on the same key fragments, the same epilogue order), so a row's bits
// do not depend on its partner. Rows ra, rb (rb unused when R = 1) with na, nb_ visible entries (> 0).
template <int DIM, int R>
__device__ __forceinline__ void pf_index_rows(const PfIndexScore& p, int ra, int rb, int na, int nb_) {
    constexpr int LD = DIM + 8;
    extern __shared__ __align__(16) u8 pf_dyn_smem[];
    u16* Qs = (u16*)pf_dyn_smem;                  // [64][LD]
    u16* Ks = Qs + 64 * LD;                       // [2][ET][LD]; the second tile holds row 1's q at first
    float* red = (float*)(Ks + 2 * PFI_ET * LD);  // [R][4][ET]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int n = R == 2 ? max(na, nb_) : na;
    const int ntiles = (n + PFI_ET - 1) / PFI_ET;
    if ((int)blockIdx.x >= ntiles) return;
    const u16* kb = p.keys + (u64)p.slots[ra] * p.cap * DIM;
    pf_index_q<DIM>(p, ra, Qs);
    if (R == 2) pf_index_q<DIM>(p, rb, Ks + PFI_ET * LD);
    pf_index_keys<DIM>(kb, blockIdx.x, n, Ks);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    u32 qa[R][DIM / 16][4];
    float w0[R], w1[R];
    const int h0 = warp * 16 + gq, h1 = h0 + 8;
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int kk = 0; kk < DIM / 16; ++kk) pf_frag_a(i ? Ks + PFI_ET * LD : Qs, LD, warp * 16, kk * 16, qa[i][kk]);
        const u64 wr = (u64)(i ? rb : ra) * p.wts_stride;
        w0[i] = h0 < p.heads ? p.wts[wr + h0] * p.scale : 0.f;
        w1[i] = h1 < p.heads ? p.wts[wr + h1] * p.scale : 0.f;
    }
    if (R == 2) __syncthreads();  // row 1's q is read before the second key tile overwrites it
    int it = 0;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x, ++it) {
        const u16* Kt = Ks + (it & 1) * PFI_ET * LD;
        const int nxt = tile + gridDim.x;
        if (nxt < ntiles) {
            pf_index_keys<DIM>(kb, nxt, n, Ks + ((it + 1) & 1) * PFI_ET * LD);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int nb = 0; nb < PFI_ET / 16; ++nb) {
            float s[R][2][4];
#pragma unroll
            for (int i = 0; i < R; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) s[i][j / 4][j % 4] = 0.f;
#pragma unroll
            for (int kk = 0; kk < DIM / 16; ++kk) {
                u32 b0[2], b1[2];
                pf_frag_b(Kt, LD, nb * 16, kk * 16, b0, b1);
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    pf_mma(s[i][0], qa[i][kk], b0);
                    pf_mma(s[i][1], qa[i][kk], b1);
                }
            }
#pragma unroll
            for (int i = 0; i < R; ++i)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        float v = w0[i] * fmaxf(s[i][nt][j], 0.f) + w1[i] * fmaxf(s[i][nt][2 + j], 0.f);
                        v += __shfl_xor_sync(0xffffffffu, v, 4);
                        v += __shfl_xor_sync(0xffffffffu, v, 8);
                        v += __shfl_xor_sync(0xffffffffu, v, 16);
                        if (gq == 0) red[(i * 4 + warp) * PFI_ET + nb * 16 + nt * 8 + 2 * tq + j] = v;
                    }
        }
        __syncthreads();
        if (tid < R * PFI_ET) {
            const bool second = tid >= PFI_ET;
            const int e = tile * PFI_ET + (tid % PFI_ET);
            const float* rr = red + (second ? 4 * PFI_ET : 0) + (tid % PFI_ET);
            if (e < (second ? nb_ : na))
                p.scores[(u64)((second ? rb : ra) - p.row_begin) * p.cap + e] =
                    ((rr[0] + rr[PFI_ET]) + rr[2 * PFI_ET]) + rr[3 * PFI_ET];
        }
    }
}

// Block (split, pair): rows row_begin + 2 * blockIdx.y and the next. Two rows of one slot share every key tile
// (half the key copies and fragment loads per score); rows of different slots, or a lone last row, run one
// after the other.
template <int DIM>
__device__ __forceinline__ void pf_index_body(const PfIndexScore& p) {
    pdl_wait();  // before any read: the previous kernel may still be running (PDL)
    const int r0 = p.row_begin + 2 * (int)blockIdx.y;
    const bool has1 = 2 * (int)blockIdx.y + 1 < p.rows;
    const int n0 = pf_index_visible(p, r0), n1 = has1 ? pf_index_visible(p, r0 + 1) : 0;
    if (n0 > 0 && n1 > 0 && p.slots[r0] == p.slots[r0 + 1]) {
        pf_index_rows<DIM, 2>(p, r0, r0 + 1, n0, n1);
        return;
    }
    if (n0 > 0) pf_index_rows<DIM, 1>(p, r0, r0, n0, n0);
    if (n0 > 0 && n1 > 0) __syncthreads();  // shared memory reused
    if (n1 > 0) pf_index_rows<DIM, 1>(p, r0 + 1, r0 + 1, n1, n1);
}

#define PF_INDEX_KERNEL(D) \
    extern "C" __global__ void __launch_bounds__(128) pf_index_score_d##D(PfIndexScore p) { pf_index_body<D>(p); }
PF_INDEX_KERNEL(64)
PF_INDEX_KERNEL(128)
