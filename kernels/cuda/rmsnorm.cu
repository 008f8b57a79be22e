// RMSNorm with weight (spec 2.0): y = bf16( w * (x * (mean(x^2) + eps)^-1/2) ), fp32 internals.
//
// Layout:  x bf16 [rows, D], w f32 [D], y bf16 [rows, D] (y may alias x: each element is read before the
//          block writes it, and only by the block that writes it).
// Launch:  grid rows, block 256. 16-byte loads when D % 8 == 0 (the 4096-wide rows), scalar otherwise.
// Numerics: sum of squares in f32 (tree order, deterministic), 1/sqrtf (IEEE, not rsqrtf's approximation)
//          so the result matches a plain f32 CPU loop to within summation-order rounding.
// Constraints: any D >= 1.
#include "common.cuh"

__device__ __forceinline__ float block_sum_256(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float r = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) r += sh[i];
    return r;
}

extern "C" __global__ void __launch_bounds__(256) rmsnorm_bf16(const u16* x,
                                                               const float* __restrict__ w,
                                                               u16* y, int D, float eps) {
    pdl_wait();
    __shared__ float sh[8];
    const u16* xr = x + (u64)blockIdx.x * D;
    u16* yr = y + (u64)blockIdx.x * D;
    const bool vec = (D & 7) == 0;
    float ss = 0.f;
    if (vec) {
        for (int i = threadIdx.x * 8; i < D; i += 256 * 8) {
            const uint4 v = *(const uint4*)(xr + i);
            const u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float a = bf16_to_f32((u16)(p[j] & 0xffffu)), b = bf16_to_f32((u16)(p[j] >> 16));
                ss += a * a + b * b;
            }
        }
    } else {
        for (int i = threadIdx.x; i < D; i += 256) {
            const float a = bf16_to_f32(xr[i]);
            ss += a * a;
        }
    }
    const float inv = 1.0f / sqrtf(block_sum_256(ss, sh) / (float)D + eps);
    if (vec) {
        for (int i = threadIdx.x * 8; i < D; i += 256 * 8) {
            const uint4 v = *(const uint4*)(xr + i);
            const u32 p[4] = {v.x, v.y, v.z, v.w};
            u32 o[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float a = bf16_to_f32((u16)(p[j] & 0xffffu)), b = bf16_to_f32((u16)(p[j] >> 16));
                const u32 ra = f32_to_bf16(w[i + 2 * j] * (a * inv));
                const u32 rb = f32_to_bf16(w[i + 2 * j + 1] * (b * inv));
                o[j] = ra | (rb << 16);
            }
            *(uint4*)(yr + i) = make_uint4(o[0], o[1], o[2], o[3]);
        }
    } else {
        for (int i = threadIdx.x; i < D; i += 256) yr[i] = f32_to_bf16(w[i] * (bf16_to_f32(xr[i]) * inv));
    }
}
