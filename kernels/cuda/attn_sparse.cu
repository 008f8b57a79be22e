// Sparse attention with sink, decode (spec 2.4), split over the keys so that batch 1 fills the GPU.
//
// Keys of the query at position pos (K = V, one shared head): the window ring rows 0..nwin-1, nwin =
//   min(pos + 1, window) (the ring holds exactly positions pos-window+1..pos once full, and 0..pos before),
//   then the compressed entries: HCA (sel == null): w = 0..n-1, n = (pos + 1) / ratio; CSA: sel[row, 0..c),
//   c = min(n, k); SWA (ratio 0): none.
// attn_sparse_partial: block (split, head group of 16, row) takes keys [split*chunk, (split+1)*chunk), chunk =
//   ceil(nkeys / splits), in tiles of 32 staged in shared memory as bf16 pairs (row stride dim/2 + 1 words:
//   conflict-free when lane = key). Warp w owns heads 2w, 2w+1: scores with lane = key (f32 accumulation of
//   bf16 products, times scale), online softmax per head with warp shuffles, then P.V with lane = channel pair
//   (f32, unnormalised). Writes per (row, split, head) the max m, the sum l and the unnormalised output.
//   Launch: grid (splits, ceil(heads/16), rows), block 256, dynamic shared (16*dim/2 + 32*(dim/2+1)) words
//   (49.3 KB at dim 512: the launcher raises the opt-in limit). dim % 64 == 0, dim <= 512.
// attn_sparse_merge: per (head, row): M = max(sink, m_s), den = exp(sink - M) + sum_s l_s exp(m_s - M),
//   o = sum_s o_s exp(m_s - M) / den; inverse RoPE at pos on the last rdim channels; bf16 store in group-major
//   layout out[g, row, (h mod hpg)*dim + c] (g = h / hpg, hpg = heads / groups), ready for the per-group wo_a.
//   Launch: grid (heads, rows), block 128.
// Variants tried: chunk = ceil(nkeys / splits) (first version; at batch 1 SWA that is 2 keys per split,
//   8 MB of partial outputs); now chunk >= 32 keys and empty splits store only (m, l). Not timed apart
//   (same run: attention 31 us + merge 17 us at B1 SWA, eager; the Q.K loop costs a full tile however few keys).
// Next: mma.sync for Q.K^T and P.V (64 heads share every key) at large batch.
#include "common.cuh"

struct AttnSparse {
    const u16* q;      // [rows, heads, dim]
    const u16* ring;   // [slots, window, dim]
    const u16* comp;   // [slots, cap, dim] or null
    const int* sel;    // [rows, k] or null (HCA: all live entries)
    const int* slots;
    const int* positions;
    float* part_o;     // [rows, splits, heads, dim]
    float* part_ml;    // [rows, splits, heads, 2]
    int heads, dim, window, ratio, cap, k;
    float scale;
    int pad;
};

__device__ __forceinline__ const u16* attn_key_ptr(const AttnSparse& p, int row, int slot, int nwin, int i) {
    if (i < nwin) return p.ring + ((u64)slot * p.window + i) * p.dim;
    const int j = i - nwin;
    const int e = p.sel ? p.sel[(u64)row * p.k + j] : j;
    return p.comp + ((u64)slot * p.cap + e) * p.dim;
}

extern "C" __global__ void __launch_bounds__(256) attn_sparse_partial(AttnSparse p) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ u32 smem[];
    const int split = blockIdx.x, hg = blockIdx.y, row = blockIdx.z, splits = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int half = p.dim / 2, ld = half + 1, words = p.dim / 64;  // words per lane in P.V
    u32* qs = smem;             // [16][half]
    u32* ks = smem + 16 * half;  // [32][ld]
    const int pos = p.positions[row], slot = p.slots[row];
    const int nwin = min(pos + 1, p.window);
    int ncomp = 0;
    if (p.ratio > 0) {
        ncomp = min((pos + 1) / p.ratio, p.cap);
        if (p.sel) ncomp = min(ncomp, p.k);
    }
    const int nkeys = nwin + ncomp;
    // At least one full 32-key tile per split: a tile costs the same Q.K time however few keys it holds, and
    // near-empty splits only add partial-output traffic (64 splits x 64 heads x 2 KB at batch 1).
    const int chunk = max((nkeys + splits - 1) / splits, 32);
    const int k0 = min(split * chunk, nkeys), k1 = min(k0 + chunk, nkeys);
    for (int i = threadIdx.x; i < 16 * half; i += blockDim.x) {
        const int h = hg * 16 + i / half;
        qs[i] = h < p.heads ? ((const u32*)(p.q + ((u64)row * p.heads + h) * p.dim))[i % half] : 0u;
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float acc[2][8][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[h][i][0] = acc[h][i][1] = 0.f;

    for (int t0 = k0; t0 < k1; t0 += 32) {
        const int nt = min(32, k1 - t0);
        __syncthreads();
        const int per_key = p.dim / 8;  // 16-byte chunks per key
        for (int i = threadIdx.x; i < nt * per_key; i += blockDim.x) {
            const int j = i / per_key, c = i - j * per_key;
            const uint4 v = *((const uint4*)attn_key_ptr(p, row, slot, nwin, t0 + j) + c);
            u32* d = ks + j * ld + c * 4;
            d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
        }
        __syncthreads();
        float s[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32* qh = qs + (2 * warp + h) * half;
            const u32* kj = ks + lane * ld;
            float d = 0.f;
            if (lane < nt)
                for (int w = 0; w < half; ++w) {
                    const u32 a = qh[w], b = kj[w];
                    d += bf16_to_f32((u16)(a & 0xffffu)) * bf16_to_f32((u16)(b & 0xffffu));
                    d += bf16_to_f32((u16)(a >> 16)) * bf16_to_f32((u16)(b >> 16));
                }
            s[h] = lane < nt ? d * p.scale : -INFINITY;
        }
        float pr[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float mn = fmaxf(m[h], warp_max(s[h]));
            const float corr = expf(m[h] - mn);
            pr[h] = expf(s[h] - mn);
            l[h] = l[h] * corr + warp_sum(pr[h]);
            m[h] = mn;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                acc[h][i][0] *= corr;
                acc[h][i][1] *= corr;
            }
        }
        for (int j = 0; j < nt; ++j) {
            const float p0 = __shfl_sync(0xffffffffu, pr[0], j), p1 = __shfl_sync(0xffffffffu, pr[1], j);
            const u32* kj = ks + j * ld;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                if (i >= words) break;
                const u32 b = kj[lane + 32 * i];
                const float x0 = bf16_to_f32((u16)(b & 0xffffu)), x1 = bf16_to_f32((u16)(b >> 16));
                acc[0][i][0] += p0 * x0;
                acc[0][i][1] += p0 * x1;
                acc[1][i][0] += p1 * x0;
                acc[1][i][1] += p1 * x1;
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int head = hg * 16 + 2 * warp + h;
        if (head >= p.heads) continue;
        const u64 base = ((u64)row * splits + split) * p.heads + head;
        if (lane == 0) {
            p.part_ml[base * 2] = m[h];
            p.part_ml[base * 2 + 1] = l[h];
        }
        if (k0 >= k1) continue;  // empty split: m = -inf, the merge gives it weight 0 and never reads o
        float* o = p.part_o + base * p.dim;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (i >= words) break;
            o[2 * (lane + 32 * i)] = acc[h][i][0];
            o[2 * (lane + 32 * i) + 1] = acc[h][i][1];
        }
    }
}

struct AttnMerge {
    const float* part_o;
    const float* part_ml;
    const float* sink;
    const float* freqs;
    const int* positions;
    u16* out;
    int splits, heads, dim, rdim, groups, rows;
};

extern "C" __global__ void __launch_bounds__(128) attn_sparse_merge(AttnMerge p) {
    pdl_trigger();
    pdl_wait();
    __shared__ float v[512];
    __shared__ float wgt[64];
    __shared__ float inv_den;
    const int h = blockIdx.x, row = blockIdx.y;
    const float* ml = p.part_ml + ((u64)row * p.splits * p.heads + h) * 2;
    const float sink = p.sink[h];
    float mx = sink;
    for (int s = 0; s < p.splits; ++s) mx = fmaxf(mx, ml[(u64)s * p.heads * 2]);
    if (threadIdx.x == 0) {
        float den = expf(sink - mx);
        for (int s = 0; s < p.splits; ++s) {
            const float ms = ml[(u64)s * p.heads * 2];
            const float e = ms == -INFINITY ? 0.f : expf(ms - mx);
            wgt[s] = e;
            den += ml[(u64)s * p.heads * 2 + 1] * e;
        }
        inv_den = 1.0f / den;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {
        float o = 0.f;
        for (int s = 0; s < p.splits; ++s) {
            if (wgt[s] != 0.f) o += wgt[s] * p.part_o[(((u64)row * p.splits + s) * p.heads + h) * p.dim + c];
        }
        v[c] = o * inv_den;
    }
    __syncthreads();
    attn_rope_smem(v, p.dim, p.rdim, p.freqs, p.positions[row], 1);
    __syncthreads();
    const int hpg = p.heads / p.groups, g = h / hpg;
    u16* dst = p.out + ((u64)g * p.rows + row) * ((u64)hpg * p.dim) + (u64)(h % hpg) * p.dim;
    for (int c = threadIdx.x; c < p.dim; c += blockDim.x) dst[c] = f32_to_bf16(v[c]);
}
