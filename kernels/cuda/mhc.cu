// mHC hyper-connections (spec 2.3) for decode, plus the embedding gather that creates the streams.
//
// Math:    x = the n = 4 bf16 streams of one token flattened ([4*D], stream-major); rho = (mean(x^2)+eps)^-1/2;
//          mu = (fn . x) * rho ([M], M = 24 for a block mixer, 4 for the HC head);
//          pre_j = sigmoid(mu_j s0 + b_j) + hc_eps; post_j = 2 sigmoid(mu_{4+j} s1 + b_{4+j});
//          comb = Sinkhorn(mu_{8+4i+k} s2 + b_{8+4i+k}) (row softmax + eps, column normalise, then iters-1
//          row/column pairs, +eps in every denominator); a = bf16(sum_j pre_j x_j) (un-normalised streams);
//          out = RMSNorm_w(a) (the attn_norm / ffn_norm / final norm that always follows).
//          HCPost: X'_k = bf16(post_k f + sum_i comb[i,k] X_i) (comb applied transposed).
// Layout:  X bf16 [rows, 4, D]; fn f32 [M, 4D]; base f32 [M]; scale f32 [3] (head: [1]); mix f32 [rows, 24]
//          = post[4] then comb[16] row-major (i, k); partial sums ws f32 [chunks, rows, M+1] (M dots + sum x^2).
// Launch:  hc_mix_partial{24,4}_mg{1,2,4,8}: grid ceil(4D/128), block 256. Each warp keeps its mixes of the
//          block's 128-column slice of fn in registers (lane: 4 columns, float4 loads) and dots it with its
//          rows (MG mix groups x 8 / MG row groups, MG picked by the launcher from the row count); 128
//          blocks share the 1.5 MB fn read (fn is read once per step whatever the batch).
//          hc_post_mix{24,4}_mg{1,2,4,8}: the same, first forming its values as the previous mixer's HCPost
//          (the one after attention fused into the ffn mixer, the one after the MoE into the next block's
//          attention mixer or the HC head: one launch fewer per HCPost). A chunk is one stream's columns,
//          but HCPost mixes all 4 streams of a column, so X cannot be updated in place (other blocks still
//          read its old values): the new streams go to a scratch copy, which hc_finish reads and copies
//          back into X. Same values, chunks and sums as HCPost then hc_mix_partial: the same bits.
//          hc_finish{24,4} (mhc_finish.cu): grid rows, block 288: sums the partials, Sinkhorn, collapse,
//          RMSNorm and the FP8 fake-quantised copy; after hc_post_mix it copies the scratch streams into X.
//          hc_post: grid (rows, ceil(D/256)), block 256; in place (each thread reads its 4 stream values
//          before writing them). Mode 1 forms f = bf16(sum_k y_routed[k] + y_shared) from the MoE's f32
//          partial outputs, fusing the MoE sum into the residual update. For callers without the
//          scratch copy (prefill, the split runner's tensor mode) or no HCPre after (a layer rank's last block).
//          embed_streams: grid rows, block 256, 16-byte copies.
//          Calls of many rows (batched prefill, from 256 rows: ops::mhc tile_min) use mhc_wide.cu's forms of the
//          unfused block-mixer HCPre and of hc_post instead (the same bits).
// Variants (H200, D = 4096, batch 1, per mixer, inside a 43-layer step): v1 staged fn in shared memory per
//          256-column block and 8-row group, summed partials with 25 threads looping over chunks and ran
//          Sinkhorn in one thread: 52 us. v2 (this): fn in registers, warp-parallel partial sums and Sinkhorn.
//          A single fused kernel (one block per row) was rejected on paper: at batch 1 it reads fn at one
//          SM's bandwidth (~15 us per mixer). v3 fused HCPost by re-slicing the chunks (one block: 32 columns
//          of all 4 streams, updated in place): another sum order, which moved the official-numerics synthetic
//          model test under its argmax gate (0.732 -> 0.683, noise-level flips); v4 (this) keeps the chunks.
// Depends on f32_to_e4m3 / e4m3_to_f32 from act_quant.cu (same translation unit; it sorts first).
// Constraints: n = 4 (checked on the host), D % 8 == 0.
#include "common.cuh"

#define MHC_N 4
#define MHC_CHUNK 128
#define MHC_MIX 24
#define MHC_MAX_D 8192  // widest row hc_finish keeps in shared memory

extern "C" __global__ void __launch_bounds__(256) embed_streams(const i32* __restrict__ ids,
                                                                const u16* __restrict__ table,
                                                                u16* __restrict__ X, int D) {
    pdl_wait();
    const int r = blockIdx.x;
    const u64 id = (u64)ids[r];
    const uint4* src = (const uint4*)(table + id * (u64)D);
    uint4* dst = (uint4*)(X + (u64)r * MHC_N * D);
    const int v = D >> 3;
    for (int i = threadIdx.x; i < v; i += blockDim.x) {
        const uint4 val = src[i];
#pragma unroll
        for (int j = 0; j < MHC_N; ++j) dst[j * v + i] = val;
    }
}

// Four bf16 (8 bytes) -> f32.
__device__ __forceinline__ void mhc_unpack4(uint2 v, float* f) {
    f[0] = bf16_to_f32((u16)(v.x & 0xffffu));
    f[1] = bf16_to_f32((u16)(v.x >> 16));
    f[2] = bf16_to_f32((u16)(v.y & 0xffffu));
    f[3] = bf16_to_f32((u16)(v.y >> 16));
}

__device__ __forceinline__ void mhc_load4(const u16* p, float* f) { mhc_unpack4(*(const uint2*)p, f); }

// HCPost of one stream value: post_k f + sum_i comb[i, k] old_i (mo = the row's 24 mixes; comb applied
// transposed). Shared by hc_post and the fused hc_post_mix so both give the same bits.
__device__ __forceinline__ float mhc_post_value(const float* mo, int k, float f, const float* old) {
    float acc = __fmul_rn(mo[k], f);
#pragma unroll
    for (int i = 0; i < MHC_N; ++i) acc = __fmaf_rn(mo[4 + i * 4 + k], old[i], acc);
    return acc;
}

// The sub-block output f at column c of a row. mode 0: f_bf16[row]; mode 1: bf16(sum_k ys[row*topk+k] + ysh[row])
// (the MoE's f32 partial outputs, summed in k order).
__device__ __forceinline__ float mhc_post_f(const u16* f_bf16, const float* ys, const float* ysh, u64 row, int c,
                                            int D, int topk, int mode) {
    if (mode == 0) return bf16_to_f32(f_bf16[row * D + c]);
    float s = 0.f;
    for (int k = 0; k < topk; ++k) s += ys[(row * topk + k) * D + c];
    return bf16_to_f32(f32_to_bf16(s + ysh[row * D + c]));
}

// The previous mixer's HCPost, fused into the partial kernel (hc_post_mix only).
struct MhcPost {
    const float* mix;  // [rows, 24]: post then comb of the previous mixer
    const u16* f_bf16;
    const float* ys;
    const float* ysh;
    u16* xo;  // [rows, 4, D]: the updated streams (X is only read: other blocks still read its old values)
    int topk, mode;  // see mhc_post_f
};

// The fused HCPost of one lane: stream j, columns cc..cc+3 of `row`, into xv (and to xo unless null). Every
// load is issued before its first use (vector loads, the expert sum unrolled), so the lane waits about one
// memory latency; the values equal mhc_post_f / mhc_post_value per column (same sums in the same order).
__device__ __forceinline__ void mhc_post4(const u16* __restrict__ X, const MhcPost& post, int row, int D, int j,
                                          int cc, u16* xo, float* xv) {
    const u64 nd = (u64)MHC_N * D;
    float old[MHC_N][4];
#pragma unroll
    for (int i = 0; i < MHC_N; ++i) mhc_load4(X + row * nd + (u64)i * D + cc, old[i]);
    const float* mo = post.mix + (u64)row * MHC_MIX;
    float fv[4];
    if (post.mode == 0) {
        mhc_load4(post.f_bf16 + (u64)row * D + cc, fv);
    } else {
        const float* yr = post.ys + (u64)row * post.topk * D + cc;
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
        // Up to 8 experts' loads in flight at once, then the adds in k order (a plain loop waited a memory
        // latency per expert: load, add, branch).
        for (int k0 = 0; k0 < post.topk; k0 += 8) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u)
                if (k0 + u < post.topk) v[u] = *(const float4*)(yr + (u64)(k0 + u) * D);
#pragma unroll
            for (int u = 0; u < 8; ++u)
                if (k0 + u < post.topk) {
                    sum.x += v[u].x;
                    sum.y += v[u].y;
                    sum.z += v[u].z;
                    sum.w += v[u].w;
                }
        }
        const float4 h = *(const float4*)(post.ysh + (u64)row * D + cc);
        fv[0] = bf16_to_f32(f32_to_bf16(sum.x + h.x));
        fv[1] = bf16_to_f32(f32_to_bf16(sum.y + h.y));
        fv[2] = bf16_to_f32(f32_to_bf16(sum.z + h.z));
        fv[3] = bf16_to_f32(f32_to_bf16(sum.w + h.w));
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const float o[MHC_N] = {old[0][q], old[1][q], old[2][q], old[3][q]};
        xv[q] = bf16_to_f32(f32_to_bf16(mhc_post_value(mo, j, fv[q], o)));
    }
    if (xo) {
        uint2 v;
        v.x = (u32)f32_to_bf16(xv[0]) | ((u32)f32_to_bf16(xv[1]) << 16);
        v.y = (u32)f32_to_bf16(xv[2]) | ((u32)f32_to_bf16(xv[3]) << 16);
        *(uint2*)xo = v;
    }
}

// The lane's 8 bytes (4 bf16) of `row` (zeros past the rows or the columns), through the read-only path and
// pinned in program order (asm volatile), so that a prefetch is issued where it is written.
__device__ __forceinline__ uint2 mhc_row_load(const u16* __restrict__ X, bool valid, int row, int rows, int nd,
                                              int c) {
    uint2 v = make_uint2(0u, 0u);
    if (valid && row < rows)
        asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];"
                     : "=r"(v.x), "=r"(v.y)
                     : "l"(X + (u64)row * nd + c));
    return v;
}


// A lane's 4-column dot with fn and its sum of squares, the multiply-adds spelled out (fma(f.x, x0, f.y x1), then
// x2, x3; the squares fma(x1, x1, x0 x0), then x2, x3: what nvcc made of the plain expressions in the 8+-row
// instances, so those bits stayed as they were). Every mix split (MG) and hc_mix_tile24 (mhc_wide.cu) uses them,
// so a row gets the same bits whatever the batch (the MG > 1 instances used to contract the squares the other way
// round).
__device__ __forceinline__ float mhc_dot4(float4 f, const float* x) {
    return __fmaf_rn(f.w, x[3], __fmaf_rn(f.z, x[2], __fmaf_rn(f.x, x[0], __fmul_rn(f.y, x[1]))));
}
__device__ __forceinline__ float mhc_sq4(const float* x) {
    return __fmaf_rn(x[3], x[3], __fmaf_rn(x[2], x[2], __fmaf_rn(x[1], x[1], __fmul_rn(x[0], x[0]))));
}

// The row's sums at the lane's 4 values: its I mixes' dots (the one past M: the sum of squares), reduced
// over the warp and stored to out[mg + MG i] (<= M). The I warp sums share their shuffles (warp_sums_scatter:
// warp_sum's bits, 31 shuffles instead of 125 at I = 25) and land one per lane, so the stores are one coalesced
// instruction instead of 25 by lane 0.
template <int M, int MG, int I>
__device__ __forceinline__ void mhc_row_sums(const float4 (&f)[I], const float (&xv)[4], int mg, int lane,
                                             float* out) {
    float acc[I];
#pragma unroll
    for (int i = 0; i < I; ++i) acc[i] = mg + MG * i == M ? mhc_sq4(xv) : mhc_dot4(f[i], xv);
    const float r = warp_sums_scatter<I>(acc);
    const int i = warp_sums_index<I>(lane);
    if (warp_sums_leader<I>(lane) && i < I && mg + MG * i <= M) out[mg + MG * i] = r;
}

// Partial mixer dots of one 128-column chunk of the flat stream vector (lane: 4 columns, float4 loads of fn).
// The 8 warps are split into RG = 8 / MG row groups x MG mix groups: warp (rg, mg) dots rows rg, rg + RG, ...
// with mixes mg, mg + MG, ... (index M = the row's sum of squares), so at batch 1 (MG = 8) each warp holds and
// reduces 3-4 mixes instead of one warp doing all 25 while the rest idle. MG is a template argument (the
// launcher picks it from the row count): with a run-time split the mix indices, the select and a break before
// every warp_sum stayed in the loop, which serialised the 25 shuffle reductions of a row (batch 64: 1.32 ->
// 1.85 ms per step per mixer; 8K-row prefill 59 -> 146 ms). Every warp reduces all of its I slots (the few
// past M sum zeros) so the reductions have no branches between them; only the store is guarded. Each stored
// value is the same per-lane expression and the same warp_sum whatever MG, so every split gives the same bits.
// POST: the lane first forms its 4 values as the previous mixer's HCPost from the old values of all 4 streams
// at its columns (8-byte loads from X) and stores them to post.xo (mix group 0); the dots then see exactly
// the values an unfused HCPost would have left in X, in the same chunks and order: the same bits. The body
// runs pdl_wait itself, after loading fn.
template <int M, int MG, bool POST>
__device__ __forceinline__ void mhc_mix_partial_body(const u16* __restrict__ X, const float* __restrict__ fn,
                                                     float* __restrict__ ws, int rows, int D, const MhcPost post) {
    constexpr int RG = 8 / MG, I = (M + MG) / MG;  // I = ceil((M + 1) / MG) mixes per warp
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rg = MG == 1 ? warp : warp % RG, mg = MG == 1 ? 0 : warp / RG;
    const int nd = MHC_N * D, c = blockIdx.x * MHC_CHUNK + lane * 4;
    const bool valid = c < nd;  // nd % 4 == 0: a lane's 4 columns are all in or all out
    const int j = c / D, cc = c - j * D;  // stream and column of D (D % 4 == 0: all 4 in one stream)
    float4 f[I];
#pragma unroll
    for (int i = 0; i < I; ++i) f[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    // fn is a weight (no earlier kernel writes it): its loads are issued before the wait, overlapping the
    // previous kernel's tail. asm volatile loads (ldg_stream) inside a branch: the compiler sinks plain loads
    // past the wait, and ptxas hoists the wait above straight-line (predicated) loads.
    if (valid) {
#pragma unroll
        for (int i = 0; i < I; ++i) {
            const int m = mg + MG * i;
            if (m < M) {
                const uint4 v = ldg_stream(fn + (u64)m * nd + c);
                f[i] = make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z),
                                   __uint_as_float(v.w));
            }
        }
    }
    pdl_wait();
    if constexpr (!POST) {
        // Rows PF ahead are in flight while a row is reduced (a prefill call's warps walk ~1000 rows each).
        constexpr int PF = 4;
        uint2 nx[PF];
#pragma unroll
        for (int u = 0; u < PF; ++u) nx[u] = mhc_row_load(X, valid, rg + u * RG, rows, nd, c);
        for (int row0 = rg; row0 < rows; row0 += PF * RG) {
#pragma unroll
            for (int u = 0; u < PF; ++u) {
                const int row = row0 + u * RG;
                if (row >= rows) break;  // warp-uniform: rg is the warp's
                const uint2 cur = nx[u];
                nx[u] = mhc_row_load(X, valid, row + PF * RG, rows, nd, c);
                float xv[4];
                mhc_unpack4(cur, xv);
                mhc_row_sums<M, MG, I>(f, xv, mg, lane, ws + ((u64)blockIdx.x * rows + row) * (M + 1));
            }
        }
    } else {
        for (int row = rg; row < rows; row += RG) {
            float xv[4] = {0.f, 0.f, 0.f, 0.f};
            if (valid) mhc_post4(X, post, row, D, j, cc, mg == 0 ? post.xo + (u64)row * nd + c : nullptr, xv);
            mhc_row_sums<M, MG, I>(f, xv, mg, lane, ws + ((u64)blockIdx.x * rows + row) * (M + 1));
        }
    }
}


// hc_mix_partial{M}_mg{MG}: M = 24 (block mixers) or 4 (HC head); MG = 1 (8+ rows), 2 (4-7), 4 (2-3), 8 (1).
// hc_post_mix{M}_mg{MG}: the same after the previous mixer's HCPost (X read, the result in post.xo).
#define MHC_PARTIAL_KERNEL(M, MG)                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                      \
        hc_mix_partial##M##_mg##MG(const u16* X, const float* fn, float* ws, int rows, int D, MhcPost post) { \
        mhc_mix_partial_body<M, MG, false>(X, fn, ws, rows, D, post);                                      \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                      \
        hc_post_mix##M##_mg##MG(const u16* X, const float* fn, float* ws, int rows, int D, MhcPost post) { \
        mhc_mix_partial_body<M, MG, true>(X, fn, ws, rows, D, post);                                       \
    }
MHC_PARTIAL_KERNEL(24, 1)
MHC_PARTIAL_KERNEL(24, 2)
MHC_PARTIAL_KERNEL(24, 4)
MHC_PARTIAL_KERNEL(24, 8)
MHC_PARTIAL_KERNEL(4, 1)
MHC_PARTIAL_KERNEL(4, 2)
MHC_PARTIAL_KERNEL(4, 4)
MHC_PARTIAL_KERNEL(4, 8)
#undef MHC_PARTIAL_KERNEL

__device__ __forceinline__ float mhc_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// Sum of the 4 lanes l ^ {0, m1, m2, m1 ^ m2} as the two-step butterfly adds them, (p_l + p_l^m1) +
// (p_l^m2 + p_l^m1^m2) (the same bits), with its three shuffles issued together instead of two in series.
__device__ __forceinline__ float mhc_sum4(float p, int m1, int m2) {
    const float a = __shfl_xor_sync(0xffffffffu, p, m1), b = __shfl_xor_sync(0xffffffffu, p, m2),
                c = __shfl_xor_sync(0xffffffffu, p, m1 ^ m2);
    return (p + a) + (b + c);
}

// Sinkhorn of a 4x4 matrix held one element per lane (lanes 0..15: i = lane / 4, k = lane % 4; lanes 16..31
// run the same code on zeros). Same operations as the CPU reference; sums are pairwise (mhc_sum4). The loop is
// a latency chain (20 iterations of two sums and two divisions) that ends hc_finish at batch 1. The loop is not
// unrolled: unrolled (nvcc made 8 copies of the trip, ~300 instructions) it ran no faster, as each trip waits on
// the last, and a batch-1 launch fetches each distinct instruction once (BENCH_NOTES, trim2). Same operations.
__device__ float mhc_sinkhorn_lane(float p, float eps, int iters) {
    const float a = __shfl_xor_sync(0xffffffffu, p, 1), b = __shfl_xor_sync(0xffffffffu, p, 2),
                c = __shfl_xor_sync(0xffffffffu, p, 3);
    const float mx = fmaxf(fmaxf(p, a), fmaxf(b, c));
    const float e = expf(p - mx);
    p = e / mhc_sum4(e, 1, 2) + eps;
#pragma unroll 1
    for (int it = 0; it < iters; ++it) {
        if (it > 0) p = p / (mhc_sum4(p, 1, 2) + eps);
        p = p / (mhc_sum4(p, 4, 8) + eps);
    }
    return p;
}

// HCPost in place on X (f: see mhc_post_f). Unfused form, for the callers whose HCPost has no following HCPre
// on the same streams (split runner's tensor mode).
extern "C" __global__ void __launch_bounds__(256) hc_post(u16* __restrict__ X, const float* __restrict__ mix,
                                                          const u16* __restrict__ f_bf16,
                                                          const float* __restrict__ ys,
                                                          const float* __restrict__ ysh, int D, int topk,
                                                          int mode) {
    pdl_wait();
    const int row = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= D) return;
    const float* mo = mix + (u64)row * MHC_MIX;
    const float f = mhc_post_f(f_bf16, ys, ysh, row, c, D, topk, mode);
    u16* xr = X + (u64)row * MHC_N * D + c;
    float old[MHC_N];
#pragma unroll
    for (int i = 0; i < MHC_N; ++i) old[i] = bf16_to_f32(xr[(u64)i * D]);
#pragma unroll
    for (int k = 0; k < MHC_N; ++k) xr[(u64)k * D] = f32_to_bf16(mhc_post_value(mo, k, f, old));
}
