// Sparse attention with sink for many queries at once (batched prefill, spec 2.4-2.7), on tensor cores.
//
// Keys of the query in row r (position pos, sequence slot `slot`, whose rows in this call start at row0[r] with
// position pos0[r]); K = V, one shared head:
//   window: positions q = pos-nwin+1 .. pos, nwin = min(pos + 1, window): q >= pos0 -> this call's kv rows
//     kv[row0 + q - pos0] (the ring still holds the previous call's rows: it is updated after this kernel), else
//     the ring row ring[slot, q % window];
//   compressed: HCA (sel == null): entries 0..n-1, n = min((pos + 1) / ratio, cap); CSA: sel[r, 0..min(n, k));
//     SWA (ratio 0): none. The compressors ran before this kernel, so entries completed inside the call exist.
// Math (per head h): z_j = scale <q_h, k_j> (f32 accumulation of bf16 products), online softmax over 32-key
//   tiles; P.V with f32-accurate probabilities like the decode kernel and the CPU reference: p = hi + lo, both
//   bf16 (lo = the rounding error of hi, relative error 2^-17), two mma per step. (Rounding p to one bf16, the
//   official kernel's quirk, moved a few near-tie argmaxes of the tiny test models past the GPU model gates.)
//   Then M = max(m, sink_h), o = acc e^(m-M) / (l e^(m-M) + e^(sink_h - M)),
//   inverse RoPE at pos on the last rdim channels, bf16 store group-major: out[g, r, (h mod hpg)*dim + c]
//   (g = h / hpg, hpg = heads / groups), the layout the grouped wo_a GEMM reads.
// Launch: grid (rows, ceil(heads/64)), block 256 (8 warps), dynamic shared memory pf_attn_smem(dim):
//   Q [64][dim+8] + 2 key tiles [32][dim+8] (cp.async, next tile in flight) + P hi and lo [64][40] bf16, S
//   [64][33] f32 and the per-head statistics. Q.K^T: warp (mi, ni) = (warp % 4, warp / 4) takes heads 16mi.. x keys 16ni..;
//   P.V: heads 16mi.. x channels (dim/2) ni..; ldmatrix (.trans for V) feeds mma.sync m16n8k16.
// Constraints: dim in {64, 128, 256, 512}, rdim even <= 64 and <= dim.
// Variants tried (2026-11-30, H200, kbench pfattn / ncu, BENCH_NOTES): this kernel is the baseline kind 0 and
//   is no longer prefill's default: ncu of one 8K CSA launch (8.0 ms) showed it latency-bound at 1 block (8
//   warps) per SM (255 registers, 153 KB): issue slots 36% busy, 0.47 eligible warps per scheduler, 2.75 G
//   instructions, spills (56 B stack). pf_attn2s3 (prefill_attn_fa.cu: scores in registers, one block
//   barrier per tile, 3 key stages) runs the same launch in 4.8 ms and the 8K prefill's attention core in
//   137 ms against 221. Kept as the fallback where the 183 KB of pf_attn2 are not granted.
#include "common.cuh"

#define PFA_KT 32
#define PFA_HEADS 64
#define PFA_LDP (PFA_KT + 8)

struct PfAttn {
    const u16* q;     // [rows, heads, dim]
    const u16* kv;    // [rows, dim] window rows of this call
    const u16* ring;  // [slots, window, dim]
    const u16* comp;  // [slots, cap, dim] or null
    const int* sel;   // [rows, k] or null
    const int* slots;
    const int* positions;
    const int* row0;
    const int* pos0;
    const float* sink;
    const float* freqs;
    u16* out;
    int heads, dim, window, ratio, cap, k, rdim, groups, rows;
    float scale;
};

__device__ __forceinline__ const u16* pf_attn_key(const PfAttn& p, int r, int i, int nwin, int pos, int slot,
                                                  int p0, int r0) {
    if (i < nwin) {
        const int q = pos - nwin + 1 + i;
        if (q >= p0) return p.kv + (u64)(r0 + q - p0) * p.dim;
        return p.ring + ((u64)slot * p.window + q % p.window) * p.dim;
    }
    const int j = i - nwin;
    const int e = p.sel ? p.sel[(u64)r * p.k + j] : j;
    return p.comp + ((u64)slot * p.cap + e) * p.dim;
}

// Key count of a row at position `pos` (window keys first: `nwin` of them), as the header describes.
__device__ __forceinline__ int pf_attn_nkeys(const PfAttn& p, int pos, int& nwin) {
    nwin = min(pos + 1, p.window);
    int ncomp = 0;
    if (p.ratio > 0) {
        ncomp = min((pos + 1) / p.ratio, p.cap);
        if (p.sel) ncomp = min(ncomp, p.k);
    }
    return nwin + ncomp;
}

// Starts the copies of row r's query heads hbase.. into Qs [64][D+8] (zero rows past the nh real heads);
// the caller (256 threads) commits them with its first key tile.
template <int D>
__device__ __forceinline__ void pf_attn_load_q(const PfAttn& p, u16* Qs, int r, int hbase, int nh) {
    constexpr int CPK = D / 8;
    for (int c = threadIdx.x; c < PFA_HEADS * CPK; c += 256) {
        const int h = c / CPK, part = c - h * CPK;
        const bool ok = h < nh;
        const u16* src = ok ? p.q + ((u64)r * p.heads + hbase + h) * D + part * 8 : p.q;
        pf_cp16(smem_u32(Qs + h * (D + 8) + part * 8), src, ok);
    }
}

template <int D>
__device__ __forceinline__ void pf_attn_body(const PfAttn& p) {
    pdl_wait();  // before any read: the previous kernel may still be running (PDL)
    constexpr int LD = D + 8, CPK = D / 8;
    extern __shared__ __align__(16) u8 pf_dyn_smem[];
    u16* Qs = (u16*)pf_dyn_smem;                  // [64][LD]
    u16* Ks = Qs + PFA_HEADS * LD;                // [2][KT][LD]
    u16* Ps = Ks + 2 * PFA_KT * LD;               // [64][LDP] probabilities, bf16 high part
    u16* Pl = Ps + PFA_HEADS * PFA_LDP;           // [64][LDP] the low part
    float* Ss = (float*)(Pl + PFA_HEADS * PFA_LDP);  // [64][KT + 1]
    float* st = Ss + PFA_HEADS * (PFA_KT + 1);    // m[64], l[64], corr[64], cos[32], sin[32]
    const int r = blockIdx.x, hbase = blockIdx.y * PFA_HEADS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int pos = p.positions[r], slot = p.slots[r], p0 = p.pos0[r], r0 = p.row0[r];
    int nwin;
    const int nkeys = pf_attn_nkeys(p, pos, nwin);
    const int nh = min(PFA_HEADS, p.heads - hbase);
    pf_attn_load_q<D>(p, Qs, r, hbase, nh);
    auto load_keys = [&](int tile, u16* dst) {
        for (int c = tid; c < PFA_KT * CPK; c += 256) {
            const int j = c / CPK, part = c - j * CPK, i = tile * PFA_KT + j;
            const bool ok = i < nkeys;
            const u16* src = ok ? pf_attn_key(p, r, i, nwin, pos, slot, p0, r0) + part * 8 : p.q;
            pf_cp16(smem_u32(dst + j * LD + part * 8), src, ok);
        }
    };
    const int ntiles = (nkeys + PFA_KT - 1) / PFA_KT;
    load_keys(0, Ks);
    cp_async_commit();

    float m_run[8], l_run[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        m_run[j] = -INFINITY;
        l_run[j] = 0.f;
    }
    float acc[D / 16][4];
#pragma unroll
    for (int n = 0; n < D / 16; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    const int mi = warp & 3, ni = warp >> 2;

    for (int t = 0; t < ntiles; ++t) {
        const u16* Kt = Ks + (t & 1) * PFA_KT * LD;
        if (t + 1 < ntiles) {
            load_keys(t + 1, Ks + ((t + 1) & 1) * PFA_KT * LD);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        // S = Q K^T for heads 16mi.., keys 16ni.. of this tile.
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll 4
        for (int kk = 0; kk < D / 16; ++kk) {
            u32 a[4], b0[2], b1[2];
            pf_frag_a(Qs, LD, mi * 16, kk * 16, a);
            pf_frag_b(Kt, LD, ni * 16, kk * 16, b0, b1);
            pf_mma(s[0], a, b0);
            pf_mma(s[1], a, b1);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                Ss[(mi * 16 + gq + (i >> 1) * 8) * (PFA_KT + 1) + ni * 16 + nt * 8 + 2 * tq + (i & 1)] = s[nt][i];
        __syncthreads();
        // Online softmax: warp w owns heads 8w..8w+7, lane = key of the tile.
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int h = warp * 8 + j, key = t * PFA_KT + lane;
            const float v = key < nkeys ? Ss[h * (PFA_KT + 1) + lane] * p.scale : -INFINITY;
            const float mx = fmaxf(m_run[j], warp_max(v));  // finite: key t*KT is always valid
            const float corr = expf(m_run[j] - mx);
            const float pe = expf(v - mx);
            const u16 hi = f32_to_bf16(pe);
            l_run[j] = l_run[j] * corr + warp_sum(pe);
            m_run[j] = mx;
            Ps[h * PFA_LDP + lane] = hi;
            Pl[h * PFA_LDP + lane] = f32_to_bf16(pe - bf16_to_f32(hi));
            if (lane == 0) st[128 + h] = corr;
        }
        __syncthreads();
        // O = O * corr + P V for heads 16mi.., channels (D/2) ni...
        const float c0 = st[128 + mi * 16 + gq], c1 = st[128 + mi * 16 + gq + 8];
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            acc[n][0] *= c0;
            acc[n][1] *= c0;
            acc[n][2] *= c1;
            acc[n][3] *= c1;
        }
#pragma unroll
        for (int kk = 0; kk < PFA_KT / 16; ++kk) {
            u32 ah[4], al[4];
            pf_frag_a(Ps, PFA_LDP, mi * 16, kk * 16, ah);
            pf_frag_a(Pl, PFA_LDP, mi * 16, kk * 16, al);
#pragma unroll
            for (int nb = 0; nb < D / 32; ++nb) {
                u32 b0[2], b1[2];
                pf_frag_bt(Kt, LD, kk * 16, ni * (D / 2) + nb * 16, b0, b1);
                pf_mma(acc[2 * nb], ah, b0);
                pf_mma(acc[2 * nb], al, b0);
                pf_mma(acc[2 * nb + 1], ah, b1);
                pf_mma(acc[2 * nb + 1], al, b1);
            }
        }
        __syncthreads();
    }

    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            st[warp * 8 + j] = m_run[j];
            st[64 + warp * 8 + j] = l_run[j];
        }
    }
    const int rbase = D - p.rdim;
    if (tid < p.rdim / 2) {
        // The inverse rotation's angle depends only on the position: one sin/cos per channel pair per row.
        const double th = (double)pos * (double)p.freqs[tid];
        st[192 + tid] = (float)cos(th);
        st[224 + tid] = (float)sin(-th);
    }
    __syncthreads();
    const int hpg = p.heads / p.groups;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int hl = mi * 16 + gq + hh * 8, h = hbase + hl;
        if (hl >= nh) continue;
        const float m = st[hl], l = st[64 + hl], sk = p.sink[h];
        const float mm = fmaxf(m, sk), e = expf(m - mm);
        const float f = e / (l * e + expf(sk - mm));
        const int grp = h / hpg;
        u16* dst = p.out + ((u64)grp * p.rows + r) * ((u64)hpg * D) + (u64)(h - grp * hpg) * D;
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            const int c = ni * (D / 2) + n * 8 + 2 * tq;
            float a0 = acc[n][hh * 2] * f, a1 = acc[n][hh * 2 + 1] * f;
            if (c >= rbase) {
                const int i = (c - rbase) >> 1;
                const float cs = st[192 + i], sn = st[224 + i];
                const float x0 = a0 * cs - a1 * sn, x1 = a0 * sn + a1 * cs;
                a0 = x0;
                a1 = x1;
            }
            *(u32*)(dst + c) = (u32)f32_to_bf16(a0) | ((u32)f32_to_bf16(a1) << 16);
        }
    }
}

#define PF_ATTN_KERNEL(D) \
    extern "C" __global__ void __launch_bounds__(256) pf_attn_d##D(PfAttn p) { pf_attn_body<D>(p); }
PF_ATTN_KERNEL(64)
PF_ATTN_KERNEL(128)
PF_ATTN_KERNEL(256)
PF_ATTN_KERNEL(512)
