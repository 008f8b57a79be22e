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
// Launch:  hc_mix_partial{24,4}: grid (ceil(4D/256), ceil(rows/8)), block 256. The block stages a 256-column
//          slice of fn in shared memory (24 KB) once and each warp dots it with one row (lane: columns
//          4l..4l+3 and 128+4l..+3, so float4 shared reads are conflict-free); many blocks share the 1.5 MB
//          fn read, which a one-block-per-row kernel would do at a single SM's bandwidth.
//          hc_finish{24,4}: grid rows, block 256: sums the partials in chunk order (deterministic), runs the
//          4x4 Sinkhorn in one thread (it is 20 x 32 flops), collapses, then norms in the same block.
//          hc_post: grid (rows, ceil(D/256)), block 256; in place (each thread reads its 4 stream values
//          before writing them). Mode 1 forms f = bf16(sum_k y_routed[k] + y_shared) from the MoE's f32
//          partial outputs, fusing the MoE sum into the residual update.
//          embed_streams: grid rows, block 256, 16-byte copies.
// Variants: a single fused pre kernel (one block per row) was rejected on paper: at batch 1 it reads fn
//          at one SM's bandwidth (~15 us per mixer at D = 4096).
// Constraints: n = 4 (checked on the host), D % 8 == 0.
#include "common.cuh"

#define MHC_N 4
#define MHC_CHUNK 256
#define MHC_MIX 24

extern "C" __global__ void __launch_bounds__(256) embed_streams(const i32* __restrict__ ids,
                                                                const u16* __restrict__ table,
                                                                u16* __restrict__ X, int D) {
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
__device__ __forceinline__ void mhc_load4(const u16* p, float* f) {
    const uint2 v = *(const uint2*)p;
    f[0] = bf16_to_f32((u16)(v.x & 0xffffu));
    f[1] = bf16_to_f32((u16)(v.x >> 16));
    f[2] = bf16_to_f32((u16)(v.y & 0xffffu));
    f[3] = bf16_to_f32((u16)(v.y >> 16));
}

template <int M>
__device__ __forceinline__ void mhc_mix_partial_body(const u16* __restrict__ X, const float* __restrict__ fn,
                                                     float* __restrict__ ws, int rows, int nd) {
    __shared__ __align__(16) float fs[M * MHC_CHUNK];
    const int c0 = blockIdx.x * MHC_CHUNK;
    for (int i = threadIdx.x; i < M * MHC_CHUNK; i += blockDim.x) {
        const int m = i / MHC_CHUNK, c = c0 + i % MHC_CHUNK;
        fs[i] = c < nd ? fn[(u64)m * nd + c] : 0.f;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.y * 8 + warp;
    if (row >= rows) return;
    float acc[M + 1];
#pragma unroll
    for (int m = 0; m <= M; ++m) acc[m] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int lc = h * 128 + lane * 4;
        if (c0 + lc >= nd) continue;  // nd % 8 == 0 and nd % 4 == 0: a 4-group is all in or all out
        float xv[4];
        mhc_load4(X + (u64)row * nd + c0 + lc, xv);
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[M] += xv[q] * xv[q];
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const float4 f = *(const float4*)&fs[m * MHC_CHUNK + lc];
            acc[m] += f.x * xv[0] + f.y * xv[1] + f.z * xv[2] + f.w * xv[3];
        }
    }
#pragma unroll
    for (int m = 0; m <= M; ++m) acc[m] = warp_sum(acc[m]);
    if (lane == 0) {
        float* out = ws + ((u64)blockIdx.x * rows + row) * (M + 1);
#pragma unroll
        for (int m = 0; m <= M; ++m) out[m] = acc[m];
    }
}

extern "C" __global__ void __launch_bounds__(256) hc_mix_partial24(const u16* X, const float* fn, float* ws,
                                                                   int rows, int nd) {
    mhc_mix_partial_body<24>(X, fn, ws, rows, nd);
}
extern "C" __global__ void __launch_bounds__(256) hc_mix_partial4(const u16* X, const float* fn, float* ws,
                                                                  int rows, int nd) {
    mhc_mix_partial_body<4>(X, fn, ws, rows, nd);
}

__device__ __forceinline__ float mhc_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// Sinkhorn of the 4x4 logits in place (spec 2.3), same operation order as the CPU reference.
__device__ void mhc_sinkhorn(float* p, float eps, int iters) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float mx = p[i * 4];
        for (int k = 1; k < 4; ++k) mx = fmaxf(mx, p[i * 4 + k]);
        float e[4], sum = 0.f;
        for (int k = 0; k < 4; ++k) {
            e[k] = expf(p[i * 4 + k] - mx);
            sum += e[k];
        }
        for (int k = 0; k < 4; ++k) p[i * 4 + k] = e[k] / sum + eps;
    }
    for (int it = 0; it < iters; ++it) {
        if (it > 0) {
            for (int i = 0; i < 4; ++i) {
                const float s = p[i * 4] + p[i * 4 + 1] + p[i * 4 + 2] + p[i * 4 + 3] + eps;
                for (int k = 0; k < 4; ++k) p[i * 4 + k] /= s;
            }
        }
        for (int k = 0; k < 4; ++k) {
            const float s = p[k] + p[4 + k] + p[8 + k] + p[12 + k] + eps;
            for (int i = 0; i < 4; ++i) p[i * 4 + k] /= s;
        }
    }
}

__device__ __forceinline__ float mhc_block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // sh may still be read from a previous use
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float r = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) r += sh[i];
    return r;
}

// Mixer coefficients of one row from the partials: pre (shared), post and comb (to `mix`, M == 24 only).
template <int M>
__device__ void mhc_coefficients(const float* ws, int chunks, int rows, int row, int nd, const float* scale,
                                 const float* base, float eps, float hc_eps, int iters, float* mix,
                                 float* sred, float* pre) {
    if (threadIdx.x <= M) {
        float s = 0.f;
        for (int ch = 0; ch < chunks; ++ch) s += ws[((u64)ch * rows + row) * (M + 1) + threadIdx.x];
        sred[threadIdx.x] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const float rho = 1.f / sqrtf(sred[M] / (float)nd + eps);
        for (int j = 0; j < MHC_N; ++j) pre[j] = mhc_sigmoid(sred[j] * rho * scale[0] + base[j]) + hc_eps;
        if (M == MHC_MIX) {
            float* mo = mix + (u64)row * MHC_MIX;
            for (int j = 0; j < MHC_N; ++j)
                mo[j] = 2.f * mhc_sigmoid(sred[4 + j] * rho * scale[1] + base[4 + j]);
            float p[16];
            for (int ik = 0; ik < 16; ++ik) p[ik] = sred[8 + ik] * rho * scale[2] + base[8 + ik];
            mhc_sinkhorn(p, hc_eps, iters);
            for (int ik = 0; ik < 16; ++ik) mo[4 + ik] = p[ik];
        }
    }
    __syncthreads();
}

template <int M>
__device__ void mhc_finish_body(const u16* __restrict__ X, const float* __restrict__ ws, int chunks, int rows,
                                int D, const float* scale, const float* base, const float* __restrict__ norm_w,
                                float eps, float hc_eps, int iters, float* mix, u16* __restrict__ y) {
    __shared__ float sred[M + 1];
    __shared__ float pre[MHC_N];
    __shared__ float sh[8];
    const int row = blockIdx.x;
    mhc_coefficients<M>(ws, chunks, rows, row, MHC_N * D, scale, base, eps, hc_eps, iters, mix, sred, pre);
    const u16* xr = X + (u64)row * MHC_N * D;
    u16* yr = y + (u64)row * D;
    float ss = 0.f;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float a = 0.f;
#pragma unroll
        for (int j = 0; j < MHC_N; ++j) a += pre[j] * bf16_to_f32(xr[j * D + c]);
        const u16 ab = f32_to_bf16(a);
        const float af = bf16_to_f32(ab);
        ss += af * af;
        yr[c] = ab;  // the collapsed input, normalised in place below by the same thread
    }
    const float inv = 1.f / sqrtf(mhc_block_sum(ss, sh) / (float)D + eps);
    for (int c = threadIdx.x; c < D; c += blockDim.x) yr[c] = f32_to_bf16(norm_w[c] * (bf16_to_f32(yr[c]) * inv));
}

extern "C" __global__ void __launch_bounds__(256) hc_finish24(const u16* X, const float* ws, int chunks, int rows,
                                                              int D, const float* scale, const float* base,
                                                              const float* norm_w, float eps, float hc_eps,
                                                              int iters, float* mix, u16* y) {
    mhc_finish_body<24>(X, ws, chunks, rows, D, scale, base, norm_w, eps, hc_eps, iters, mix, y);
}
extern "C" __global__ void __launch_bounds__(256) hc_finish4(const u16* X, const float* ws, int chunks, int rows,
                                                             int D, const float* scale, const float* base,
                                                             const float* norm_w, float eps, float hc_eps,
                                                             int iters, float* mix, u16* y) {
    mhc_finish_body<4>(X, ws, chunks, rows, D, scale, base, norm_w, eps, hc_eps, iters, mix, y);
}

// HCPost in place on X. mode 0: f = f_bf16[row]; mode 1: f = bf16(sum_k ys[row*topk+k] + ysh[row]).
extern "C" __global__ void __launch_bounds__(256) hc_post(u16* __restrict__ X, const float* __restrict__ mix,
                                                          const u16* __restrict__ f_bf16,
                                                          const float* __restrict__ ys,
                                                          const float* __restrict__ ysh, int D, int topk,
                                                          int mode) {
    const int row = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= D) return;
    const float* mo = mix + (u64)row * MHC_MIX;
    float f;
    if (mode == 0) {
        f = bf16_to_f32(f_bf16[(u64)row * D + c]);
    } else {
        float s = 0.f;
        for (int k = 0; k < topk; ++k) s += ys[((u64)row * topk + k) * D + c];
        f = bf16_to_f32(f32_to_bf16(s + ysh[(u64)row * D + c]));
    }
    u16* xr = X + (u64)row * MHC_N * D + c;
    float old[MHC_N];
#pragma unroll
    for (int i = 0; i < MHC_N; ++i) old[i] = bf16_to_f32(xr[(u64)i * D]);
#pragma unroll
    for (int k = 0; k < MHC_N; ++k) {
        float acc = mo[k] * f;
#pragma unroll
        for (int i = 0; i < MHC_N; ++i) acc += mo[4 + i * 4 + k] * old[i];
        xr[(u64)k * D] = f32_to_bf16(acc);
    }
}
