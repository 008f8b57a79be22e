// Small attention helpers: a fill and device-side synthetic weights. (The bf16 GEMV that lived here is
// attn_bf16_gemv_ntX in attn_gemv.cu now: tensor cores, split-K reduced in the kernel.)
//
// attn_fill_f32: p[i] = value for i < n (compressor score states reset to -inf).
// attn_synth: n elements of pseudo-random weights from (seed, index) with a 64-bit mix: kind 0 e4m3 bytes of
//   moderate magnitude (exponent field 4..9: |v| in [2^-3, 2^3), never NaN), 1 constant byte (UE8M0 scales,
//   byte = amp), 2 bf16 uniform in [-amp, amp), 3 f32 constant amp, 4 f32 uniform in [-amp, amp).
//   Launch: grid ceil(n / 256) (capped, grid-stride), block 256.
#include "common.cuh"

extern "C" __global__ void attn_fill_f32(float* p, u64 n, float value) {
    pdl_wait();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) p[i] = value;
}

__device__ __forceinline__ u64 attn_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

extern "C" __global__ void attn_synth(void* p, u64 n, int kind, u64 seed, float amp) {
    pdl_wait();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = attn_mix64(seed * 0x9e3779b97f4a7c15ull + i);
        const float u = (float)(r >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
        if (kind == 0) {
            const u32 e = 4u + (u32)((r >> 8) % 6u);
            ((u8*)p)[i] = (u8)(((r & 1u) << 7) | (e << 3) | ((r >> 4) & 7u));
        } else if (kind == 1) {
            ((u8*)p)[i] = (u8)amp;
        } else if (kind == 2) {
            ((u16*)p)[i] = f32_to_bf16(u * amp);
        } else if (kind == 3) {
            ((float*)p)[i] = amp;
        } else {
            ((float*)p)[i] = u * amp;
        }
    }
}
