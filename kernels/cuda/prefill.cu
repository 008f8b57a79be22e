// Device helpers of the batched-prefill kernels (prefill_*.cu; this file sorts first among them: '.' < '_').
//
// Everything here is portable sm_80+ PTX (cp.async, ldmatrix, mma.sync m16n8k16 bf16), so the same source builds
// for sm_90a and sm_120a and through NVRTC. No wgmma/TMA.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4), which the ldmatrix address helpers produce:
//   A 16x16 row-major: R0 (row g, k 2t..2t+1), R1 (row g+8, k 2t..), R2 (row g, k 2t+8..), R3 (row g+8, k 2t+8..).
//   B 16x8 "col" (stored [n][k], k contiguous): R0 (n g, k 2t..2t+1), R1 (n g, k 2t+8..).
//   C 16x8: c0,c1 (row g, cols 2t, 2t+1), c2,c3 (row g+8, cols 2t, 2t+1).
#include "common.cuh"

// 16-byte global -> shared copy bypassing L1 (common.cuh's cp_async16); !valid copies nothing and zero-fills
// the 16 bytes (src must still be a valid address: callers pass a base pointer then).
__device__ __forceinline__ void pf_cp16(u32 dst, const void* src, bool valid) {
    cp_async16(dst, src, valid ? 16u : 0u);
}

// A fragment (16 rows x 16 k) of a row-major bf16 tile with row stride `ld` elements, at (row0, k0).
__device__ __forceinline__ void pf_frag_a(const u16* tile, int ld, int row0, int k0, u32 (&a)[4]) {
    const int lane = threadIdx.x & 31;
    const u16* p = tile + (row0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8;
    ldsm_x4(smem_u32(p), a[0], a[1], a[2], a[3]);
}

// B fragments of two n8 tiles (n0..n0+15) x 16 k from a [n][k] tile: b[0] for n0.., b[1] for n0+8...
__device__ __forceinline__ void pf_frag_b(const u16* tile, int ld, int n0, int k0, u32 (&b0)[2], u32 (&b1)[2]) {
    const int lane = threadIdx.x & 31;
    const u16* p = tile + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8;
    ldsm_x4(smem_u32(p), b0[0], b0[1], b1[0], b1[1]);
}

// B fragments of two n8 tiles (n0..n0+15) x 16 k from a [k][n] row-major tile (transposed loads).
__device__ __forceinline__ void pf_frag_bt(const u16* tile, int ld, int k0, int n0, u32 (&b0)[2], u32 (&b1)[2]) {
    const int lane = threadIdx.x & 31;
    const u16* p = tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
    ldsm_x4_t(smem_u32(p), b0[0], b0[1], b1[0], b1[1]);
}

__device__ __forceinline__ void pf_mma(float* c, const u32 (&a)[4], const u32 (&b)[2]) {
    mma_bf16_16816(c, a[0], a[1], a[2], a[3], b[0], b[1]);
}

// bf16x2 multiplier 2^126 * 2^(e-127) of an FP4 scale byte (clamped at 128 like fp4_expert).
__device__ __forceinline__ u32 pf_fp4_scale(u32 e) {
    e = e > 128u ? 128u : e;
    const u32 f = (e + 126u) << 7;
    return f | (f << 16);
}

// Four e4m3 bytes (k, k+1, k+2, k+3) -> two bf16x2 in natural order, times the scale multiplier f: exact (the
// byte becomes a bf16 bit pattern of value * 2^-120, the power-of-two multiply restores it with the scale).
__device__ __forceinline__ void pf_e4m3x4(u32 w, u32 f, u32& lo, u32& hi) {
    const u32 p = __byte_perm(w, 0u, 0x3120);  // bytes b0 b2 b1 b3: the pairs below become (b0,b1), (b2,b3)
    lo = bf16x2_mul(((p << 8) & 0x80008000u) | ((p << 4) & 0x07f007f0u), f);
    hi = bf16x2_mul((p & 0x80008000u) | ((p >> 4) & 0x07f007f0u), f);
}

// 32 FP4 values (16 bytes in the device layout, see fp4_pairs) -> 16 bf16x2 words in natural order, times
// the scale multiplier f.
__device__ __forceinline__ void pf_fp4x32(const uint4& v, u32 f, u32 (&out)[16]) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 p[4];  // p[I] = weights (2I, 2I + 1) of word i: its natural bf16x2 words
        fp4_pairs(w[i], p);
#pragma unroll
        for (int j = 0; j < 4; ++j) out[4 * i + j] = bf16x2_mul(p[j], f);
    }
}

// 16 FP8 values -> 8 bf16x2 words in natural order.
__device__ __forceinline__ void pf_fp8x16(const uint4& v, u32 f, u32 (&out)[8]) {
    pf_e4m3x4(v.x, f, out[0], out[1]);
    pf_e4m3x4(v.y, f, out[2], out[3]);
    pf_e4m3x4(v.z, f, out[4], out[5]);
    pf_e4m3x4(v.w, f, out[6], out[7]);
}
