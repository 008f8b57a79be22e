// mHC for calls of many rows (batched prefill; spec 2.3, math and layouts in mhc.cu): the block mixer's HCPre
// without a fused HCPost (hc_mix_tile24 then hc_finish24_wide) and HCPost on 8 columns per thread (hc_post8).
// Every value is formed by the same operations in the same order as the decode kernels (hc_mix_partial24_mg1 +
// hc_finish24, hc_post): the same bits.
//
// hc_mix_tile24: grid (L = min(chunks, 32), ceil(rows / 128)), block 256, MHC_TILE_SMEM dynamic shared memory.
//          Why: hc_mix_partial (one block per 128-column chunk walking every row, 25 warp_sum reductions per
//          row and chunk) ran 0.81 ms for 8192 rows, shuffle- and latency-bound at ~0.3 TB/s. Its sums are
//          c_ch = the warp_sum butterfly (xor 16, 8, 4, 2, 1) over the chunk's 32 4-column dots, then in hc_finish
//          t_l = 0 + c_l + c_{l+32} + ... per lane l and the butterfly over l. Block (l, row tile) forms t_l itself:
//          it walks chunks l, l + 32, ... (cp.async double buffer of the chunk's 128 rows of x and 24 x 128 fn) and
//          a thread (2 rows x 6 mixes; warp & 3 picks the mixes, quarter 0 also the sums of squares) evaluates
//          each c_ch as the same butterfly tree in registers: leaves in bit-reversed lane order, so that each
//          addition pairs what a shuffle step paired (addition commutes: the same bits), no shuffles. ws gets t_l
//          as chunk l of an L-chunk workspace; hc_finish's sum of it (0 + t_l, then the butterfly) is the old one.
//          x lives in shared memory with 8-byte group g of tile row t at slot g ^ (t & 31): a warp's 32 rows read
//          one group conflict-free; fn is read as warp-wide broadcasts.
// hc_finish24_wide: hc_finish24 (mhc_finish.cu) for many rows: 4 blocks per SM instead of 2 (launch bounds: 56
//          registers), the collapse from 16-byte loads (8 per thread, after the L1 prefetch) instead of 64 scalar
//          ones; the sum of squares is then taken from av over hc_finish24's columns per thread (i, i + 256, ...)
//          in its order. No copy-back (callers with a fused HCPost use hc_finish24).
// hc_post8: hc_post with 16-byte loads and stores: grid (rows, ceil(D / 2048)), block 256, 8 columns per thread.
// Constraints: as mhc.cu (n = 4, D % 8 == 0, D <= MHC_MAX_D); M = 24 only (the head's single call keeps mhc.cu's).
#include "common.cuh"

#define MHC_TILE_ROWS 128                           // rows per hc_mix_tile24 block
#define MHC_TILE_XB (MHC_TILE_ROWS * MHC_CHUNK * 2)  // bytes of one stage of x (bf16)
#define MHC_TILE_FB (MHC_MIX * MHC_CHUNK * 4)        // bytes of one stage of fn (f32)
#define MHC_TILE_SMEM (2 * (MHC_TILE_XB + MHC_TILE_FB))
#define MHC_TILE_NM 6  // mixes per thread
#define MHC_REV3(b) ((((b) & 1) << 2) | ((b) & 2) | (((b) >> 2) & 1))

// Stage of chunk ch for the block's rows row0..row0+127 (x: zeros past the rows or the columns, as the decode
// kernel's invalid lanes; fn: zeros past the columns).
__device__ __forceinline__ void mhc_tile_stage(const u16* __restrict__ X, const float* __restrict__ fn, int rows,
                                               int nd, int row0, int ch, u32 xs, u32 fs) {
    const int lane = threadIdx.x & 31, c = ch * MHC_CHUNK + lane * 4;
    const bool cok = c < nd;
#pragma unroll 4
    for (int t = threadIdx.x >> 5; t < MHC_TILE_ROWS; t += 8) {
        const bool ok = cok && row0 + t < rows;
        const u16* src = ok ? X + (u64)(row0 + t) * nd + c : X;
        cp_async8(xs + (u32)(t * MHC_CHUNK * 2 + ((lane ^ (t & 31)) << 3)), src, ok ? 8u : 0u);
    }
    for (int i = threadIdx.x; i < MHC_MIX * (MHC_CHUNK / 4); i += 256) {
        const int cc = ch * MHC_CHUNK + (i & 31) * 4;
        const bool ok = cc < nd;
        const float* src = ok ? fn + (u64)(i >> 5) * nd + cc : fn;
        cp_async16(fs + (u32)(i * 16), src, ok ? 16u : 0u);
    }
}

// The 8 leaves p = 8a + b (b = 0..7) of one chunk's butterfly tree for the thread's 2 rows: lane g = bitrev5(p) =
// rev3(b) * 4 + ga (ga = bitrev2(a)), summed as the tree pairs them (the leaf pairs of xor 16, then 8, 4), into v.
// xs[r]: the row's stage with its swizzle (slot of lane g: g ^ t, t & 31 = the thread's lane), fs: the mixes'
// fn stage at lane ga.
template <bool SS>
__device__ __forceinline__ void mhc_tile_leaves8(const u16* const (&xs)[2], int gsw, const float* fs,
                                                 float (&v)[2][MHC_TILE_NM + 1]) {
    constexpr int NA = MHC_TILE_NM + (SS ? 1 : 0);
    float st[3][2][MHC_TILE_NM + 1];
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        const int r3 = MHC_REV3(b);
        float q[2][MHC_TILE_NM + 1];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float x[4];
            mhc_unpack4(*(const uint2*)(xs[r] + (((r3 << 2) ^ gsw) << 2)), x);
#pragma unroll
            for (int i = 0; i < MHC_TILE_NM; ++i)
                q[r][i] = mhc_dot4(*(const float4*)(fs + i * MHC_CHUNK + r3 * 16), x);
            if constexpr (SS) q[r][MHC_TILE_NM] = mhc_sq4(x);
        }
        // Leaf b merges the partials of b's trailing set bits (the stack holds one per set bit of b).
        int j = 0;
#pragma unroll
        for (; j < 3 && ((b >> j) & 1); ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int i = 0; i < NA; ++i) q[r][i] = st[j][r][i] + q[r][i];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int i = 0; i < NA; ++i) {
                if (j < 3) st[j][r][i] = q[r][i];
                else v[r][i] = q[r][i];
            }
    }
}

// One chunk's sums c (the butterfly over its 32 lanes) for the thread's 2 rows, added to t (t += c, chunk order).
// The 8-leaf blocks a = 0..3 pair as the xor 2 and xor 1 steps do, (a 0 + a 1) + (a 2 + a 3): a loop trip takes a
// pair (a = 2 a2, 2 a2 + 1; one 8-leaf block per trip spent ~15% more instructions on moves and predicated copies).
template <bool SS>
__device__ __forceinline__ void mhc_tile_chunk(const u16* const (&xs)[2], int lane, const float* fs,
                                               float (&t)[2][MHC_TILE_NM + 1]) {
    constexpr int NA = MHC_TILE_NM + (SS ? 1 : 0);
    float s16[2][MHC_TILE_NM + 1];
#pragma unroll 1
    for (int a2 = 0; a2 < 2; ++a2) {
        float v0[2][MHC_TILE_NM + 1], v1[2][MHC_TILE_NM + 1];
        mhc_tile_leaves8<SS>(xs, a2 ^ lane, fs + a2 * 4, v0);              // a = 2 a2: ga = bitrev2(a) = a2
        mhc_tile_leaves8<SS>(xs, (2 + a2) ^ lane, fs + (2 + a2) * 4, v1);  // a = 2 a2 + 1: ga = 2 + a2
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int i = 0; i < NA; ++i) {
                const float p = v0[r][i] + v1[r][i];
                if (a2 == 0) s16[r][i] = p;
                else t[r][i] += s16[r][i] + p;
            }
    }
}

extern "C" __global__ void __launch_bounds__(256, 2)
    hc_mix_tile24(const u16* __restrict__ X, const float* __restrict__ fn, float* __restrict__ ws, int rows, int D) {
    extern __shared__ __align__(16) unsigned char mhc_tile_smem[];
    pdl_wait();
    const int nd = MHC_N * D, chunks = (nd + MHC_CHUNK - 1) / MHC_CHUNK;
    const int l = blockIdx.x, row0 = blockIdx.y * MHC_TILE_ROWS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quarter = warp & 3;
    const int t0 = (warp >> 2) * 64 + lane;  // the thread's tile rows: t0 and t0 + 32
    const u32 sbase = smem_u32(mhc_tile_smem);
    const int steps = (chunks - l + 31) >> 5;  // chunks l, l + 32, ... below chunks
    float t[2][MHC_TILE_NM + 1];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i <= MHC_TILE_NM; ++i) t[r][i] = 0.f;
    mhc_tile_stage(X, fn, rows, nd, row0, l, sbase, sbase + 2 * MHC_TILE_XB);
    cp_async_commit();
    for (int k = 0; k < steps; ++k) {
        const int s = k & 1;
        if (k + 1 < steps) {
            mhc_tile_stage(X, fn, rows, nd, row0, l + 32 * (k + 1), sbase + (s ^ 1) * MHC_TILE_XB,
                           sbase + 2 * MHC_TILE_XB + (s ^ 1) * MHC_TILE_FB);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const u16* xst = (const u16*)(mhc_tile_smem + s * MHC_TILE_XB);
        const u16* const xs[2] = {xst + t0 * MHC_CHUNK, xst + (t0 + 32) * MHC_CHUNK};
        const float* fs = (const float*)(mhc_tile_smem + 2 * MHC_TILE_XB + s * MHC_TILE_FB) +
                          quarter * MHC_TILE_NM * MHC_CHUNK;
        if (quarter == 0) mhc_tile_chunk<true>(xs, lane, fs, t);
        else mhc_tile_chunk<false>(xs, lane, fs, t);
        __syncthreads();  // the stage is refilled two chunks on
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + t0 + 32 * r;
        if (row >= rows) continue;
        float* o = ws + ((u64)l * rows + row) * (MHC_MIX + 1);
#pragma unroll
        for (int i = 0; i < MHC_TILE_NM; ++i) o[quarter * MHC_TILE_NM + i] = t[r][i];
        if (quarter == 0) o[MHC_MIX] = t[r][MHC_TILE_NM];
    }
}

// Eight bf16 (16 bytes) -> f32.
__device__ __forceinline__ void mhc_unpack8(uint4 v, float* f) {
    mhc_unpack4(make_uint2(v.x, v.y), f);
    mhc_unpack4(make_uint2(v.z, v.w), f + 4);
}

// A round of the thread's 16-byte collapse loads (pieces v0 + i, v0 + i + 256 of each stream; zeros past the row).
__device__ __forceinline__ void mhc_wide_load(const u16* __restrict__ xr, int D, int v0, uint4 (&w)[2][MHC_N]) {
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int j = 0; j < MHC_N; ++j) {
            const int v = v0 + threadIdx.x + 256 * u;
            w[u][j] = v < (D >> 3) ? ldg_keep(xr + (u64)j * D + v * 8) : make_uint4(0u, 0u, 0u, 0u);
        }
}

// mhc_collapse from 16-byte loads: av gets every column, then the thread's sum of squares over mhc_collapse's
// columns (i, i + 256, ... in that order) from av.
__device__ __forceinline__ float mhc_collapse_wide(const u16* __restrict__ xr, int D, const float* pre, float* av) {
    for (int v0 = 0; v0 < (D >> 3); v0 += 512) {
        uint4 w[2][MHC_N];
        mhc_wide_load(xr, D, v0, w);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int v = v0 + threadIdx.x + 256 * u;
            if (v >= (D >> 3)) continue;
            float x[MHC_N][8];
#pragma unroll
            for (int j = 0; j < MHC_N; ++j) mhc_unpack8(w[u][j], x[j]);
            float a[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const float xc[MHC_N] = {x[0][q], x[1][q], x[2][q], x[3][q]};
                a[q] = mhc_collapse_col(pre, xc);
            }
            *(float4*)(av + v * 8) = make_float4(a[0], a[1], a[2], a[3]);
            *(float4*)(av + v * 8 + 4) = make_float4(a[4], a[5], a[6], a[7]);
        }
    }
    mhc_bar8();
    float ss = 0.f;
    for (int c = threadIdx.x; c < D; c += 256) ss = mhc_sq_add(ss, av[c]);
    return ss;
}

extern "C" __global__ void __launch_bounds__(288, 4)
    hc_finish24_wide(const u16* X, const float* ws, int chunks, int rows, int D, const float* scale,
                     const float* base, const float* norm_w, float eps, float hc_eps, int iters, float* mix, u16* y,
                     u16* yq, int yq_bf16, u8* yc, float* ycs, u16* xcopy) {
    (void)xcopy;
    pdl_wait();
    __shared__ float sred[MHC_MIX + 1];
    __shared__ float sh[MHC_FIN_WARPS];
    __shared__ __align__(16) float av[MHC_MAX_D];
    const int row = blockIdx.x, warp = threadIdx.x >> 5, nd = MHC_N * D;
    const u16* xr = X + (u64)row * nd;
    float s0 = 0.f, bj = 0.f;  // bj: base[lane % 4] (mhc_pre_coefs)
    // The row's streams into L1 beside the partial sums' loads (loading them into registers here took 72
    // registers, 3 blocks per SM: HCPre 2-3% slower at 8192 rows).
    prefetch_l1(xr, nd * 2);
    if (warp < MHC_FIN_WARPS) {
        s0 = scale[0];
        bj = base[threadIdx.x & (MHC_N - 1)];
    }
    prefetch_l1(norm_w, D * 4);
    mhc_partial_sums<MHC_MIX>(ws, chunks, rows, row, sred);
    __syncthreads();
    const float rho = mhc_rho(sred, MHC_MIX, nd, eps);
    if (warp == MHC_FIN_WARPS) {
        mhc_post_comb(sred, rho, scale, base, hc_eps, iters, mix + (u64)row * MHC_MIX);
        return;
    }
    float pre[MHC_N];
    mhc_pre_coefs(sred, rho, s0, bj, hc_eps, pre);
    const float ss = mhc_collapse_wide(xr, D, pre, av);
    const float inv = 1.f / sqrtf(mhc_block_sum(ss, sh) / (float)D + eps);
    if (yq)
        mhc_store_yq(norm_w, av, inv, D, yq_bf16, y + (u64)row * D, yq + (u64)row * D,
                     yc ? yc + (u64)row * D : nullptr, ycs ? ycs + (u64)row * (D >> 7) : nullptr);
    else
        mhc_store_y(norm_w, av, inv, D, y + (u64)row * D);
}

// HCPost (hc_post's math per column: f by mhc_post_f's sums in k order, mhc_post_value) of 8 columns per thread.
extern "C" __global__ void __launch_bounds__(256) hc_post8(u16* __restrict__ X, const float* __restrict__ mix,
                                                           const u16* __restrict__ f_bf16,
                                                           const float* __restrict__ ys,
                                                           const float* __restrict__ ysh, int D, int topk,
                                                           int mode) {
    pdl_wait();
    const int row = blockIdx.x, c = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (c >= D) return;
    u16* xr = X + (u64)row * MHC_N * D + c;
    uint4 xw[MHC_N];
#pragma unroll
    for (int i = 0; i < MHC_N; ++i) xw[i] = *(const uint4*)(xr + (u64)i * D);
    float f[8];
    if (mode == 0) {
        mhc_unpack8(*(const uint4*)(f_bf16 + (u64)row * D + c), f);
    } else {
        const float* yr = ys + (u64)row * topk * D + c;
        float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int k0 = 0; k0 < topk; k0 += 4) {  // 4 experts' loads in flight, then the adds in k order
            float4 v[4][2];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (k0 + u < topk) {
                    v[u][0] = *(const float4*)(yr + (u64)(k0 + u) * D);
                    v[u][1] = *(const float4*)(yr + (u64)(k0 + u) * D + 4);
                }
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (k0 + u < topk) {
                    s[0] += v[u][0].x;
                    s[1] += v[u][0].y;
                    s[2] += v[u][0].z;
                    s[3] += v[u][0].w;
                    s[4] += v[u][1].x;
                    s[5] += v[u][1].y;
                    s[6] += v[u][1].z;
                    s[7] += v[u][1].w;
                }
        }
        const float4 h0 = *(const float4*)(ysh + (u64)row * D + c), h1 = *(const float4*)(ysh + (u64)row * D + c + 4);
        const float h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
        for (int q = 0; q < 8; ++q) f[q] = bf16_to_f32(f32_to_bf16(s[q] + h[q]));
    }
    const float* mo = mix + (u64)row * MHC_MIX;
    float old[MHC_N][8];
#pragma unroll
    for (int i = 0; i < MHC_N; ++i) mhc_unpack8(xw[i], old[i]);
#pragma unroll
    for (int k = 0; k < MHC_N; ++k) {
        u32 p[4];
#pragma unroll
        for (int q = 0; q < 8; q += 2) {
            const float o0[MHC_N] = {old[0][q], old[1][q], old[2][q], old[3][q]};
            const float o1[MHC_N] = {old[0][q + 1], old[1][q + 1], old[2][q + 1], old[3][q + 1]};
            p[q >> 1] = (u32)f32_to_bf16(mhc_post_value(mo, k, f[q], o0)) |
                        ((u32)f32_to_bf16(mhc_post_value(mo, k, f[q + 1], o1)) << 16);
        }
        *(uint4*)(xr + (u64)k * D) = make_uint4(p[0], p[1], p[2], p[3]);
    }
}
