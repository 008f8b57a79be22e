// Decode GEMVs with FP8 activations on Hopper's warpgroup MMA (sm_90a): the official FP8 linear (spec 5: x
// act_quant'ed to e4m3 per (row, 128-wide K block) with a power-of-two scale, weights e4m3 with 128 x 128 UE8M0
// block scales, f32 products summed per K block, scaled by s_x * s_w, summed in f32) as e4m3 x e4m3 wgmma with
// both operands in shared memory: no weight conversion in registers.
//
// Why:     gemv_wg.cu (bf16 x) at 33-64 rows is issue-bound (~460 instructions a thread per K step, ~170 of them
//          the FP8 -> bf16 conversion of the weights, 16 more the 4-byte x copies into the permuted layout). Here a
//          thread issues 4 + 2 16-byte copies, 4 wgmma and one promotion per K step.
// Launch:  grid (ceil(nmax / 128), splits, groups), block 256 = 2 warpgroups (64 weight rows each), kernels
//          gemv_wq8_nt{1,2,4,8} (N = 8 NT batch columns of the MMA), GemvParams (x unused; its w, s, out, ws,
//          cnt, n, B, K, nmax as gemv_wg.cu) plus GemvQ8X (gemv.cu): xq[g] e4m3 [B, K] and xs[g] f32 [B, K / 128] (the
//          act_quant_bf16 outputs). Splits and split-K finish as the ring (ring_split_range, ring_splitk_finish).
// Memory:  a ring of `depth` stages, each 1024-aligned: x (8 NT rows x 128 B), then the weights (128 rows x
//          128 B), both in wgmma's K-major 128-byte swizzle (16-byte chunk c of row r at r * 128 + 16 (c ^ r % 8)),
//          filled by 16-byte cp.async.cg (zeros past N, B and K). At NT 4-8 each stage's scales (the weight
//          block's scale word, the 8 NT x scales) ride in its copy group into a scale ring after the stages.
// Math:    per K step (128 values) a warpgroup runs 4 wgmma m64n{8NT}k32 into a fresh block accumulator (the
//          first with scale-d 0), waits, and promotes: acc += blk * (s_w * s_x[col]) (DeepSeek-V3's per-block
//          promotion: the tensor core's FP8 accumulation is kept to 128 products). The products are exact; the
//          result differs from the bf16-x kernels only by summation order and the block accumulation.
// Constraints: K % 128 == 0, B <= 64; x values exact in e4m3 times their scale (act_quant's outputs).
// Use:     the engine's wq_b (+ indexer wq_b) and wo_b at 9-64 rows, official numerics, their inputs' codes
//          written by attn_row_norm_quant / attn_row_quant beside the bf16 values (GpuContext::wq8_ring).
// Timings (H200, kbench gemv-q8, us; twenty-fourth session, with the scale ring at NT 4-8: 64 rows wq_b + iwq_b
//          23.1 [28.7], wo_b 20.4 [26.0], shared w1 + w3 17.0 [18.6]; 32 rows 18.6 [28.2], 15.6 [22.8], 13.1 [14.4];
//          in the model under ncu, batch 64: wo_b 28.4 -> 23.2, wq_b + iwq_b 29.2 -> 25.4. Before it, the bf16-x
//          wgmma ring in brackets): 32 rows wq_b + iwq_b 18.9-20.0 [27.4],
//          wo_b 16.6-17.4 [22.6], shared w1 + w3 11.7 [14.5]; 64 rows 27.0 [28.6], 25.0 [25.9], 18.5 [18.7]. At 64
//          rows both kernels are bound by neither the copies nor the FP8 decode: with the in-loop copies left out
//          the launch still took 23.2 of 25.7 us; the split-K finish (last block sums 8 partials) took ~6 us.
//          Measured and not kept: weights re-laid into contiguous 16 KB K-step tiles (level), an x copy per row
//          tile (level: no L2 hot spot). Full-size bench, same binary, DSV4_GEMV_Q8 0 / 1: 17 rows -1.5%, 32
//          rows -1.7%, 48 rows -0.5%, 64 rows -1.2% (kernels/BENCH_NOTES.md, twenty-second session).
#include "common.cuh"

#define GQ8_XBYTES(NT) ((NT) * 1024)
#define GQ8_STAGE(NT) (GQ8_XBYTES(NT) + GWG_ROWS * 128)
// One slot of the scale ring (after the depth stages): the 4-byte word holding the step's weight-scale byte, 12
// bytes of padding, then the step's 8 NT x scales. The scales ride in the stage's copy group, so a step's promotion
// reads them from shared memory instead of waiting on its own global loads (an L2 round trip a step).
#define GQ8_SBYTES(NT) (16 + (NT) * 32)
// Which widths take the scale ring. At NT 4-8 (17-64 rows) the wgmma and the promotion are long and the scale
// loads' round trip landed on every step's chain (kbench gemv-q8, H200: 64 rows wo_b 25.9 -> 20.4 us, wq_b + iwq_b
// 27.5 -> 23.1; 32 rows 17.3 -> 15.6, 19.9 -> 18.6); at NT 1-2 the plain loads before the step's wait were faster
// for wq_b + iwq_b (9-16 rows: 17.3 -> 18.1 us with the ring), so they keep them.
#define GQ8_SCALE_RING(NT) ((NT) >= 4)

// 128-byte swizzle: byte offset of 16-byte chunk q of row r in a 1024-aligned tile.
__device__ __forceinline__ u32 gq8_sw(int r, int q) { return (u32)(r * 128 + ((q ^ (r & 7)) << 4)); }

// Requests K step kb of the block's 128 weight rows into ws (the stage's weight area).
__device__ __forceinline__ void gq8_issue_w(u32 ws, const u8* w, int row0, int N, int K, int kb) {
    const int q = threadIdx.x & 7;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const int r = (threadIdx.x >> 3) + 32 * m;
        const bool ok = row0 + r < N;
        cp_async16(ws + gq8_sw(r, q), ok ? w + (u64)(row0 + r) * K + kb * 128 + q * 16 : w, ok ? 16u : 0u);
    }
}

// Requests K step kb of the 8 NT x rows into xs (rows >= B: zeros).
template <int NT>
__device__ __forceinline__ void gq8_issue_x(u32 xs, const u8* x, int B, int K, int kb) {
    constexpr int CHUNKS = NT * 64;
#pragma unroll
    for (int m = 0; m < (CHUNKS + 255) / 256; ++m) {
        const int i = threadIdx.x + 256 * m;
        if (i < CHUNKS) {
            const int b = i >> 3, q = i & 7;
            const bool ok = b < B;
            cp_async16(xs + gq8_sw(b, q), ok ? x + (u64)b * K + kb * 128 + q * 16 : x, ok ? 16u : 0u);
        }
    }
}

// Loads one K step's scales from global memory (the NT <= 2 form; columns >= B read row 0's).
template <int NT>
__device__ __forceinline__ void gq8_load_scales(float& sw, float2 (&sx)[NT], const u8* swp, const float* xs, int B,
                                                int kblocks, int kb) {
    const int t = threadIdx.x & 3;
    sw = ue8m0_to_f32((u32)*swp);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int b0 = 8 * j + 2 * t, b1 = b0 + 1;
        sx[j].x = __ldg(xs + (u64)(b0 < B ? b0 : 0) * kblocks + kb);
        sx[j].y = __ldg(xs + (u64)(b1 < B ? b1 : 0) * kblocks + kb);
    }
}

// Requests the x scales of K block kb into the scale slot ss (xs: f32 [B, kblocks]; columns >= B: zeros). The
// slot's first word holds the weight scale (cp_async_word_of, issued with the weights: before the PDL wait).
template <int NT>
__device__ __forceinline__ void gq8_issue_sx(u32 ss, const float* xs, int B, int kblocks, int kb) {
    const int b = threadIdx.x;
    if (b < 8 * NT) cp_async4(ss + 16 + 4 * b, b < B ? xs + (u64)b * kblocks + kb : xs, b < B ? 4u : 0u);
}

#if defined(DSV4_WGMMA)
#define GQ8_ENABLED 1

// d = (zero ? 0 : d) + A (shared, 64 x 32 e4m3) . B (shared, 8 NT x 32 e4m3)^T: wgmma m64n{8NT}k32.
template <int NT>
__device__ __forceinline__ void gq8_mma(float (&d)[NT * 4], u64 a, u64 b, int accumulate);

template <>
__device__ __forceinline__ void gq8_mma<1>(float (&d)[4], u64 a, u64 b, int accumulate) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %6, 0; wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3}, %4, %5, p, 1, 1; }"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void gq8_mma<2>(float (&d)[8], u64 a, u64 b, int accumulate) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %10, 0; wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1; }"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b), "r"(accumulate));
}

#define GQ8_R8(d, o)                                                                                           \
    "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]), \
        "+f"(d[o + 7])

template <>
__device__ __forceinline__ void gq8_mma<4>(float (&d)[16], u64 a, u64 b, int accumulate) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %18, 0; wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1; }"
                 : GQ8_R8(d, 0), GQ8_R8(d, 8)
                 : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void gq8_mma<8>(float (&d)[32], u64 a, u64 b, int accumulate) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0; wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1; }"
                 : GQ8_R8(d, 0), GQ8_R8(d, 8), GQ8_R8(d, 16), GQ8_R8(d, 24)
                 : "l"(a), "l"(b), "r"(accumulate));
}
#undef GQ8_R8

template <int NT>
__device__ __forceinline__ void gemv_wq8(const GemvParams& p, const GemvQ8X& q, int depth) {
    extern __shared__ __align__(16) u8 gq8_smem[];  // aligned to 1024 below (the host adds the slack)
    constexpr int XB = GQ8_XBYTES(NT), SB = GQ8_STAGE(NT), SCB = GQ8_SBYTES(NT);
    constexpr bool SS = GQ8_SCALE_RING(NT);
    const int grp = blockIdx.z, N = p.n[grp], B = p.B, K = p.K;
    const int warp = threadIdx.x >> 5, t = threadIdx.x & 3;  // t: the lane's column pair in each n8 tile
    const int row0 = blockIdx.x * GWG_ROWS;
    if (row0 >= N) {  // block-uniform: this group has fewer row tiles than the largest
        pdl_wait();
        return;
    }
    int s0, nsteps;
    ring_split_range(K, s0, nsteps);
    const u8* w = (const u8*)p.w[grp];
    const u8* x = q.xq[grp];
    const u32 ring = (smem_u32(gq8_smem) + 1023u) & ~1023u;
    const u32 sring = ring + (u32)depth * SB;  // the scale ring: slot i % depth holds step i's scales
    const int kblocks = K >> 7;
    const u8* srow = p.s[grp] + (u64)(row0 >> 7) * kblocks + s0;
    const float* xs = q.xs[grp];
    for (int i = 0; i < depth - 1 && i < nsteps; ++i) {  // weights and their scales: before the wait
        gq8_issue_w(ring + i * SB + XB, w, row0, N, K, s0 + i);
        if (SS && threadIdx.x == 0) cp_async_word_of(sring + i * SCB, srow + i);
    }
    pdl_wait();
    for (int i = 0; i < depth - 1 && i < nsteps; ++i) {
        gq8_issue_x<NT>(ring + i * SB, x, B, K, s0 + i);
        if (SS) gq8_issue_sx<NT>(sring + i * SCB, xs, B, kblocks, s0 + i);
    }
    cp_async_commit();  // the prologue: one group
    float acc[NT * 4], blk[NT * 4];  // blk: each K step's first wgmma overwrites it (scale-d 0)
#pragma unroll
    for (int i = 0; i < NT * 4; ++i) acc[i] = 0.f;
    const int wg = warp >> 2, wr = wg * 64 + (warp & 3) * 16;  // the warp's first row in the stage
    const bool active = row0 + wg * 64 < N;                       // warpgroup-uniform
    int cur = 0, prev = depth - 1;  // ring slots: step i reads slot i % depth; step i refills slot (i - 1) % depth
    for (int i = 0; i < nsteps; ++i) {
        float sw;
        float2 sx[NT];  // columns >= B: zeros (SS) or row 0's (never stored either way)
        if (!SS) gq8_load_scales<NT>(sw, sx, srow + i, xs, B, kblocks, s0 + i);  // before the waits
        gwg_wait_n(min(i, depth - 2));
        fence_proxy_async();
        __syncthreads();  // step i's stage complete for every thread; every warpgroup is done with slot i - 1
        const int nx = i + depth - 1;
        if (nx < nsteps) {
            gq8_issue_w(ring + prev * SB + XB, w, row0, N, K, s0 + nx);
            if (SS && threadIdx.x == 0) cp_async_word_of(sring + prev * SCB, srow + nx);
            gq8_issue_x<NT>(ring + prev * SB, x, B, K, s0 + nx);
            if (SS) gq8_issue_sx<NT>(sring + prev * SCB, xs, B, kblocks, s0 + nx);
        }
        cp_async_commit();
        if (active) {
            const u32 st = ring + cur * SB, ss = sring + cur * SCB;
            const u32 a0 = st + XB + (u32)wg * 8192u;
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < 4; ++s)
                gq8_mma<NT>(blk, wgmma_desc_sw128(a0 + 32 * s), wgmma_desc_sw128(st + 32 * s), s);
            wgmma_commit();
            if (SS) {  // the step's scales from its slot, read while the MMAs run
                sw = ue8m0_to_f32(lds_byte_of(ss, srow + i));
#pragma unroll
                for (int j = 0; j < NT; ++j) sx[j] = lds_f32x2(ss + 16 + 4 * (8 * j + 2 * t));
            }
            wgmma_wait<0>();
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int i2 = 0; i2 < 4; ++i2)
                    acc[j * 4 + i2] =
                        fmaf(blk[j * 4 + i2], sw * ((i2 & 1) ? sx[j].y : sx[j].x), acc[j * 4 + i2]);
        }
        prev = cur;
        cur = cur + 1 == depth ? 0 : cur + 1;
    }
    pdl_trigger();  // the next kernel's start overlaps this block's stores and split-K finish
    gwg_store<NT>(p, acc, row0, wr, active);
}
#endif

// Two blocks per SM (<= 128 registers; the host picks the ring depth that fits two in shared memory).
// q: __grid_constant__, read in place (a by-value copy took a 128-byte stack frame).
#if defined(GQ8_ENABLED)
#define GQ8_BODY(NT) gemv_wq8<NT>(p, q, depth);
#else
#define GQ8_BODY(NT) __trap();
#endif
#define GQ8_KERNELS(NT)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 2)                                               \
        gemv_wq8_nt##NT(GemvParams p, const __grid_constant__ GemvQ8X q, int depth) {                  \
        GQ8_BODY(NT)                                                                                   \
    }
GQ8_KERNELS(1)
GQ8_KERNELS(2)
GQ8_KERNELS(4)
GQ8_KERNELS(8)
#undef GQ8_KERNELS
#undef GQ8_BODY
