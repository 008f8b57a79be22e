// Lightning indexer, decode (spec 2.6): scores of the LIVE compressed entries and their top-k.
//
// attn_index_score: score[slot, w] = scale * sum_j wts[row, j] * ReLU(<q[row, j], K[slot, w]>) for
//   w < n = (pos + 1) / ratio (only live entries: the cost grows with the context, not the capacity). Rows with
//   n <= k skip scoring (every entry is selected). q bf16 [rows, heads, dim]; wts f32 rows of stride
//   wts_stride; keys bf16 [slots, cap, dim]; scores f32 [slots, cap].
//   Launch: grid (splits, rows), block 256: q in shared memory (f32, rows padded to dim + 1 so the lanes,
//   one head each, read different banks); each warp takes entries w = (blockIdx.x * 8 + warp) + k * 8 *
//   gridDim.x, stages the key in shared memory and computes <q_j, K_w> with lane = head. heads <= 64,
//   dim <= 128.
// attn_index_topk: the indices of the k largest scores of each row (all n when n <= k), ascending index
//   order, ties at the threshold broken towards lower indices (the CPU reference's rule). Radix select on the
//   order-preserving u32 image of the f32 scores (4 passes of 8 bits, 256-bin shared histogram), then one
//   ordered pass with block-wide prefix counts. Deterministic. Launch: grid rows, block 1024; k <= 1024.
// Variants tried: none yet. Next: tensor-core scoring (mma.sync, q as A, 8 keys as B) for long contexts.
#include "common.cuh"

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

extern "C" __global__ void __launch_bounds__(256) attn_index_score(AttnIndexScore p) {
    pdl_trigger();
    pdl_wait();
    __shared__ float qs[64 * 129];
    __shared__ float ks[8][128];
    __shared__ float ws[64];
    const int row = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = p.slots[row];
    int n = (p.positions[row] + 1) / p.ratio;
    n = n < p.cap ? n : p.cap;
    if (n <= p.k || blockIdx.x * 8 >= n) return;
    const int ld = p.dim + 1;
    for (int i = threadIdx.x; i < p.heads * p.dim; i += blockDim.x) {
        const int h = i / p.dim, c = i - h * p.dim;
        qs[h * ld + c] = bf16_to_f32(p.q[((u64)row * p.heads + h) * p.dim + c]);
    }
    for (int h = threadIdx.x; h < p.heads; h += blockDim.x) ws[h] = p.wts[(u64)row * p.wts_stride + h] * p.scale;
    __syncthreads();
    const u16* kb = p.keys + (u64)slot * p.cap * p.dim;
    float* out = p.scores + (u64)slot * p.cap;
    for (int w = blockIdx.x * 8 + warp; w < n; w += gridDim.x * 8) {
        for (int c = lane; c < p.dim; c += 32) ks[warp][c] = bf16_to_f32(kb[(u64)w * p.dim + c]);
        __syncwarp();
        float s = 0.f;
        for (int h = lane; h < p.heads; h += 32) {
            float d = 0.f;
            for (int c = 0; c < p.dim; ++c) d += qs[h * ld + c] * ks[warp][c];
            s += ws[h] * fmaxf(d, 0.f);
        }
        s = warp_sum(s);
        if (lane == 0) out[w] = s;
        __syncwarp();
    }
}

struct AttnIndexTopk {
    const float* scores;
    const int* slots;
    const int* positions;
    int* sel;  // [rows, k]
    int cap, ratio, k, pad;
};

__device__ __forceinline__ u32 attn_order_key(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix of `flag` over the block in thread order; returns it and sets *total. `sh` >= 33 ints.
__device__ __forceinline__ int attn_block_scan(bool flag, int* sh, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const u32 bal = __ballot_sync(0xffffffffu, flag);
    const int in_warp = __popc(bal & ((1u << lane) - 1u));
    __syncthreads();
    if (lane == 0) sh[warp] = __popc(bal);
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int i = 0; i < nw; ++i) {
            const int t = sh[i];
            sh[i] = acc;
            acc += t;
        }
        sh[32] = acc;
    }
    __syncthreads();
    *total = sh[32];
    return sh[warp] + in_warp;
}

extern "C" __global__ void __launch_bounds__(1024) attn_index_topk(AttnIndexTopk p) {
    pdl_trigger();
    pdl_wait();
    __shared__ int hist[256];
    __shared__ int sh[33];
    __shared__ u32 chosen[2];
    const int row = blockIdx.x;
    int n = (p.positions[row] + 1) / p.ratio;
    n = n < p.cap ? n : p.cap;
    int* sel = p.sel + (u64)row * p.k;
    if (n <= p.k) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) sel[i] = i;
        return;
    }
    const float* s = p.scores + (u64)p.slots[row] * p.cap;
    u32 prefix = 0, mask = 0;
    int remaining = p.k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const u32 u = attn_order_key(s[i]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int cum = 0;
            for (int d = 255; d >= 0; --d) {
                if (cum + hist[d] >= remaining) {
                    chosen[0] = (u32)d;
                    chosen[1] = (u32)(remaining - cum);
                    break;
                }
                cum += hist[d];
            }
        }
        __syncthreads();
        prefix |= chosen[0] << shift;
        mask |= 255u << shift;
        remaining = (int)chosen[1];
        __syncthreads();
    }
    // prefix is the k-th largest key; take everything above it and the first `remaining` equal to it.
    int base = 0, eq_base = 0;
    for (int c = 0; c < n; c += blockDim.x) {
        const int i = c + threadIdx.x;
        const u32 u = i < n ? attn_order_key(s[i]) : 0u;
        const bool gt = i < n && u > prefix, eq = i < n && u == prefix;
        int eq_total, take_total;
        const int eq_rank = attn_block_scan(eq, sh, &eq_total);
        const bool take = gt || (eq && eq_base + eq_rank < remaining);
        const int at = attn_block_scan(take, sh, &take_total);
        if (take) sel[base + at] = i;
        base += take_total;
        eq_base += eq_total;
    }
}
