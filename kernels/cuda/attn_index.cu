// Lightning indexer, decode (spec 2.6): scores of the LIVE compressed entries and their top-k.
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
// attn_index_topk: the indices of the k largest scores of each row (all n when n <= k), ascending index
//   order, ties at the threshold broken towards lower indices (the CPU reference's rule). Radix select on the
//   order-preserving u32 image of the f32 scores: up to 4 passes of 8 bits (256-bin shared histogram with
//   warp-aggregated atomics; the bin holding the k-th largest found by a parallel suffix scan), stopping
//   early once the chosen bin is taken whole; then one ordered pass where each thread owns a contiguous
//   segment (two block scans: ties before the threshold, then output positions). Deterministic. The keys
//   are staged once in dynamic shared memory (one padding word per 32 keys, see topk_slot) when cap <=
//   TOPK_STAGED_MAX (attn_params.rs: within sm_120's 99 KB), else every pass reads the scores again (L2).
//   Launch: grid rows, block 1024; k <= 1024.
// Variants (H200, B1, eager with ~5 us launch gaps): v1 CUDA-core scoring (lane = head, f32 FMA) 15 us at
//   pos 4095, 41 us at 65534; v1 top-k (serial 256-bin scans in one thread, two 3-barrier scans per 1024
//   scores) 28 / 52 us. v2 (this): scoring 8.4 / 9.0 us; top-k 8.6 / 39 us with the keys read from L2 every
//   pass, 34 us staged in shared memory. Next for 64K: the 4 histogram passes over 16K keys in one block
//   (match_any + shared atomics per key) are what is left; compact the candidates after each pass, or
//   split the row over several blocks.
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
    pdl_trigger();
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

struct AttnIndexTopk {
    const float* scores;
    const int* slots;
    const int* positions;
    int* sel;  // [rows, k]
    int cap, ratio, k;
    int staged;  // 1: the launcher gave cap u32 of dynamic shared memory for the keys
};

__device__ __forceinline__ u32 attn_order_key(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix over the block (thread order) of v >= 0; returns it and sets *total. `sh` >= 33 ints.
__device__ __forceinline__ int attn_block_scan(int v, int* sh, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();  // sh may still be read by a previous scan
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nw ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < nw) sh[lane] = w;  // inclusive warp totals
    }
    __syncthreads();
    *total = sh[nw - 1];
    return (warp > 0 ? sh[warp - 1] : 0) + x - v;
}

// Shared-memory slot of staged key i: one padding word per 32 keys, so that the ordered pass, where thread t
// reads its contiguous segment t * seg + j, hits 32 distinct banks (at 64K context seg = 16 made that a
// 16-way bank conflict on every read of both segment loops).
__device__ __forceinline__ int topk_slot(int i) { return i + (i >> 5); }

extern "C" __global__ void __launch_bounds__(1024) attn_index_topk(AttnIndexTopk p) {
    extern __shared__ u32 keys_s[];  // order keys at topk_slot(i) when p.staged
    __shared__ int hist[256];
    __shared__ int sh[33];
    __shared__ u32 chosen[3];
    pdl_trigger();
    pdl_wait();
    const int row = blockIdx.x, lane = threadIdx.x & 31;
    int n = (p.positions[row] + 1) / p.ratio;
    n = n < p.cap ? n : p.cap;
    int* sel = p.sel + (u64)row * p.k;
    if (n <= p.k) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) sel[i] = i;
        return;
    }
    const float* s = p.scores + (u64)p.slots[row] * p.cap;
    // Every pass below reads all n keys: stage them once (coalesced, independent loads) when they fit.
    const bool staged = p.staged != 0;
    if (staged) {
#pragma unroll 4
        for (int i = threadIdx.x; i < n; i += blockDim.x) keys_s[topk_slot(i)] = attn_order_key(__ldcg(s + i));
        __syncthreads();
    }
    auto key = [&](int i) -> u32 { return staged ? keys_s[topk_slot(i)] : attn_order_key(__ldcg(s + i)); };
    u32 prefix = 0, mask = 0;
    int remaining = p.k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int c = 0; c < n; c += blockDim.x) {
            const int i = c + threadIdx.x;
            const u32 u = i < n ? key(i) : 0u;
            const bool in = i < n && (u & mask) == prefix;
            const int bin = in ? (int)((u >> shift) & 255u) : -1 - lane;  // distinct dummies never match
            const u32 peers = __match_any_sync(0xffffffffu, bin);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
        }
        __syncthreads();
        // Suffix counts: thread d < 256 (warps 0-7) finds the bin where the count from the top reaches
        // `remaining`; that bin is unique.
        if (threadIdx.x < 256) {
            const int d = 255 - threadIdx.x;  // thread order = descending bins
            const int h = hist[d];
            int x = h;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += y;
            }
            if (lane == 31) sh[threadIdx.x >> 5] = x;
            asm volatile("bar.sync 1, 256;" ::: "memory");
            int above = 0;
            for (int w = 0; w < (int)(threadIdx.x >> 5); ++w) above += sh[w];
            const int incl = above + x;  // count of bins >= d
            if (incl >= remaining && incl - h < remaining) {
                chosen[0] = (u32)d;
                chosen[1] = (u32)(remaining - (incl - h));
                chosen[2] = (u32)h;
            }
        }
        __syncthreads();
        prefix |= chosen[0] << shift;
        mask |= 255u << shift;
        const bool whole = (int)chosen[1] == (int)chosen[2];  // every score in the bin is taken
        remaining = (int)chosen[1];
        __syncthreads();
        if (whole) break;
    }
    // prefix (on the bits of mask) is the k-th largest key; take everything above it and the first
    // `remaining` equal to it. Thread i owns scores [i * seg, (i + 1) * seg).
    const int seg = (n + blockDim.x - 1) / blockDim.x;
    const int i0 = min((int)threadIdx.x * seg, n), i1 = min(i0 + seg, n);
    int gt = 0, eq = 0;
    for (int i = i0; i < i1; ++i) {
        const u32 u = key(i) & mask;
        gt += u > prefix ? 1 : 0;
        eq += u == prefix ? 1 : 0;
    }
    int eq_total, take_total;
    const int eq_before = attn_block_scan(eq, sh, &eq_total);
    const int eq_take = min(max(remaining - eq_before, 0), eq);
    int at = attn_block_scan(gt + eq_take, sh, &take_total);
    int eq_seen = 0;
    for (int i = i0; i < i1; ++i) {
        const u32 u = key(i) & mask;
        const bool take = u > prefix || (u == prefix && eq_seen++ < eq_take);
        if (take) sel[at++] = i;
    }
}
