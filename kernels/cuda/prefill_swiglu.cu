// The routed experts' SwiGLU of the batched prefill on the wgmma path, written straight in the K order of the w2
// GEMM: pf_swiglu_kperm = moe_swiglu (moe_route.cu) followed by pf_kperm (prefill_wgmma_fp4.cu), bit for bit, in
// one pass over g and u.
//
// Math:    h = swiglu_value(g, u, wt[slot], L, quant) (moe_route.cu: silu(min(g, L)) * clamp(u, -L, L) * wt,
//          through bf16 or, official numerics, FP8 fake-quantised with fq_block in blocks of 128 along the row,
//          a shorter last block), the same f32 operations per value as moe_swiglu; the block maximum is
//          order-free (fmaxf), so a lane holding other columns of the block than in moe_swiglu changes no bit.
// Layout:  g, u f32 [S, I] (the w1 / w3 outputs), wt f32 [S] or null (1), out bf16 [S, Kp], Kp = I rounded up to
//          128, zero past I; in each 128-wide chunk bf16 pair q = 16j + 4i + t holds h[8(4t + j) + 2i] and
//          h[8(4t + j) + 2i + 1] (pf_kperm's order, see the K-order comment of prefill_wgmma_fp4.cu).
// Launch:  grid ceil(S * Kp / 128 / (8 PFS_CHUNKS)), block 256: a warp per PFS_CHUNKS consecutive (slot, chunk)
//          pairs, lane l holds columns 4l .. 4l + 3 of a chunk (one 16-byte load each of g and u: a warp reads
//          512 contiguous bytes per load; all 2 PFS_CHUNKS loads are issued before the first use). Lanes 2p and
//          2p + 1 hold the two halves of 8-column piece p = 4t + j: the even lane pairs i = 0, 1, the odd lane
//          pairs 2, 3, each of 2 columns it holds (u32 16j + 4i + t of the chunk). The pairs go through a per-warp
//          stage in shared memory (64 words a chunk, padded by 4 words after the first 32: no bank conflicts) and
//          out as 16-byte stores, 256 contiguous bytes a chunk.
// Why:     the two launches moved ~1.4 GB per 8192-token layer (g, u in; h out, in, and out again permuted); ncu
//          (H200, 8192 tokens = 49152 slots, I = 2048, official numerics): moe_swiglu 404 us + pf_kperm 145 us
//          per layer, this kernel 350 us (1.0 GB: 2.9 TB/s; the copy rate is 4.25 TB/s). At 1024 tokens the MoE
//          glue per call (both SwiGLUs, both permutations) went 4.1 -> 2.9 ms. What holds it below the copy rate
//          is not measured yet; the count says issue: ~50 instructions a value (accurate expf, two IEEE
//          divisions, the e4m3 round trip, bf16 rounding) for 100 M values a layer (kernels/BENCH_NOTES.md).
// Constraints: I % 32 == 0 (the FP4 rule of the w2 GEMM; aligned 16-byte loads), checked on the host.
// v2 (unmeasured): fq_block's bits with the division by s as a product and the e4m3 round trip in hardware
//          (now fq_block itself, mhc_finish.cu), bf16 pairs by one conversion (pfs_bf16x2).
// Depends on warp_max (common.cuh) and swiglu_value (moe_route.cu), earlier in the sorted translation unit.
#include "common.cuh"

#define PFS_CHUNKS 4  // (slot, chunk) pairs per warp
#define PFS_WORDS 68  // stage words per chunk: 64 + 4 of padding

struct PfSwiglu {
    const float* g;
    const float* u;
    const float* wt;
    u16* out;
    int slots, inter;
    float limit;
    int quant;
};

// f32_to_bf16(a) | f32_to_bf16(b) << 16 by one hardware conversion (round to nearest even, subnormals kept), with
// f32_to_bf16's quiet NaN 0x7fc0 put back.
__device__ __forceinline__ u32 pfs_bf16x2(float a, float b) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    if (a != a) r = (r & 0xffff0000u) | 0x7fc0u;
    if (b != b) r = (r & 0x0000ffffu) | 0x7fc00000u;
    return r;
}

// Stage word of u32 q of a chunk: the second 32 words shifted by 4 banks.
__device__ __forceinline__ int pfs_word(int q) { return q + ((q >> 5) << 2); }

extern "C" __global__ void __launch_bounds__(256) pf_swiglu_kperm(PfSwiglu p) {
    pdl_wait();
    __shared__ __align__(16) u32 stage[8][PFS_CHUNKS * PFS_WORDS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kc = (p.inter + 127) >> 7;
    const u32 total = (u32)p.slots * kc;  // < 2^31 (host)
    const u32 first = (blockIdx.x * 8 + warp) * PFS_CHUNKS;
    if (first >= total) return;
    uint4 gv[PFS_CHUNKS], uv[PFS_CHUNKS];
#pragma unroll
    for (int q = 0; q < PFS_CHUNKS; ++q) {
        const u32 ch = first + q, s = ch / kc;
        const int col = (int)(ch % kc) * 128 + 4 * lane;
        gv[q] = uv[q] = make_uint4(0, 0, 0, 0);
        if (ch < total && col < p.inter) {
            gv[q] = ldg_stream(p.g + (u64)s * p.inter + col);
            uv[q] = ldg_stream(p.u + (u64)s * p.inter + col);
        }
    }
    u32* st = stage[warp];
    const int e = lane & 1, piece = lane >> 1, j = piece & 3, t = piece >> 2;
    const int qa = 16 * j + 8 * e + t;  // u32 of this lane's pair i = 2e; pair 2e + 1 is 4 further
#pragma unroll
    for (int q = 0; q < PFS_CHUNKS; ++q) {
        const u32 ch = first + q, s = ch / kc;
        if (ch >= total) break;  // warp-uniform
        const int col = (int)(ch % kc) * 128 + 4 * lane;
        const float w = p.wt ? p.wt[s] : 1.f;
        const u32 gw[4] = {gv[q].x, gv[q].y, gv[q].z, gv[q].w}, uw[4] = {uv[q].x, uv[q].y, uv[q].z, uv[q].w};
        float v[4];
#pragma unroll
        for (int c = 0; c < 4; ++c)
            v[c] = col < p.inter ? swiglu_value(__uint_as_float(gw[c]), __uint_as_float(uw[c]), w, p.limit, p.quant)
                                 : 0.f;
        if (p.quant) fq_block(v);  // the whole warp: one 128-block
        st[q * PFS_WORDS + pfs_word(qa)] = pfs_bf16x2(v[0], v[1]);
        st[q * PFS_WORDS + pfs_word(qa + 4)] = pfs_bf16x2(v[2], v[3]);
    }
    __syncwarp();
    const int kp = kc * 128;
#pragma unroll
    for (int r = 0; r < PFS_CHUNKS / 2; ++r) {
        const int q = 2 * r + (lane >> 4), m = lane & 15;  // chunk q, 16-byte piece m of its 256 bytes
        const u32 ch = first + q;
        if (ch >= total) break;
        const uint4 o = *(const uint4*)(st + q * PFS_WORDS + pfs_word(4 * m));
        *(uint4*)(p.out + (u64)(ch / kc) * kp + (ch % kc) * 128 + 8 * m) = o;
    }
}
