// Sparse attention with sink, decode (spec 2.4), split over the keys so that batch 1 fills the GPU.
//
// Keys of the query at position pos (K = V, one shared head): the window ring rows 0..nwin-1, nwin =
//   min(pos + 1, window) (the ring holds exactly positions pos-window+1..pos once full, and 0..pos before),
//   then the compressed entries: HCA (sel == null): w = 0..n-1, n = (pos + 1) / ratio; CSA: sel[row, 0..c),
//   c = min(n, k); SWA (ratio 0): none.
// attn_sparse_partial: block (split, head group of 16, row), 4 warps, takes keys [split*chunk, +chunk) (chunk =
//   ceil(nkeys / splits) rounded up to whole 32-key tiles) in tiles of 32 keys staged in shared memory. On
//   tensor cores (mma.sync m16n8k16 bf16, sm_80+, portable to sm_120): the 16 heads are the m16 rows.
//   Key rows are staged by bulk copies (one per key, sm_90+). Per tile: S = Q K^T with warp w owning keys
//   8w..8w+7 (f32 accumulation of exact bf16 products, like the CPU's f32 dot products); an online softmax
//   per head (warp w: heads 4w..4w+3, lane = key, f32 expf);
//   O += P V with warp w owning dims [w dim/4, (w+1) dim/4) and V fragments read by ldmatrix.trans. P is
//   split into bf16 hi + lo parts (two mma each) so P V keeps ~16 mantissa bits of P instead of bf16's 8.
//   Writes per (row, split, head) the max m, the sum l and the unnormalised output (empty split: m = -inf,
//   no output). Shared rows are dim/2 + 4 words (bank offset 4 per row: the fragment loads are
//   conflict-free, ldmatrix rows 16-byte aligned).
//   Launch: grid (splits, ceil(heads/16), rows), block 128, dynamic shared sparse_smem_bytes(dim) (52.4 KB
//   at dim 512: the launcher raises the opt-in limit). dim % 64 == 0, dim <= 512.
// attn_sparse_merge: per (head, row): M = max(sink, m_s), den = exp(sink - M) + sum_s l_s exp(m_s - M),
//   o = sum_s o_s exp(m_s - M) / den; inverse RoPE at pos on the last rdim channels; bf16 store in group-major
//   layout out[g, row, (h mod hpg)*dim + c] (g = h / hpg, hpg = heads / groups), ready for the per-group wo_a.
//   Launch: grid (heads, rows), block 128: warp 0 weighs the splits (lane = split), every thread merges
//   4 channels with 16-byte loads, skipping empty splits, rotates its rope pairs and stores its 4 channels.
//   dim % 4 == 0, dim <= 512, rdim even.
// Variants (H200, engine/tests/gpu_attention_bench.rs: eager step with events, B1 CSA pos 4095, each incl.
//   ~5 us launch gap): v1 CUDA-core partial (lane = key for Q.K, lane = channel pair for P.V, f32) 33 us +
//   merge with a serial weight loop in one thread 31 us. v2: tensor cores, 4-warp blocks, parallel
//   merge: 16.5 + 10.8 us (B64 CSA: 145 + 13 us). v3 (this, same bits): Q and the key tiles staged by cp.async
//   with every copy issued before the first wait (v2 loaded and stored one 16-byte chunk per loop trip: a chain
//   of round trips per tile), the 4 heads' softmax reductions of a warp interleaved, the merge's split loads 8
//   at a time up to the last non-empty split (v2: one load in flight per thread). v4 (same operations, sixteenth
//   session; ncu durations in one step of the full-size model, batch 64 / batch 1): Q.K fragments by ldmatrix,
//   the next tile's key lookups (the CSA selection) while the current tile's copies are in flight, the copy
//   loop without an integer division per copy (ncu at batch 64: the largest instruction share of the partial
//   kernel): partial 52.9 -> 47.1 us / 10.0 -> 9.5 us. v5 (eighteenth session, same operations): each key row
//   one bulk copy (sm_90+ cp.async.bulk, completing on an mbarrier) issued by a lane of warp 0 instead of 64
//   16-byte cp.async spread over the block. Merge: the first split loads issued with the weights'
//   loads, the rope angles taken by idle warps before the weights' barrier and the rotation in registers (v3:
//   the row staged in shared memory, a rope pass by one warp between two more barriers): 18.7 -> 14.5 us /
//   4.8 -> 4.4 us.
#include "common.cuh"

#define SP_HEADS 16
#define SP_TILE 32
#define SP_LDS 36  // row stride (floats) of the score / probability tile
#define SP_MERGE_U 8   // split loads in flight per merge thread
#define SP_MERGE_PF 2  // of which the first round loads before the weights (more: registers cost blocks per SM)
#define SP_MERGE_ROPE 256  // rope pairs the merge keeps angles for (rdim <= dim <= 512)

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

// Two f32 -> packed bf16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

// f32 minus its bf16 rounding (the "lo" part of a hi/lo split; exact in f32).
__device__ __forceinline__ float bf16_rest(float v) { return v - bf16_to_f32(f32_to_bf16(v)); }

// The key rows of tile [t0, t0 + nt) into kp (threads 0-31, the CSA selection read here; the ring's base past nt).
// The kernel looks up tile i + 1 while tile i's copies are in flight (kp double-buffered), so the selection's
// round trip is off the per-tile chain (v3 looked each tile up after the previous tile's P V, then a barrier).
__device__ __forceinline__ void sp_key_rows(const AttnSparse& p, int row, int slot, int nwin, int t0, int nt,
                                            const u16** kp) {
    if (threadIdx.x < SP_TILE)
        kp[threadIdx.x] = (int)threadIdx.x < nt ? attn_key_ptr(p, row, slot, nwin, t0 + threadIdx.x) : p.ring;
}

// Stages the tile's keys (rows kp; rows past nt zeroed: their probabilities are 0, and 0 x a stale NaN would not
// be) by one bulk copy per key (sm_90+: lane j of warp 0 copies key j's dim x 2 bytes), completing on mbarrier
// `bar`. v4 issued dim / 8 16-byte cp.async per key spread over the block (16 per thread and tile at dim 512, with
// their address arithmetic: the largest instruction share of the kernel at batch 64, ncu sixteenth session).
// Caller: a barrier before (ks free, kp written); mbar_wait on the tile's phase and a barrier after.
__device__ __forceinline__ void sp_issue_tile(const AttnSparse& p, u32 ks_addr, u32* ks, int ld, int nt,
                                              const u16* const* kp, u32 bar) {
    const int lane = threadIdx.x & 31;
    const u32 bytes = (u32)p.dim * 2u;
    if (threadIdx.x < 32) {
        if (lane == 0) {
            fence_proxy_async();  // the previous tile's reads of ks (generic proxy) before the copies' writes
            mbar_expect_tx(bar, bytes * (u32)nt);
        }
        __syncwarp();
        if (lane < nt) bulk_g2s(ks_addr + (u32)(lane * ld) * 4u, kp[lane], bytes, bar);
    }
    if (nt < SP_TILE) {
        const int words = p.dim >> 1;
        for (int i = threadIdx.x; i < (SP_TILE - nt) * words; i += blockDim.x) {
            const int r = i / words;
            ks[(nt + r) * ld + (i - r * words)] = 0u;
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) attn_sparse_partial(AttnSparse p) {
    extern __shared__ __align__(16) u32 smem[];
    pdl_wait();
    const int split = blockIdx.x, hg = blockIdx.y, row = blockIdx.z, splits = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ld = p.dim / 2 + 4;  // words per staged row
    u32* qs = smem;                                 // [16][ld]
    u32* ks = qs + SP_HEADS * ld;                   // [32][ld]
    float* sp = (float*)(ks + SP_TILE * ld);        // [16][SP_LDS] scores, then probabilities
    float* m_s = sp + SP_HEADS * SP_LDS;            // [16] running max
    float* l_s = m_s + SP_HEADS;                    // [16] running sum
    float* c_s = l_s + SP_HEADS;                    // [16] this tile's rescale of O
    __shared__ const u16* kp[2][SP_TILE];           // key rows of the current and the next tile
    __shared__ __align__(8) u64 kbar;               // the key tile's bulk copies complete here
    const int h0 = hg * SP_HEADS;
    const int per_head = p.dim >> 3;
    const u32 qs_addr = smem_u32(qs), ks_addr = smem_u32(ks);
    const int pos = p.positions[row], slot = p.slots[row];
    const int nwin = min(pos + 1, p.window);
    int ncomp = 0;
    if (p.ratio > 0) {
        ncomp = min((pos + 1) / p.ratio, p.cap);
        if (p.sel) ncomp = min(ncomp, p.k);
    }
    const int nkeys = nwin + ncomp;
    // Whole 32-key tiles per split: a tile costs the same however few keys it holds.
    const int chunk = ((nkeys + splits - 1) / splits + SP_TILE - 1) / SP_TILE * SP_TILE;
    const int k0 = min(split * chunk, nkeys), k1 = min(k0 + chunk, nkeys);
    if (k0 < k1) {  // Q: in flight during the first tile's key lookups, waited for with its keys
        for (int i = threadIdx.x; i < SP_HEADS * per_head; i += blockDim.x) {
            const int h = i / per_head, c = i - h * per_head;
            const bool live = h0 + h < p.heads;
            const u16* src = p.q + ((u64)row * p.heads + (live ? h0 + h : 0)) * p.dim + c * 8;
            cp_async16(qs_addr + (u32)(h * ld + c * 4) * 4u, src, live ? 16u : 0u);
        }
        cp_async_commit();
    }
    if (threadIdx.x < SP_HEADS) {
        m_s[threadIdx.x] = -INFINITY;
        l_s[threadIdx.x] = 0.f;
    }
    const u32 bar = smem_u32(&kbar);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
    }
    const int dw = p.dim >> 2;       // dims of this warp in P.V
    const int ntd = dw >> 3;         // its n8 tiles (<= 16)
    float acc[16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    if (k0 < k1) sp_key_rows(p, row, slot, nwin, k0, min(SP_TILE, k1 - k0), kp[0]);
    int cur = 0;
    u32 phase = 0;  // of kbar: one per tile
    for (int t0 = k0; t0 < k1; t0 += SP_TILE, cur ^= 1, phase ^= 1) {
        const int nt = min(SP_TILE, k1 - t0);
        __syncthreads();  // the previous tile's keys and probabilities are consumed; kp[cur] (and kbar) written
        sp_issue_tile(p, ks_addr, ks, ld, nt, kp[cur], bar);
        if (t0 + SP_TILE < k1)  // the next tile's lookups, while this tile's copies are in flight
            sp_key_rows(p, row, slot, nwin, t0 + SP_TILE, min(SP_TILE, k1 - t0 - SP_TILE), kp[cur ^ 1]);
        cp_async_wait<0>();  // the first time, this thread's Q copies
        mbar_wait(bar, phase);  // the tile's keys
        __syncthreads();        // ... and the zeroed rows past nt
        // S = Q K^T for keys 8w..8w+7 of the tile.
        // Fragments by ldmatrix (the same words as one 32-bit load per register: 1.5 instructions per MMA
        // instead of 6). A: lane l gives head row l % 16 at k + 8 (l / 16); B, two k16 steps at once: lane l
        // gives key row 8w + l % 8 at k + 8 (l / 8).
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        const u32 qa = qs_addr + (u32)((lane & 15) * ld + (lane >> 4) * 4) * 4u;
        const u32 kb = ks_addr + (u32)((8 * warp + (lane & 7)) * ld + (lane >> 3) * 4) * 4u;
        for (int kk = 0; kk < p.dim / 16; kk += 2) {
            u32 a0[4], a1[4], b[4];
            ldsm_x4(qa + (u32)kk * 32u, a0[0], a0[1], a0[2], a0[3]);
            ldsm_x4(qa + (u32)kk * 32u + 32u, a1[0], a1[1], a1[2], a1[3]);
            ldsm_x4(kb + (u32)kk * 32u, b[0], b[1], b[2], b[3]);
            mma_bf16_16816(c, a0[0], a0[1], a0[2], a0[3], b[0], b[1]);
            mma_bf16_16816(c, a1[0], a1[1], a1[2], a1[3], b[2], b[3]);
        }
        {
            const int key = 8 * warp + 2 * t;
            float2 lo, hi;
            lo.x = key < nt ? c[0] * p.scale : -INFINITY;
            lo.y = key + 1 < nt ? c[1] * p.scale : -INFINITY;
            hi.x = key < nt ? c[2] * p.scale : -INFINITY;
            hi.y = key + 1 < nt ? c[3] * p.scale : -INFINITY;
            *(float2*)(sp + g * SP_LDS + key) = lo;
            *(float2*)(sp + (g + 8) * SP_LDS + key) = hi;
        }
        __syncthreads();
        // Online softmax: warp w updates heads 4w..4w+3 (lane = key), the 4 heads' reductions interleaved
        // (v2 ran them one after another; each head's operations and order are unchanged).
        {
            float s[4], mo[4], mx[4], e[4], sum[4];
#pragma unroll
            for (int hh = 0; hh < 4; ++hh) {
                s[hh] = sp[(4 * warp + hh) * SP_LDS + lane];  // -inf past nt
                mo[hh] = m_s[4 * warp + hh];
                mx[hh] = s[hh];
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int hh = 0; hh < 4; ++hh) mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], o));
#pragma unroll
            for (int hh = 0; hh < 4; ++hh) {
                mx[hh] = fmaxf(mo[hh], mx[hh]);  // finite: nt >= 1
                e[hh] = expf(s[hh] - mx[hh]);
                sum[hh] = e[hh];
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int hh = 0; hh < 4; ++hh) sum[hh] += __shfl_xor_sync(0xffffffffu, sum[hh], o);
#pragma unroll
            for (int hh = 0; hh < 4; ++hh) sp[(4 * warp + hh) * SP_LDS + lane] = e[hh];
            if (lane == 0) {
#pragma unroll
                for (int hh = 0; hh < 4; ++hh) {
                    const int h = 4 * warp + hh;
                    const float corr = expf(mo[hh] - mx[hh]);  // 0 on the first tile (mo = -inf)
                    l_s[h] = l_s[h] * corr + sum[hh];
                    m_s[h] = mx[hh];
                    c_s[h] = corr;
                }
            }
        }
        __syncthreads();
        // O = O * corr + P V on this warp's dims.
        const float cg = c_s[g], cg8 = c_s[g + 8];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            acc[j][0] *= cg;
            acc[j][1] *= cg;
            acc[j][2] *= cg8;
            acc[j][3] *= cg8;
        }
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            const float2 p0 = *(const float2*)(sp + g * SP_LDS + 16 * kk + 2 * t);
            const float2 p1 = *(const float2*)(sp + (g + 8) * SP_LDS + 16 * kk + 2 * t);
            const float2 p2 = *(const float2*)(sp + g * SP_LDS + 16 * kk + 8 + 2 * t);
            const float2 p3 = *(const float2*)(sp + (g + 8) * SP_LDS + 16 * kk + 8 + 2 * t);
            const u32 ah[4] = {pack_bf16x2(p0.x, p0.y), pack_bf16x2(p1.x, p1.y), pack_bf16x2(p2.x, p2.y),
                               pack_bf16x2(p3.x, p3.y)};
            const u32 al[4] = {pack_bf16x2(bf16_rest(p0.x), bf16_rest(p0.y)),
                               pack_bf16x2(bf16_rest(p1.x), bf16_rest(p1.y)),
                               pack_bf16x2(bf16_rest(p2.x), bf16_rest(p2.y)),
                               pack_bf16x2(bf16_rest(p3.x), bf16_rest(p3.y))};
            // ldmatrix rows: keys 16kk + (lane & 7) + 8 * bit 3 of lane, dims d0 + 8 * (lane >> 4).
            const int key = 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
            const u32 rowaddr = ks_addr + (u32)(key * ld) * 4u + (u32)((warp * dw + (lane >> 4) * 8) * 2);
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
                if (2 * jj >= ntd) break;
                u32 b0, b1, b2, b3;
                ldsm_x4_t(rowaddr + (u32)(jj * 32), b0, b1, b2, b3);
                mma_bf16_16816(acc[2 * jj], ah[0], ah[1], ah[2], ah[3], b0, b1);
                mma_bf16_16816(acc[2 * jj], al[0], al[1], al[2], al[3], b0, b1);
                mma_bf16_16816(acc[2 * jj + 1], ah[0], ah[1], ah[2], ah[3], b2, b3);
                mma_bf16_16816(acc[2 * jj + 1], al[0], al[1], al[2], al[3], b2, b3);
            }
        }
    }
    __syncthreads();
    const u64 base = ((u64)row * splits + split) * p.heads;
    if (threadIdx.x < SP_HEADS && h0 + (int)threadIdx.x < p.heads) {
        const int h = threadIdx.x;
        p.part_ml[(base + h0 + h) * 2] = m_s[h];
        p.part_ml[(base + h0 + h) * 2 + 1] = l_s[h];
    }
    if (k0 >= k1) return;  // empty split: m = -inf, the merge gives it weight 0 and never reads o
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        if (j >= ntd) break;
        const int d = warp * dw + 8 * j + 2 * t;
        if (h0 + g < p.heads) *(float2*)(p.part_o + (base + h0 + g) * p.dim + d) = make_float2(acc[j][0], acc[j][1]);
        if (h0 + g + 8 < p.heads)
            *(float2*)(p.part_o + (base + h0 + g + 8) * p.dim + d) = make_float2(acc[j][2], acc[j][3]);
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

// Splits s0 + u (from, u < U, s0 + u < n) of the 4 channels at c into x[u], all in flight at once (volatile loads:
// the compiler keeps them ahead of the adds).
template <int U>
__device__ __forceinline__ void sp_merge_load(const float* po, u64 sstride, int c, int s0, int n, float4 (&x)[U],
                                              int from) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (u >= from && s0 + u < n) {
            const uint4 r = ldg_keep(po + (u64)(s0 + u) * sstride + c);
            x[u] = make_float4(__uint_as_float(r.x), __uint_as_float(r.y), __uint_as_float(r.z),
                               __uint_as_float(r.w));
        }
    }
}

// attn_rope_smem's rotation of one pair with its operations pinned: the products and fused multiply-adds nvcc made
// of `a * cs - b * sn` and `a * sn + b * cs` there (sm_90a SASS of attn_sparse_merge v3), so the same bits.
__device__ __forceinline__ void sp_rope_pair(float& a, float& b, float cs, float sn) {
    const float na = __fmaf_rn(a, cs, -__fmul_rn(b, sn)), nb = __fmaf_rn(a, sn, __fmul_rn(b, cs));
    a = na;
    b = nb;
}

// One block per (head, row); thread t merges channels 4t..4t+3 (dim <= 512 = 4 x 128, checked by the launcher) and
// stores them itself: its rope pairs (inverse, at the row's position) are rotated in registers with angles taken
// before the weights' barrier. v3 staged the row in shared memory for a rope pass by one warp between two more
// barriers; the same operations, so the same bits.
extern "C" __global__ void __launch_bounds__(128) attn_sparse_merge(AttnMerge p) {
    __shared__ float wgt[64];
    __shared__ float rsn[SP_MERGE_ROPE], rcs[SP_MERGE_ROPE];  // sin(-theta), cos(theta) of the rope pairs
    __shared__ float inv_den;
    __shared__ int nsplit;  // 1 + the last split of nonzero weight
    pdl_wait();
    const int h = blockIdx.x, row = blockIdx.y, lane = threadIdx.x & 31;
    const float* ml = p.part_ml + ((u64)row * p.splits * p.heads + h) * 2;
    // The first round of split outputs is loaded with the weights' inputs instead of after them (one round trip
    // less per block): splits past the last non-empty one read stale values, which get weight 0 and are skipped.
    const float* po = p.part_o + ((u64)row * p.splits * p.heads + h) * p.dim;
    const u64 sstride = (u64)p.heads * p.dim;
    const int c = threadIdx.x * 4;
    const bool live = c < p.dim;
    float4 x0[SP_MERGE_PF];
    if (live) sp_merge_load(po, sstride, c, 0, min(p.splits, SP_MERGE_PF), x0, 0);
    // The rope angles (they depend on the position only), one pair per thread of warps 1.. (idle until the
    // weights are known), as attn_rope_smem computes them.
    const int start = p.dim - p.rdim;  // even: a rope pair never straddles two threads
    for (int i = (int)threadIdx.x - 32; i >= 0 && i < p.rdim / 2; i += blockDim.x - 32) {
        attn_rope_angle(p.positions[row], p.freqs[i], 1, rsn[i], rcs[i]);
    }
    if (threadIdx.x < 32) {
        // lane s (and s + 32) weighs split s: M = max(sink, m_s), den = exp(sink - M) + sum l_s exp(m_s - M).
        const float sink = p.sink[h];
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
        if (lane < p.splits) {
            m0 = ml[(u64)lane * p.heads * 2];
            l0 = ml[(u64)lane * p.heads * 2 + 1];
        }
        if (lane + 32 < p.splits) {
            m1 = ml[(u64)(lane + 32) * p.heads * 2];
            l1 = ml[(u64)(lane + 32) * p.heads * 2 + 1];
        }
        const float mx = fmaxf(sink, warp_max(fmaxf(m0, m1)));
        const float e0 = m0 == -INFINITY ? 0.f : expf(m0 - mx), e1 = m1 == -INFINITY ? 0.f : expf(m1 - mx);
        const float den = expf(sink - mx) + warp_sum(l0 * e0 + l1 * e1);
        if (lane < p.splits) wgt[lane] = e0;
        if (lane + 32 < p.splits) wgt[lane + 32] = e1;
        const u32 hi = __ballot_sync(0xffffffffu, e1 != 0.f), lo = __ballot_sync(0xffffffffu, e0 != 0.f);
        if (lane == 0) {
            inv_den = 1.0f / den;
            nsplit = hi ? 64 - __clz(hi) : 32 - __clz(lo);
        }
    }
    __syncthreads();
    if (!live) return;
    const int ns = nsplit;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    // SP_MERGE_U splits' loads in flight at a time (v2 waited for each split's load before the next), up to the last
    // split of nonzero weight (empty splits, which hold no output, are a suffix) and still added in split order,
    // skipping weight 0. The first round's first SP_MERGE_PF were loaded before the weights.
    for (int s0 = 0; s0 < ns; s0 += SP_MERGE_U) {
        float4 x[SP_MERGE_U];
        sp_merge_load(po, sstride, c, s0, ns, x, s0 == 0 ? SP_MERGE_PF : 0);
        if (s0 == 0) {
#pragma unroll
            for (int u = 0; u < SP_MERGE_PF; ++u) x[u] = x0[u];
        }
#pragma unroll
        for (int u = 0; u < SP_MERGE_U; ++u) {
            const float w = s0 + u < ns ? wgt[s0 + u] : 0.f;
            if (w == 0.f) continue;
            o.x += w * x[u].x;
            o.y += w * x[u].y;
            o.z += w * x[u].z;
            o.w += w * x[u].w;
        }
    }
    const float id = inv_den;
    float v[4] = {o.x * id, o.y * id, o.z * id, o.w * id};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        const int i = (c + 2 * q - start) / 2;
        if (c + 2 * q >= start) sp_rope_pair(v[2 * q], v[2 * q + 1], rcs[i], rsn[i]);
    }
    const int hpg = p.heads / p.groups, g = h / hpg;
    u16* dst = p.out + ((u64)g * p.rows + row) * ((u64)hpg * p.dim) + (u64)(h % hpg) * p.dim + c;
    *(uint2*)dst = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
}
