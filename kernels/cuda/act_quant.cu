// Activation FP8 quantisation (spec 2.0 Q8 and 5 act_quant), bit-exact with the CPU reference.
//
// Math:    per block of G values along a row: amax = max(max|x|, 1e-4); s = 2^ceil(log2(amax / 448)) (UE8M0:
//          exponent of amax/448 plus one when its mantissa is non-zero); q = e4m3_rne(clamp(x / s, +-448)).
// Outputs (each optional, null = skip): q u8 e4m3 [rows, D]; scales f32 [rows, D/G]; deq bf16 [rows, D] =
//          bf16(e4m3(q) * s), the in-place "fake quant" of the QAT simulation (deq may alias x).
// Launch:  grid ceil(rows*D/G / 8), block 256: one warp per block of G values, G/32 values per lane.
// Constraints: G % 32 == 0, G <= 256, D % G == 0. The e4m3 cast is the hardware cvt.rn.satfinite (sm_89+).
#include "common.cuh"

__device__ __forceinline__ u32 f32_to_e4m3(float v) {
    u32 d;
    asm("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %1, %1; cvt.u32.u16 %0, t; }" : "=r"(d) : "f"(v));
    return d & 0xffu;
}

// e4m3 code -> f32, exact (normal: (8+m) * 2^(e-10); subnormal: m * 2^-9).
__device__ __forceinline__ float e4m3_to_f32(u32 c) {
    const u32 e = (c >> 3) & 15u, m = c & 7u;
    const float mag = e == 0 ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (c & 0x80u) ? -mag : mag;
}

extern "C" __global__ void __launch_bounds__(256) act_quant_bf16(const u16* x, int nblocks, int G, u8* q,
                                                                 float* scales, u16* deq) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int blk = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (blk >= nblocks) return;
    const u16* xb = x + (u64)blk * G;
    const int per = G >> 5;
    float v[8];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[i] = i < per ? bf16_to_f32(xb[i * 32 + lane]) : 0.f;
        amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = fmaxf(warp_max(amax), 1e-4f);
    const u32 rb = __float_as_uint(amax / 448.0f);
    const u32 se = ((rb >> 23) & 0xffu) + ((rb & 0x7fffffu) != 0u ? 1u : 0u);
    const float s = __uint_as_float(se << 23);
    if (scales && lane == 0) scales[blk] = s;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (i >= per) break;
        const float c = fminf(fmaxf(v[i] / s, -448.f), 448.f);
        const u32 code = f32_to_e4m3(c);
        const u64 idx = (u64)blk * G + i * 32 + lane;
        if (q) q[idx] = (u8)code;
        if (deq) deq[idx] = f32_to_bf16(e4m3_to_f32(code) * s);
    }
}
