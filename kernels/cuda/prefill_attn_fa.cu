// Prefill attention, second version (pf_attn2s{3,4}_d{D}): same inputs, keys and math as pf_attn_d{D}
// (prefill_attn.cu, whose PfAttn and pf_attn_key it uses), with the scores kept in registers.
//
// Why: pf_attn_d512 runs one 8-warp block per SM (153 KB shared memory, 255 registers) and walks each 32-key
// tile in four block-wide phases (Q.K^T -> S to shared memory -> softmax by 8-head warps -> P to shared
// memory -> P.V), so the tensor pipe idles through the softmax and every barrier, and each warp's Q.K^T is two
// chains of 32 dependent mma.
// Here warp (mi, ni) = (warp % 4, warp / 4) owns heads 16mi..16mi+15 for the whole tile:
//   Q.K^T: the 16 heads x all 32 keys over half the channels, ni*D/2.. (four chains of D/32 mma); the two
//     warps of a head group swap their partial scores through shared memory (a 64-thread named barrier) and
//     add them, so both hold the same S in registers (a + b = b + a exactly).
//   Softmax in registers: a row's 32 scores sit in one lane quad (8 each), two shuffles per reduction. P is
//     split into bf16 hi + lo (f32-accurate, as in pf_attn) and the mma C fragments become the A fragments of
//     P.V directly (no shared-memory P).
//   P.V: the 16 heads x channels ni*D/2.. as in pf_attn.
// One block barrier per tile (the key ring's reuse); key tiles ride an S-stage cp.async ring (S = 3 or 4),
// each thread copying one key row part (one address computation, one `sel` read per tile). Blocks take rows in
// reverse order: within a sequence later rows have more keys, so the longest blocks start first (shorter tail).
// Shared memory (host: pf_attn_smem(kind, D), S = kind + 2): Q [64][D+8] + S x [32][D+8] keys (bf16) + 8 warps x 16 x 32 f32 partial
// scores + 64 f32 (cos, sin of the inverse RoPE).
// Launch: grid (rows, ceil(heads/64)), block 256, dim in {64, 128, 256, 512}, rdim even <= 64 and <= dim.
// Measured (2026-11-30, H200, kbench pfattn at 8192 rows, us per launch; BENCH_NOTES): CSA 8010 -> 4813 (s3) /
//   4769 (s4), HCA 2414 -> 1640 / 1639, SWA 1893 -> 1315 / 1322; the 43 layers 220 -> 137 / 136 ms; outputs
//   within 0.97 of the test bound of pf_attn's. s4 is within noise of s3, so s3 (less shared memory) is the
//   default. ncu (8K CSA): 8.66 M cycles against 14.36 M, 2.09 G instructions against 2.75 G, no spills (254
//   registers), issue slots 46% busy, 0.70 eligible warps per scheduler, ALU the busiest pipe (41%): still
//   latency- and issue-bound at 8 warps per SM. Not run yet: the hardware bf16x2 conversion for P hi/lo
//   (cvt.rn.bf16x2.f32, same bits; compiled, it tips ptxas into small spills), skipping the accumulator
//   rescale when no row maximum moved, 64-key tiles.

// Barrier of the two warps (64 threads) of head group `mi` (ids 1..4; 0 is __syncthreads).
__device__ __forceinline__ void pf_pair_sync(int mi) {
    asm volatile("bar.sync %0, 64;" ::"r"(mi + 1) : "memory");
}

__device__ __forceinline__ u32 pf_pack_bf16(u16 lo, u16 hi) { return (u32)lo | ((u32)hi << 16); }

template <int D, int S>
__device__ __forceinline__ void pf_attn2_body(const PfAttn& p) {
    pdl_wait();  // before any read: the previous kernel may still be running (PDL)
    constexpr int LD = D + 8, CPK = D / 8, HALF = D / 2;
    extern __shared__ __align__(16) u8 pf2_dyn_smem[];
    u16* Qs = (u16*)pf2_dyn_smem;               // [64][LD]
    u16* Ks = Qs + PFA_HEADS * LD;              // [S][KT][LD]
    float* Xs = (float*)(Ks + S * PFA_KT * LD);  // [8 warps][16][32] partial scores
    float* cs = Xs + 8 * 16 * 32;               // cos[32], sin[32]
    const int r = p.rows - 1 - blockIdx.x, hbase = blockIdx.y * PFA_HEADS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int mi = warp & 3, ni = warp >> 2;
    const int pos = p.positions[r], slot = p.slots[r], p0 = p.pos0[r], r0 = p.row0[r];
    int nwin;
    const int nkeys = pf_attn_nkeys(p, pos, nwin);
    const int nh = min(PFA_HEADS, p.heads - hbase);
    const int ntiles = (nkeys + PFA_KT - 1) / PFA_KT;
    pf_attn_load_q<D>(p, Qs, r, hbase, nh);
    // Thread tid copies parts tid % 8, +8, .. of key tid / 8 (zero-filled past nkeys: P.V then multiplies
    // zeros, never stale shared memory, by p = 0).
    auto load_keys = [&](int tile) {
        if (tile >= ntiles) return;
        const int j = tid >> 3, i = tile * PFA_KT + j;
        const bool ok = i < nkeys;
        const u16* src = ok ? pf_attn_key(p, r, i, nwin, pos, slot, p0, r0) : p.q;
        const u32 dst = smem_u32(Ks + ((tile % S) * PFA_KT + j) * LD);
#pragma unroll
        for (int i = 0; i < CPK / 8; ++i) {
            const int c = (tid & 7) + 8 * i;
            pf_cp16(dst + c * 16, src + (ok ? c * 8 : 0), ok);
        }
    };
#pragma unroll
    for (int t = 0; t < S - 1; ++t) {
        load_keys(t);
        cp_async_commit();  // always: the wait below counts groups
    }
    if (tid < p.rdim / 2) {
        // The inverse rotation's angle depends only on the position: one sin/cos per channel pair per row.
        const double th = (double)pos * (double)p.freqs[tid];
        cs[tid] = (float)cos(th);
        cs[32 + tid] = (float)sin(-th);
    }

    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    float acc[D / 16][4];
#pragma unroll
    for (int n = 0; n < D / 16; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float* Xw = Xs + warp * 512;
    const float* Xo = Xs + (warp ^ 4) * 512;

    for (int t = 0; t < ntiles; ++t) {
        cp_async_wait<S - 2>();
        __syncthreads();  // tile t visible to all; every warp is done with tile t-1's buffer
        load_keys(t + S - 1);
        cp_async_commit();
        const u16* Kt = Ks + (t % S) * PFA_KT * LD;
        // Partial S: heads 16mi.. x the tile's 32 keys over channels ni*HALF...
        float s[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll 4
        for (int kk = 0; kk < HALF / 16; ++kk) {
            const int k0 = ni * HALF + kk * 16;
            u32 a[4], b[4][2];
            pf_frag_a(Qs, LD, mi * 16, k0, a);
            pf_frag_b(Kt, LD, 0, k0, b[0], b[1]);
            pf_frag_b(Kt, LD, 16, k0, b[2], b[3]);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) pf_mma(s[nt], a, b[nt]);
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) Xw[i * 32 + lane] = s[i >> 2][i & 3];
        pf_pair_sync(mi);
        // Scores of rows gq (i < 2) and gq + 8 (i >= 2) at keys nt*8 + 2tq + (i & 1), scaled, masked.
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int key = t * PFA_KT + nt * 8 + 2 * tq + (i & 1);
                const float v = (s[nt][i] + Xo[(nt * 4 + i) * 32 + lane]) * p.scale;
                s[nt][i] = key < nkeys ? v : -INFINITY;
                mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
            }
        float corr[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            mx[h] = fmaxf(m_run[h], mx[h]);  // finite: key t*KT is always valid
            corr[h] = expf(m_run[h] - mx[h]);
            m_run[h] = mx[h];
        }
        // P = hi + lo, packed straight into the A fragments of P.V (k = key within the 16-key step).
        u32 ph[2][4], pl[2][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const float e0 = expf(s[nt][2 * hh] - mx[hh]), e1 = expf(s[nt][2 * hh + 1] - mx[hh]);
                sum[hh] += e0 + e1;
                const u16 h0 = f32_to_bf16(e0), h1 = f32_to_bf16(e1);
                const u16 l0 = f32_to_bf16(e0 - bf16_to_f32(h0)), l1 = f32_to_bf16(e1 - bf16_to_f32(h1));
                ph[nt >> 1][(nt & 1) * 2 + hh] = pf_pack_bf16(h0, h1);
                pl[nt >> 1][(nt & 1) * 2 + hh] = pf_pack_bf16(l0, l1);
            }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
            sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
            l_run[h] = l_run[h] * corr[h] + sum[h];
        }
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            acc[n][0] *= corr[0];
            acc[n][1] *= corr[0];
            acc[n][2] *= corr[1];
            acc[n][3] *= corr[1];
        }
#pragma unroll
        for (int kk = 0; kk < PFA_KT / 16; ++kk)
#pragma unroll
            for (int nb = 0; nb < D / 32; ++nb) {
                u32 b0[2], b1[2];
                pf_frag_bt(Kt, LD, kk * 16, ni * HALF + nb * 16, b0, b1);
                pf_mma(acc[2 * nb], ph[kk], b0);
                pf_mma(acc[2 * nb], pl[kk], b0);
                pf_mma(acc[2 * nb + 1], ph[kk], b1);
                pf_mma(acc[2 * nb + 1], pl[kk], b1);
            }
    }

    const int rbase = D - p.rdim, hpg = p.heads / p.groups;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int hl = mi * 16 + gq + hh * 8, h = hbase + hl;
        if (hl >= nh) continue;
        const float sk = p.sink[h], mm = fmaxf(m_run[hh], sk), e = expf(m_run[hh] - mm);
        const float f = e / (l_run[hh] * e + expf(sk - mm));
        const int grp = h / hpg;
        u16* dst = p.out + ((u64)grp * p.rows + r) * ((u64)hpg * D) + (u64)(h - grp * hpg) * D;
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            const int c = ni * HALF + n * 8 + 2 * tq;
            float a0 = acc[n][hh * 2] * f, a1 = acc[n][hh * 2 + 1] * f;
            if (c >= rbase) {
                const int i = (c - rbase) >> 1;
                const float x0 = a0 * cs[i] - a1 * cs[32 + i], x1 = a0 * cs[32 + i] + a1 * cs[i];
                a0 = x0;
                a1 = x1;
            }
            *(u32*)(dst + c) = pf_pack_bf16(f32_to_bf16(a0), f32_to_bf16(a1));
        }
    }
}

#define PF_ATTN2_KERNEL(D, S) \
    extern "C" __global__ void __launch_bounds__(256) pf_attn2s##S##_d##D(PfAttn p) { pf_attn2_body<D, S>(p); }
PF_ATTN2_KERNEL(64, 3)
PF_ATTN2_KERNEL(128, 3)
PF_ATTN2_KERNEL(256, 3)
PF_ATTN2_KERNEL(512, 3)
PF_ATTN2_KERNEL(64, 4)
PF_ATTN2_KERNEL(128, 4)
PF_ATTN2_KERNEL(256, 4)
PF_ATTN2_KERNEL(512, 4)
