// Shared device helpers of the attention kernels (attn_*.cu). The build concatenates the .cu files in name
// order, so this file (attn_common) precedes every other attn_* file that uses these helpers.
//
// Number formats (spec 2.0, bit-exact with engine/src/reference/quant.rs on identical f32 inputs):
//   Q8: blocks along a vector, scale 2^ceil(log2(max(amax, 1e-4) / 448)), e4m3 round-to-nearest-even.
//   Q4: blocks of 32, scale 2^ceil(log2(max(amax, 6 * 2^-126) / 6)), e2m1 round-to-nearest-even.
//   Both are done in software (no cvt.e2m1 on sm_90) from the exponent bits: exact.
// RoPE: interleaved pairs on the last `rdim` channels; angle pos * f evaluated in double like the CPU
//   reference (an f32 angle loses ~0.06 rad at position 1e6).
#include "common.cuh"

// Quantisation modes of a finished vector.
#define ATTN_QUANT_NONE 0
#define ATTN_QUANT_Q8_NOPE 1   // Q8 (blocks of 64) on channels [0, dim - rdim): window rows, compressed entries
#define ATTN_QUANT_HAD_Q4 2    // Walsh-Hadamard over all channels, then Q4 (blocks of 32): indexer q and keys

// ldexpf(1.0f, e) for every int e, from the bits: 2^e in the normal range, the subnormal 2^e for -149 <= e < -126,
// +inf above (overflow) and 0 below (2^-150 is a tie to the even 0): the same values, exactly, without ldexpf's
// long library sequence (v2 kept it for outside the normal range: ~40 instructions inlined at every call site).
// Decode launches are short single passes, so their time follows the instructions they walk.
__device__ __forceinline__ float attn_pow2(int e) {
    if (e >= -126) return e <= 127 ? __uint_as_float((u32)(e + 127) << 23) : __uint_as_float(0x7f800000u);
    return e >= -149 ? __uint_as_float(1u << (e + 149)) : 0.f;
}

// 1 / s for s = 2^k (normal) or +inf, from the bits: 2^-k (2^-127, for s = 2^127, is subnormal; 1 / inf = 0).
// The reciprocal is exact, so this is the IEEE division's value without its instruction sequence. Also fq_block's
// (mhc_finish.cu, later in the sorted translation unit) reciprocal of its block scale.
__device__ __forceinline__ float attn_inv_pow2(float s) {
    const u32 se = __float_as_uint(s) >> 23;
    return se <= 253u ? __uint_as_float((254u - se) << 23) : se == 254u ? __uint_as_float(0x00400000u) : 0.f;
}

// 2^ceil(log2(v)) for positive normal v, from the bits (exponent, plus one if any mantissa bit is set).
__device__ __forceinline__ float attn_pow2_ceil(float v) {
    const u32 b = __float_as_uint(v);
    return attn_pow2((int)((b >> 23) & 255u) - 127 + ((b & 0x7fffffu) != 0u ? 1 : 0));
}

// Round |x| <= max to a float format with `mant` mantissa bits and minimum normal exponent `min_exp`, RNE:
// rint(x / quantum) * quantum, with the division by the power of two as a product with its exact reciprocal
// (the same bits: both are one rounding of the same exact quotient; here nothing rounds at all).
__device__ __forceinline__ float attn_round_fmt(float x, int mant, int min_exp) {
    if (x == 0.f) return x;
    int e = (int)((__float_as_uint(x) >> 23) & 255u) - 127;
    e = e < min_exp ? min_exp : e;
    return rintf(x * attn_pow2(mant - e)) * attn_pow2(e - mant);
}

// One quant-dequant block of `len` values at v (shared memory), done by one warp. The loops are not unrolled:
// blocks are 32 or 64 values (1 or 2 trips), and nvcc's 4-way unrolling with its remainder put ~10 copies of the
// per-value rounding in each caller, which a batch-1 launch fetches once each.
__device__ __forceinline__ void attn_quant_block_warp(float* v, int len, int fp4) {
    const int lane = threadIdx.x & 31;
    float amax = 0.f;
#pragma unroll 1
    for (int i = lane; i < len; i += 32) amax = fmaxf(amax, fabsf(v[i]));
    amax = warp_max(amax);
    const float maxv = fp4 ? 6.0f : 448.0f;
    const float floorv = fp4 ? 6.0f * 1.17549435e-38f : 1e-4f;
    // x / s as x * (1 / s): s is a power of two, so 1 / s is exact and the product is the quotient's rounding.
    const float s = attn_pow2_ceil(fmaxf(amax, floorv) / maxv), inv_s = attn_inv_pow2(s);
    // One inlined attn_round_fmt with the format's parameters as values (two copies when selected by fp4).
    const int mant = fp4 ? 1 : 3, min_exp = fp4 ? 0 : -6;
#pragma unroll 1
    for (int i = lane; i < len; i += 32) {
        const float c = fminf(fmaxf(v[i] * inv_s, -maxv), maxv);
        v[i] = attn_round_fmt(c, mant, min_exp) * s;
    }
}

// Fake quantisation of v[0, n) (shared memory) in blocks of `blk` (a trailing partial block is one shorter
// block, as in the CPU reference). Warps take blocks round-robin. Caller syncs before and after.
__device__ __forceinline__ void attn_fake_quant_smem(float* v, int n, int blk, int fp4) {
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int b = warp; b * blk < n; b += nw) {
        const int len = min(blk, n - b * blk);
        attn_quant_block_warp(v + b * blk, len, fp4);
    }
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); `red` holds 33 floats. Every thread gets it.
__device__ __forceinline__ float attn_block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float r = lane < nw ? red[lane] : 0.f;
        r = warp_sum(r);
        if (lane == 0) red[32] = r;
    }
    __syncthreads();
    return red[32];
}

// RMS normalisation of v[0, n) in place: v * (mean(v^2) + eps)^-1/2 (* w when w != null).
__device__ __forceinline__ void attn_rms_smem(float* v, int n, const float* w, float eps, float* red) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += v[i] * v[i];
    const float inv = 1.0f / sqrtf(attn_block_sum(ss, red) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = w ? w[i] * (v[i] * inv) : v[i] * inv;
    __syncthreads();
}

// sin and cos of the RoPE angle pos * freq, in double precision (the reference's), rounded to f32; inverse: the
// sine of the negated angle (rotate back). Every decode RoPE takes its angles here.
__device__ __forceinline__ void attn_rope_angle(long long pos, float freq, int inverse, float& sn, float& cs) {
    const double theta = (double)pos * (double)freq;
    sn = (float)sin(inverse ? -theta : theta);
    cs = (float)cos(theta);
}

// RoPE of the last rdim channels of v[0, dim) to position pos (inverse: rotate back). Caller syncs after.
__device__ __forceinline__ void attn_rope_smem(float* v, int dim, int rdim, const float* freqs, long long pos,
                                               int inverse) {
    const int start = dim - rdim;
    for (int i = threadIdx.x; i < rdim / 2; i += blockDim.x) {
        float sn, cs;
        attn_rope_angle(pos, freqs[i], inverse, sn, cs);
        const float a = v[start + 2 * i], b = v[start + 2 * i + 1];
        v[start + 2 * i] = a * cs - b * sn;
        v[start + 2 * i + 1] = a * sn + b * cs;
    }
}

// Natural-order Walsh-Hadamard transform of v[0, n) scaled by n^-1/2 (n a power of two, <= 512), as the
// plain product with a sequential sum per output (the CPU reference's order: an FP4 rounding follows).
// `tmp` is n floats of scratch. Caller syncs after.
__device__ __forceinline__ void attn_hadamard_smem(float* v, float* tmp, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) tmp[i] = v[i];
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < n; ++j) acc += (__popc(i & j) & 1) ? -tmp[j] : tmp[j];
        v[i] = acc * scale;
    }
}

// The post-processing shared by window rows, compressed entries and indexer vectors: quantisation mode
// `quant` (ATTN_QUANT_*) on v[0, dim). `tmp` holds dim floats. Caller syncs before; this syncs after.
__device__ __forceinline__ void attn_quant_vec(float* v, float* tmp, int dim, int rdim, int quant) {
    if (quant == ATTN_QUANT_Q8_NOPE) {
        attn_fake_quant_smem(v, dim - rdim, 64, 0);
    } else if (quant == ATTN_QUANT_HAD_Q4) {
        attn_hadamard_smem(v, tmp, dim);
        __syncthreads();
        attn_fake_quant_smem(v, dim, 32, 1);
    }
    __syncthreads();
}
