// Small attention helpers: a bf16-weight GEMV, a fill, and device-side synthetic weights.
//
// attn_bf16_gemv: y[b, n] = sum_k x[b, k] * W[n, k], x bf16 [B, K], W bf16 [N, K] (the compressor wkv/wgate
//   and indexer weights_proj, stacked into one matrix at load time), y f32 [B, N]; f32 accumulation.
//   Launch: grid ceil(N / 8), block 256: one warp per output row, lanes over K in 16-byte chunks, batch
//   tiles of 8 (the weight row is re-read per tile, from L1/L2). K % 8 == 0. Variants tried: none yet
//   (next: tensor cores as in fp8_gemv; this matrix is 8-16 MB at the real dims).
// attn_fill_f32: p[i] = value for i < n (compressor score states reset to -inf).
// attn_synth: n elements of pseudo-random weights from (seed, index) with a 64-bit mix: kind 0 e4m3 bytes of
//   moderate magnitude (exponent field 4..9: |v| in [2^-3, 2^3), never NaN), 1 constant byte (UE8M0 scales,
//   byte = amp), 2 bf16 uniform in [-amp, amp), 3 f32 constant amp, 4 f32 uniform in [-amp, amp).
//   Launch: grid ceil(n / 256) (capped, grid-stride), block 256.
#include "common.cuh"

struct AttnBf16Gemv {
    const u16* x;
    const u16* w;
    float* y;
    int B, N, K, pad;
};

extern "C" __global__ void __launch_bounds__(256) attn_bf16_gemv(AttnBf16Gemv p) {
    const int lane = threadIdx.x & 31, n = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n >= p.N) return;
    const u16* wr = p.w + (u64)n * p.K;
    for (int b0 = 0; b0 < p.B; b0 += 8) {
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = 0.f;
        for (int k = lane * 8; k < p.K; k += 256) {
            const uint4 wv = ldg_stream(wr + k);
            const u32 W[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                if (b0 + j >= p.B) break;
                const uint4 xv = ldg_keep(p.x + (u64)(b0 + j) * p.K + k);
                const u32 X[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[j] += bf16_to_f32((u16)(W[e] & 0xffffu)) * bf16_to_f32((u16)(X[e] & 0xffffu));
                    acc[j] += bf16_to_f32((u16)(W[e] >> 16)) * bf16_to_f32((u16)(X[e] >> 16));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float v = warp_sum(acc[j]);
            if (lane == 0 && b0 + j < p.B) p.y[(u64)(b0 + j) * p.N + n] = v;
        }
    }
}

extern "C" __global__ void attn_fill_f32(float* p, u64 n, float value) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) p[i] = value;
}

__device__ __forceinline__ u64 attn_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

extern "C" __global__ void attn_synth(void* p, u64 n, int kind, u64 seed, float amp) {
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
