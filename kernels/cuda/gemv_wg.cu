// Decode GEMVs on Hopper's warpgroup MMA (sm_90a): gemv_ring.cu's problem (GemvParams, groups, split-K, the same
// row tiles of 128 and the same bits for every batch size) with wgmma.mma_async instead of mma.sync, for the ring
// family on an H200. gemv_ring.cu stays the portable ring (sm_120, NVRTC's compute_90 PTX).
//
// Why:     at 64 rows the mma.sync ring is latency/issue-bound (164 registers, one 8-warp block per SM: BENCH_NOTES
//          "ncu ... batch-64 ring GEMV"): every warp re-reads the whole x step from shared memory into registers
//          (8 x 16 KB per 32 KB of weights) and holds 64 accumulators. wgmma reads x (its B operand) from shared
//          memory itself once per warpgroup, the accumulators of a 64 x 8 NT tile are 4 NT registers a thread,
//          and its peak is twice mma.sync's; so two blocks of 8 warps fit an SM and x costs no registers.
// Launch:  grid (ceil(nmax / 128), splits, groups), block 256 = 2 warpgroups, kernels gemv_wg_{fp8,bf16}_nt{1,2,4,8}
//          (N = 8 NT batch columns of the MMA); splits as the ring (gemv_ring.rs ring_splits).
// Math:    A = weights from registers: warp w of warpgroup q owns stage rows 64 q + 16 w .. + 15 and builds its
//          fragments exactly as gemv_ring.cu does (16-byte reads of the swizzled stage; FP8: bits moved into bf16
//          and one packed multiply by the block scale, exact). A lane's 16 bytes hold physical k = 16 t + 4 s +
//          2 h + j (FP8, within a 64-value half; bf16: 8 t + 4 s + 2 h + j within a 32-value half) for MMA step s
//          and logical column 8 h + 2 t + j. B = x from shared memory in wgmma's K-major 128-byte-swizzle tiles
//          (gemv_wg_issue_x), its 4-byte words copied to the logical positions of that permutation: the weights are
//          used as loaded and every product pairs the same x and w values as a plain dot product. f32
//          accumulation by the tensor core through the split's K range.
// Memory:  a ring of `depth` stages (x tiles first, 1024-aligned, then 128 weight rows x 128 B); weights by 16-byte
//          cp.async.cg (L2 only), x by 4-byte cp.async.ca. One barrier per K step: wait for the step's copies,
//          fence them to the async proxy, wait for this warpgroup's previous wgmma, barrier, refill the slot every
//          warp finished in the previous step, then convert + wgmma (async: the second half's conversion overlaps
//          the first half's MMAs).
// Split-K: partials and the last-block reduction of gemv_ring.cu (ring_splitk_finish): deterministic.
// Constraints: as gemv_ring.cu (FP8 K % 16 == 0, bf16 K % 8 == 0, scale exponent byte <= 134, B <= 64).
// Timings (H200, kernels/BENCH_NOTES.md "ring2"; kbench gemv-ab, the model's 9 grouped launches summed): at 64 rows
//          195 us against 254 on the mma.sync ring and 338 on gemv.cu (wq_b + indexer wq_b 49.1 -> 31.4 us), at 32
//          rows 156 / 173 / 188; at 8-16 rows gemv.cu stays ahead (97 / 121 at 8). Graph step at 64 rows 51.68 ->
//          50.49 ms. Ring depth: the deepest with two blocks per SM is within 3% of the best; one block per SM is
//          10-20% slower. The K loop is issue-bound, not DRAM- or tensor-bound: per K step a thread runs ~460
//          instructions (FP8 nt8 SASS; ~170 of them the FP8 conversion) for 2 KB of weights a warp; before the copy
//          plan (GwgPlan: the addressing worked out once per block, a rolling slot offset) it was ~920 and 64 rows
//          took 233 us.
#include "common.cuh"

#define GWG_ROWS 128  // rows of a block: 2 warpgroups x 64

// Stage bytes: the x tiles (FP8: two 64-value tiles per 128-value step; bf16: one), then the weights.
#define GWG_XBYTES(NT, FP8) ((FP8 ? 2 : 1) * (NT) * 1024)
#define GWG_STAGE(NT, FP8) (GWG_XBYTES(NT, FP8) + GWG_ROWS * 128)

// What this thread copies into every stage, worked out once per block: the K loop then adds one 64-bit offset per
// copy (the addressing, recomputed per step and row, was half of the loop's instructions).
// Weights: chunk tid % 8 (16 bytes) of rows tid / 8 + 32 m (m < 4) of the block's 128, as gemv_ring.cu's
// ring_issue_w<1> places them (rows >= N and bytes >= row_bytes: zeros).
// x: word wd = tid % WPR of rows b0 = tid / WPR, + 256 / WPR, ... < B of each K step, at the logical position of
// the permutation in the header (rows >= B are left as they are: they only feed output columns never stored).
struct GwgPlan {
    const u8* wsrc;  // weights: the chunk of row row0 + tid / 8 at K step 0
    u64 wstride;     // 32 rows
    u32 wdst;        // its swizzled offset in the stage's weight area (+ 4096 m)
    u32 wrows;       // bit m: row row0 + tid / 8 + 32 m exists
    int wbyte;       // its byte in a K step (16 (tid % 8))
    const u8* xsrc;  // x: word wd of row b0 at K step 0
    u64 xstride;     // 256 / WPR rows
    u32 xdst0, xdst1;  // stage offsets of rows b0 and b0 + 256 / WPR (FP8: the two swizzle phases); + PAIR q
    int xword, xrows;  // wd; how many rows this thread copies
};

template <bool FP8>
__device__ __forceinline__ GwgPlan gwg_plan(const u8* w, const u16* x, int row0, int N, int row_bytes, int B, int K,
                                            int nt) {
    constexpr int WPR = FP8 ? 64 : 32;  // 4-byte words per row and step
    constexpr int Q = WPR / 2;          // words per half
    constexpr int RS = 256 / WPR;       // rows between this thread's copies
    GwgPlan pl;
    const int r = threadIdx.x >> 3, q = threadIdx.x & 7;
    pl.wsrc = w + (u64)(row0 + r) * row_bytes + q * 16;
    pl.wstride = (u64)32 * row_bytes;
    pl.wdst = gv_wofs(r, q);
    pl.wbyte = q * 16;
    pl.wrows = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) pl.wrows |= (row0 + r + 32 * m < N ? 1u : 0u) << m;
    const int wd = threadIdx.x % WPR, c = wd / Q, P = wd % Q;
    const int t = P / (Q / 4), s = (P >> 1) % (Q / 8), h = P & 1;
    const int lw = (FP8 ? 0 : 16 * c) + 8 * s + 4 * h + t;  // logical word in the tile's 128-byte row
    const u32 tile = FP8 ? (u32)(c * nt * 1024) : 0u;
    const int b0 = threadIdx.x / WPR, b1 = b0 + RS;
    pl.xsrc = (const u8*)x + (u64)b0 * K * 2 + (u64)wd * 4;
    pl.xstride = (u64)RS * K * 2;
    pl.xdst0 = tile + b0 * 128 + (((lw >> 2) ^ (b0 & 7)) << 4) + (lw & 3) * 4;
    pl.xdst1 = tile + b1 * 128 + (((lw >> 2) ^ (b1 & 7)) << 4) + (lw & 3) * 4;
    pl.xword = wd;
    pl.xrows = B > b0 ? (B - b0 + RS - 1) / RS : 0;
    return pl;
}

// Requests K step kb of the block's weight rows into the stage's weight area ws.
__device__ __forceinline__ void gwg_issue_w(const GwgPlan& pl, u32 ws, const u8* w, int row_bytes, int kb) {
    const bool kin = kb * 128 + pl.wbyte < row_bytes;
    const u8* src = pl.wsrc + kb * 128;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const bool ok = kin && ((pl.wrows >> m) & 1u);
        cp_async16(ws + pl.wdst + m * 4096, ok ? src : w, ok ? 16u : 0u);
        src += pl.wstride;
    }
}

// Requests K step kb of the B activation rows into the stage's x tiles xs (K % 8 == 0: a word is wholly inside or
// outside the row; outside: zeros).
template <int NT, bool FP8>
__device__ __forceinline__ void gwg_issue_x(const GwgPlan& pl, u32 xs, const u16* x, int K, int kb) {
    constexpr int WPR = FP8 ? 64 : 32;
    constexpr int PAIR = FP8 ? 1024 : 2048;  // stage bytes between rows b and b + 2 RS
    const bool ok = 2 * (kb * WPR + pl.xword) < K;
    const u8* src = ok ? pl.xsrc + kb * WPR * 4 : (const u8*)x;
    const u64 stride = ok ? pl.xstride : 0;
#pragma unroll
    for (int m = 0; m < NT * 8 * WPR / 256; ++m) {
        if (m < pl.xrows) cp_async4(xs + ((m & 1) ? pl.xdst1 : pl.xdst0) + (m >> 1) * PAIR, src, ok ? 4u : 0u);
        src += stride;
    }
}

#if defined(DSV4_WGMMA)
#define GWG_ENABLED 1

// Waits until at most n (0..4) of this thread's newest copy groups are pending (depth <= 6).
__device__ __forceinline__ void gwg_wait_n(int n) {
    if (n <= 0) cp_async_wait<0>();
    else if (n == 1) cp_async_wait<1>();
    else if (n == 2) cp_async_wait<2>();
    else if (n == 3) cp_async_wait<3>();
    else cp_async_wait<4>();
}

// d (+)= A (registers, 64 x 16 bf16) . B[8 NT x 32 B]^T (shared memory, desc), f32: wgmma m64n{8 NT}k16.
template <int NT>
__device__ __forceinline__ void gwg_mma(float (&d)[NT * 4], const u32 (&a)[4], u64 b);

template <>
__device__ __forceinline__ void gwg_mma<1>(float (&d)[4], const u32 (&a)[4], u64 b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, "
                 "1, 0;"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <>
__device__ __forceinline__ void gwg_mma<2>(float (&d)[8], const u32 (&a)[4], u64 b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11}, %12, 1, 1, 1, 0;"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

#define GWG_R8(d, o)                                                                                           \
    "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]), \
        "+f"(d[o + 7])

template <>
__device__ __forceinline__ void gwg_mma<4>(float (&d)[16], const u32 (&a)[4], u64 b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                 "%10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1, 0;"
                 : GWG_R8(d, 0), GWG_R8(d, 8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

template <>
__device__ __forceinline__ void gwg_mma<8>(float (&d)[32], const u32 (&a)[4], u64 b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                 "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, "
                 "%29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;"
                 : GWG_R8(d, 0), GWG_R8(d, 8), GWG_R8(d, 16), GWG_R8(d, 24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
#undef GWG_R8

// One K step of the warp's 16 rows (stage rows wr..) into this warpgroup's MMAs, per half (FP8: 64 values, 4 MMA
// steps, its own x tile; bf16: 32 values, 2 MMA steps, the step's one x tile): the fragments, then the MMAs
// (async; committed as one group by the caller). f: fp8_scale_x2 of the step's block scale (FP8 only).
template <int NT, bool FP8>
__device__ __forceinline__ void gwg_step(float (&acc)[NT * 4], u32 st, int wr, u32 f, int g, int t) {
    constexpr int S = FP8 ? 4 : 2;
    const u32 ws = st + GWG_XBYTES(NT, FP8);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const uint4 w0 = lds128(ws + gv_wofs(wr + g, c * 4 + t));
        const uint4 w1 = lds128(ws + gv_wofs(wr + g + 8, c * 4 + t));
        u32 a[S][4];
#pragma unroll
        for (int s = 0; s < S; ++s) {
            if (FP8) {
                fp8_frag<true>(a[s], w0, w1, s, f);
            } else {
                a[s][0] = word_of(w0, 2 * s);
                a[s][1] = word_of(w1, 2 * s);
                a[s][2] = word_of(w0, 2 * s + 1);
                a[s][3] = word_of(w1, 2 * s + 1);
            }
        }
        wgmma_fence();  // a[] was written by ordinary instructions
#pragma unroll
        for (int s = 0; s < S; ++s)
            gwg_mma<NT>(acc, a[s], wgmma_desc_sw128(st + (FP8 ? c * NT * 1024 + 32 * s : 32 * (2 * c + s))));
    }
}

// The block's results (a warpgroup's wgmma accumulator layout: row wr + g (+ 8), columns 8 j + 2 t (+ 1)) to
// out, or with split-K to the workspace and then the last block's sum (ring_splitk_finish). Shared with
// gemv_wq8.cu.
template <int NT>
__device__ __forceinline__ void gwg_store(const GemvParams& p, const float (&acc)[NT * 4], int row0, int wr,
                                          bool active) {
    const int grp = blockIdx.z, N = p.n[grp], B = p.B, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const u32 splits = gridDim.y, rank = blockIdx.y;
    float* ws = splits > 1 ? p.ws + (u64)grp * splits * B * p.nmax : nullptr;
    if (active) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + wr + g + (i >> 1) * 8;
                const int b = j * 8 + 2 * t + (i & 1);
                if (row >= N || b >= B) continue;
                const float v = acc[j * 4 + i];
                if (splits == 1) store_out(p.out[grp], (u64)b * N + row, v, p.out_bf16);
                else ws[((u64)rank * B + b) * N + row] = v;
            }
    }
    if (splits > 1) ring_splitk_finish<GWG_ROWS, NT >= 4 ? 2 : 1>(p, grp, row0, ws);
}

template <int NT, bool FP8>
__device__ __forceinline__ void gemv_wg(const GemvParams& p, int depth) {
    extern __shared__ __align__(16) u8 gwg_smem[];  // aligned to 1024 below (the host adds the slack)
    constexpr int XB = GWG_XBYTES(NT, FP8), SB = GWG_STAGE(NT, FP8);
    const int grp = blockIdx.z, N = p.n[grp], B = p.B, K = p.K;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * GWG_ROWS;
    if (row0 >= N) {  // block-uniform: this group has fewer row tiles than the largest
        pdl_wait();
        return;
    }
    const int row_bytes = FP8 ? K : 2 * K;
    int s0, nsteps;
    ring_split_range(row_bytes, s0, nsteps);
    const u8* w = (const u8*)p.w[grp];
    const u16* x = p.x[grp];
    const u32 ring = (smem_u32(gwg_smem) + 1023u) & ~1023u;  // the swizzle pattern repeats every 1024 B
    const GwgPlan pl = gwg_plan<FP8>(w, x, row0, N, row_bytes, B, K, NT);
    for (int i = 0; i < depth - 1 && i < nsteps; ++i)
        gwg_issue_w(pl, ring + i * SB + XB, w, row_bytes, s0 + i);  // weights: before the wait
    pdl_wait();
    for (int i = 0; i < depth - 1 && i < nsteps; ++i) gwg_issue_x<NT, FP8>(pl, ring + i * SB, x, K, s0 + i);
    cp_async_commit();  // the prologue: one group
    float acc[NT * 4];
#pragma unroll
    for (int i = 0; i < NT * 4; ++i) acc[i] = 0.f;
    const int wg = warp >> 2, wr = wg * 64 + (warp & 3) * 16;  // the warp's first row in the stage
    const bool active = row0 + wg * 64 < N;                       // warpgroup-uniform
    const u8* srow = FP8 && active ? p.s[grp] + (u64)((row0 + wg * 64) >> 7) * ((K + 127) >> 7) + s0 : nullptr;
    // Stage offsets of slot i % depth (read at step i) and of slot (i - 1) % depth, refilled at step i with step
    // i + depth - 1: the slot step i - 1 read.
    u32 cur = 0, prev = (u32)(depth - 1) * SB;
    for (int i = 0; i < nsteps; ++i) {
        const u32 e = FP8 && active ? (u32)srow[i] : 0u;
        // Step i's copies sit in the prologue group (i <= depth - 2) or in the group committed at step
        // i - depth + 1; min(i, depth - 2) groups were committed after it.
        gwg_wait_n(min(i, depth - 2));
        fence_proxy_async();
        wgmma_wait<0>();  // this warpgroup's MMAs of step i - 1: their x slot is refilled below
        __syncthreads();  // step i's stage complete for every thread; every warp is done with slot i - 1
        const int nx = i + depth - 1;
        if (nx < nsteps) {
            gwg_issue_w(pl, ring + prev + XB, w, row_bytes, s0 + nx);
            gwg_issue_x<NT, FP8>(pl, ring + prev, x, K, s0 + nx);
        }
        cp_async_commit();
        if (active) {
            gwg_step<NT, FP8>(acc, ring + cur, wr, fp8_scale_x2(e), g, t);
            wgmma_commit();
        }
        prev = cur;
        cur = cur + SB == (u32)depth * SB ? 0u : cur + SB;
    }
    wgmma_wait<0>();
    pdl_trigger();  // the next kernel's start overlaps this block's stores and split-K finish
    gwg_store<NT>(p, acc, row0, wr, active);
}
#endif

// Two blocks per SM (<= 128 registers; the host picks the ring depth that fits two in shared memory).
#if defined(GWG_ENABLED)
#define GWG_KERNELS(NT)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 2) gemv_wg_fp8_nt##NT(GemvParams p, int depth) {        \
        gemv_wg<NT, true>(p, depth);                                                                          \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(256, 2) gemv_wg_bf16_nt##NT(GemvParams p, int depth) {       \
        gemv_wg<NT, false>(p, depth);                                                                         \
    }
#else
#define GWG_KERNELS(NT)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 2) gemv_wg_fp8_nt##NT(GemvParams p, int depth) { __trap(); } \
    extern "C" __global__ void __launch_bounds__(256, 2) gemv_wg_bf16_nt##NT(GemvParams p, int depth) { __trap(); }
#endif
GWG_KERNELS(1)
GWG_KERNELS(2)
GWG_KERNELS(4)
GWG_KERNELS(8)
#undef GWG_KERNELS
