// State updates of the batched prefill: both KV compressors over many tokens, the window ring, and the
// grouping of routed-expert slots into row tiles. After a call the per-slot state (ring rows, compressor rows,
// cache entries) is what the same tokens fed one per decode step would leave (spec 2.5, 3): decode continues
// from it unchanged.
//
// pf_compress_pool: one block per job (slot, w, row0, pos0): pools entry w, which a token of this call
//   completes. Its slots in decode order (overlap: previous window j = 0..m-1 with channels [0, dc), then the
//   current window with channels [dc, 2dc); else the window j = 0..m-1) come from this call's projections when
//   their position is >= pos0 (kappa = proj[kv_off + ch], gamma = proj[gate_off + ch] + ape[j, ch]), else from
//   the state rows where decode keeps them: current window -> row m + j with overlap, row j without; previous
//   window -> row j once that window completed before the call (decode copied it there), else still row m + j. Entry 0 has no previous window (weight 0, as the reset state's gamma = -inf).
//   Then exactly the decode kernel's arithmetic: per-channel softmax pooling (same order), RMSNorm, RoPE at
//   w*m, quantisation, bf16 store at cache[slot, w] (w < cap). Launch: grid jobs, block 256.
// pf_compress_state: afterwards, per segment (slot, row0, pos0, len) and (state row j < m, channel c < width):
//   the current row j takes the call's last token at a position = j (mod m), if any; with overlap, when the
//   call completed windows, the previous rows take the last completed window (its early tokens from the old
//   current rows). One thread owns (j, c) of both rows: it reads the old current value before writing.
//   Launch: grid (segments, ceil(m*width / 256)), block 256.
// pf_ring_write: the last min(len, window) rows of each segment into ring[slot, pos % window] (after the
//   attention read the old ring). Launch: grid rows, block 64.
// pf_moe_group: slot ids (row*topk + k) sorted by expert into `order`, and row tiles of at most `bm` rows per
//   expert into tiles = [count, (expert, begin, rows) ...] for pf_gemm_fp4_expert. The order inside an expert
//   is not deterministic, which changes no value: each row's products and sums are its own. Slots with a
//   negative id (another rank's expert, see moe_localize) are left out. One block of 1024.
#include "common.cuh"

struct PfCompress {
    const float* proj;
    const float* ape;
    const float* norm_w;
    const float* freqs;
    const int* jobs;  // pool: [jobs][4] = slot, w, row0, pos0; state: [segments][4] = slot, row0, pos0, len
    float* state_kv;
    float* state_sc;
    u16* cache;
    int proj_stride, kv_off, gate_off, dc, ratio, overlap, rdim, quant, cap;
    float eps;
};

// (kappa, gamma) of decode-order state row sr, channel c, for pooling entry w.
__device__ __forceinline__ float2 pf_comp_src(const PfCompress& p, const float* skv, const float* ssc, int w,
                                              int r0, int p0, int sr, int c) {
    const int m = p.ratio, width = (p.overlap ? 2 : 1) * p.dc;
    const bool prev = p.overlap && sr < m;
    const int j = prev ? sr : (p.overlap ? sr - m : sr);
    const int ch = (p.overlap && !prev) ? c + p.dc : c;
    if (prev && w == 0) return make_float2(0.f, -INFINITY);
    const int q = (prev ? w - 1 : w) * m + j;
    if (q >= p0) {
        const float* pr = p.proj + (u64)(r0 + q - p0) * p.proj_stride;
        return make_float2(pr[p.kv_off + ch], pr[p.gate_off + ch] + p.ape[(u64)j * width + ch]);
    }
    int srow = p.overlap ? m + j : j;
    if (prev && w * m - 1 < p0) srow = j;
    return make_float2(skv[(u64)srow * width + ch], ssc[(u64)srow * width + ch]);
}

extern "C" __global__ void __launch_bounds__(256) pf_compress_pool(PfCompress p) {
    pdl_wait();  // before any read: the previous kernel may still be running (PDL)
    __shared__ float v[512];
    __shared__ float tmp[512];
    __shared__ float red[33];
    const int* jb = p.jobs + 4 * blockIdx.x;
    const int slot = jb[0], w = jb[1], r0 = jb[2], p0 = jb[3];
    const int m = p.ratio, ovl = p.overlap ? 2 : 1, width = ovl * p.dc, srows = ovl * m;
    const float* skv = p.state_kv + (u64)slot * srows * width;
    const float* ssc = p.state_sc + (u64)slot * srows * width;
    for (int c = threadIdx.x; c < p.dc; c += blockDim.x) {
        float mx = -INFINITY;
        for (int sr = 0; sr < srows; ++sr) mx = fmaxf(mx, pf_comp_src(p, skv, ssc, w, r0, p0, sr, c).y);
        float num = 0.f, den = 0.f;
        for (int sr = 0; sr < srows; ++sr) {
            const float2 kg = pf_comp_src(p, skv, ssc, w, r0, p0, sr, c);
            const float e = expf(kg.y - mx);
            den += e;
            num += e * kg.x;
        }
        v[c] = num / den;
    }
    __syncthreads();
    attn_rms_smem(v, p.dc, p.norm_w, p.eps, red);
    attn_rope_smem(v, p.dc, p.rdim, p.freqs, (long long)w * m, 0);
    __syncthreads();
    attn_quant_vec(v, tmp, p.dc, p.rdim, p.quant);
    if (w < p.cap) {
        u16* dst = p.cache + ((u64)slot * p.cap + w) * p.dc;
        for (int c = threadIdx.x; c < p.dc; c += blockDim.x) dst[c] = f32_to_bf16(v[c]);
    }
}

extern "C" __global__ void __launch_bounds__(256) pf_compress_state(PfCompress p) {
    pdl_wait();  // before any read: the previous kernel may still be running (PDL)
    const int* sg = p.jobs + 4 * blockIdx.x;
    const int slot = sg[0], r0 = sg[1], p0 = sg[2], len = sg[3];
    const int m = p.ratio, ovl = p.overlap ? 2 : 1, width = ovl * p.dc, srows = ovl * m;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= m * width || len <= 0) return;
    const int j = i / width, c = i - j * width;
    float* skv = p.state_kv + (u64)slot * srows * width;
    float* ssc = p.state_sc + (u64)slot * srows * width;
    const int pend = p0 + len, last = pend - 1;
    const int q_new = last - (((last - j) % m) + m) % m;  // last position = j (mod m) in the call
    const int cur = (p.overlap ? m : 0) + j;
    const float old_k = skv[(u64)cur * width + c], old_g = ssc[(u64)cur * width + c];
    auto proj = [&](int q) {
        const float* pr = p.proj + (u64)(r0 + q - p0) * p.proj_stride;
        return make_float2(pr[p.kv_off + c], pr[p.gate_off + c] + p.ape[(u64)j * width + c]);
    };
    if (p.overlap) {
        const int w_lo = p0 / m, w_hi = pend / m;
        if (w_hi > w_lo) {
            const int q = (w_hi - 1) * m + j;
            const float2 kg = q >= p0 ? proj(q) : make_float2(old_k, old_g);
            skv[(u64)j * width + c] = kg.x;
            ssc[(u64)j * width + c] = kg.y;
        }
    }
    if (q_new >= p0) {
        const float2 kg = proj(q_new);
        skv[(u64)cur * width + c] = kg.x;
        ssc[(u64)cur * width + c] = kg.y;
    }
}

struct PfRing {
    const u16* kv;  // [rows, dim]
    u16* ring;      // [slots, window, dim]
    const int* slots;
    const int* positions;
    const int* pos0;
    const int* seglen;
    int dim, window;
};

extern "C" __global__ void __launch_bounds__(64) pf_ring_write(PfRing p) {
    pdl_wait();  // before any read: the previous kernel may still be running (PDL)
    const int r = blockIdx.x, pos = p.positions[r];
    if (pos < p.pos0[r] + p.seglen[r] - p.window) return;
    const uint4* src = (const uint4*)(p.kv + (u64)r * p.dim);
    uint4* dst = (uint4*)(p.ring + ((u64)p.slots[r] * p.window + pos % p.window) * p.dim);
    for (int i = threadIdx.x; i < p.dim / 8; i += blockDim.x) dst[i] = src[i];
}

struct PfGroup {
    const int* ids;  // [slots] expert of each slot
    int* order;      // [slots]
    int* tiles;      // [1 + 3 * max_tiles]
    int slots, experts, bm, pad;
};

extern "C" __global__ void __launch_bounds__(1024) pf_moe_group(PfGroup p) {
    pdl_wait();  // before any read: the previous kernel may still be running (PDL)
    __shared__ int cnt[1024], cur[1024], off[1024], toff[1025];
    const int tid = threadIdx.x, E = p.experts;
    for (int e = tid; e < E; e += blockDim.x) cnt[e] = cur[e] = 0;
    __syncthreads();
    for (int i = tid; i < p.slots; i += blockDim.x) {
        const int e = p.ids[i];
        if (e >= 0) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int o = 0, t = 0;
        for (int e = 0; e < E; ++e) {
            off[e] = o;
            toff[e] = t;
            o += cnt[e];
            t += (cnt[e] + p.bm - 1) / p.bm;
        }
        toff[E] = t;
        p.tiles[0] = t;
    }
    __syncthreads();
    for (int i = tid; i < p.slots; i += blockDim.x) {
        const int e = p.ids[i];
        if (e >= 0) p.order[off[e] + atomicAdd(&cur[e], 1)] = i;
    }
    for (int e = tid; e < E; e += blockDim.x) {
        for (int t = 0; t < toff[e + 1] - toff[e]; ++t) {
            int* d = p.tiles + 1 + 3 * (toff[e] + t);
            d[0] = e;
            d[1] = off[e] + t * p.bm;
            d[2] = min(p.bm, cnt[e] - t * p.bm);
        }
    }
}
