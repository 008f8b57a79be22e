// Decode GEMVs of 9-64 rows (gemv.cu's math, layouts, groups and GemvParams): a cp.async ring per block, so x
// is staged once per block instead of re-read per 32-row tile. gemv.cu's kernels keep the small batches (its
// loads-in-registers design is 5-20% faster there); GemvPath on the host picks the family by the row count, so
// a row's bits are the same at every batch size within a family (not across the two).
//
// Launch:  grid (ceil(nmax / (128 MT)), splits, groups), block 256 = 8 warps, splits in {1, 2, 4, 8} from N
//          and K only; kernels gemv_ring_{fp8,bf16}_nt{2,4,8}_mt{1,2}: NT = ceil(B/8) batch tiles of 8, every
//          warp owns MT x 16 rows (the block 128 MT rows) over the split's whole K range. K runs in 128-byte
//          steps (128 FP8 or 64 bf16 values); split s owns steps [s*steps/splits, (s+1)*steps/splits).
// Memory:  a ring of `depth` (2..4, as much as the device's shared memory allows) stages in dynamic shared
//          memory; a stage holds the block's 128 MT weight rows x 128 B (16-byte chunks XOR-swizzled by row
//          parity: conflict-free 16-byte reads) and the B activation rows' 128-byte step. All 256 threads fill
//          stages with cp.async.cg (L2 only): depth-1 stages are in flight while one is computed.
// Compute: mma.sync m16n8k16 bf16 as in gemv.cu (FP8: bits moved into bf16, one packed multiply by the block
//          scale); FP8 bytes are reordered per weight word so the mma pairs are the natural (k, k+1) ones and x
//          is used as stored.
// Split-K: partials to ws[g][split][B][n[g]]; the last block of each (group, 32-row counter tile) to arrive sums
//          them in split order (counter reset by that block): deterministic. Every launch writes all the
//          partials it reads, so a smaller batch after a larger one reads nothing stale.
// Timings (H200, kernels/BENCH_NOTES.md "gemv8"): batch 64 1.3-2.7x faster per GEMV than gemv.cu (graph step at
//          4K 74.0 -> 67.9 ms), batch 1-8 5-20% slower. A cluster (DSMEM) split-K reduction was 1.2-2x slower.
// Constraints: FP8 K % 16 == 0, bf16 K % 8 == 0; scale exponent byte <= 134; B <= 64.
// Shared with gemv.cu (same translation unit, sorted before): GemvParams, fp8_scale_x2, fp8_frag, word_of. The
//          helpers keep this file's SASS byte for byte as it was with the decode written out here (sm_90a).
#include "common.cuh"

#define GEMV_XS_FP8 272   // x stage row stride in bytes (256 + 16: conflict-free 16-byte reads)
#define GEMV_XS_BF16 192  // bf16: 128 + 64
#define GEMV_RING_SPLITS_MAX 8  // most K splits (gemv_ring.rs SPLITS_MAX)

// Waits until at most n (0..3) of this thread's newest copy groups are pending.
__device__ __forceinline__ void gv_wait_n(int n) {
    if (n <= 0) cp_async_wait<0>();
    else if (n == 1) cp_async_wait<1>();
    else if (n == 2) cp_async_wait<2>();
    else cp_async_wait<3>();
}

// Swizzled byte offset of 16-byte chunk q (0..7) of stage row r: odd rows swap the two 64-byte halves, so the
// 8 lanes of a quarter warp (rows g, g+1 x chunks 4c + t) hit 8 distinct 16-byte bank groups.
__device__ __forceinline__ u32 gv_wofs(int r, int q) { return (u32)(r * 128 + ((q ^ ((r & 1) << 2)) << 4)); }

// This block's K steps [s0, s0 + nsteps) of the 128-byte steps of a row_bytes row: split blockIdx.y of gridDim.y
// (gemv_wg.cu shares it).
__device__ __forceinline__ void ring_split_range(int row_bytes, int& s0, int& nsteps) {
    const u32 splits = gridDim.y, rank = blockIdx.y;
    const int ksteps = (row_bytes + 127) >> 7;
    s0 = (int)(rank * ksteps / splits);
    nsteps = (int)((rank + 1) * ksteps / splits) - s0;
}

// Requests one K step of the block's ROWS weight rows into a stage (rows >= N and bytes >= row_bytes: zeros).
template <int MT>
__device__ __forceinline__ void ring_issue_w(u32 dst, const u8* w, int row0, int N, int row_bytes, int kb) {
#pragma unroll
    for (int m = 0; m < MT * 4; ++m) {
        const int i = threadIdx.x + m * 256, r = i >> 3, q = i & 7;
        const int off = kb * 128 + q * 16;
        const bool ok = row0 + r < N && off < row_bytes;
        cp_async16(dst + gv_wofs(r, q), ok ? w + (u64)(row0 + r) * row_bytes + off : w, ok ? 16u : 0u);
    }
}

// Requests one K step of the B activation rows (bytes past the row: zeros; rows >= B are left as they are:
// they only feed output columns that are never stored).
template <bool FP8>
__device__ __forceinline__ void ring_issue_x(u32 dst, const u16* x, int B, int K, int kb) {
    constexpr int CPR = FP8 ? 16 : 8;  // 16-byte chunks per row and step
    constexpr int XS = FP8 ? GEMV_XS_FP8 : GEMV_XS_BF16;
    const int row_bytes = 2 * K;
    for (int i = threadIdx.x; i < B * CPR; i += 256) {
        const int b = i / CPR, q = i % CPR, off = kb * CPR * 16 + q * 16;
        const bool ok = off < row_bytes;
        cp_async16(dst + b * XS + q * 16, ok ? (const u8*)x + (u64)b * row_bytes + off : (const u8*)x,
                ok ? 16u : 0u);
    }
}

// One FP8 K step (128 values) of a warp's MT x 16 rows (stage rows wr0..) against NT batch tiles.
template <int NT, int MT>
__device__ __forceinline__ void ring_fp8_step(float* acc, u32 ws, u32 xs, int wr0, u32 e, int g, int t) {
    const u32 f = fp8_scale_x2(e);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        u32 a[4][MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const int r = wr0 + mt * 16 + g;
            const uint4 w0 = lds128(ws + gv_wofs(r, c * 4 + t));
            const uint4 w1 = lds128(ws + gv_wofs(r + 8, c * 4 + t));
#pragma unroll
            for (int st = 0; st < 4; ++st)  // bytes reordered (b0, b2, b1, b3): lo = (b0, b1), hi = (b2, b3)
                fp8_frag<true>(a[st][mt], w0, w1, st, f);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const u32 xp = xs + (j * 8 + g) * GEMV_XS_FP8 + (c * 64 + t * 16) * 2;
            const uint4 x0 = lds128(xp), x1 = lds128(xp + 16);
            const u32 X[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
            for (int st = 0; st < 4; ++st)  // b0 = (x[4st], x[4st+1]), b1 = (x[4st+2], x[4st+3]): as stored
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    mma_bf16_16816(&acc[(mt * NT + j) * 4], a[st][mt][0], a[st][mt][1], a[st][mt][2],
                                   a[st][mt][3], X[2 * st], X[2 * st + 1]);
        }
    }
}

// One bf16 K step (64 values) of a warp's MT x 16 rows against NT batch tiles.
template <int NT, int MT>
__device__ __forceinline__ void ring_bf16_step(float* acc, u32 ws, u32 xs, int wr0, int g, int t) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        uint4 wv[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            wv[mt][0] = lds128(ws + gv_wofs(wr0 + mt * 16 + g, c * 4 + t));
            wv[mt][1] = lds128(ws + gv_wofs(wr0 + mt * 16 + g + 8, c * 4 + t));
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const uint4 xv = lds128(xs + (j * 8 + g) * GEMV_XS_BF16 + c * 64 + t * 16);
#pragma unroll
            for (int st = 0; st < 2; ++st)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    mma_bf16_16816(&acc[(mt * NT + j) * 4], word_of(wv[mt][0], 2 * st),
                                   word_of(wv[mt][1], 2 * st), word_of(wv[mt][0], 2 * st + 1),
                                   word_of(wv[mt][1], 2 * st + 1), word_of(xv, 2 * st),
                                   word_of(xv, 2 * st + 1));
        }
    }
}

// Split-K epilogue, called by every thread after its partials are stored: the last block of the (group, row
// tile) to arrive (counter in cnt, reset by that block, so graph replays see zeros) sums the partials of its
// ROWS rows in split order: deterministic, and independent of which block arrives last. 16-byte reads when
// the rows allow it.
template <int ROWS, int U>
__device__ __forceinline__ void ring_splitk_finish(const GemvParams& p, int grp, int row0, const float* ws) {
    const int N = p.n[grp], B = p.B, S = gridDim.y;
    if (!block_arrives_last(p.cnt + (u64)grp * ((p.nmax + 31) >> 5) + (row0 >> 5), (u32)S)) return;
    const int nr = min(ROWS, N - row0);
    if ((N & 3) == 0 && (p.nmax & 3) == 0) {
        // U float4 items per thread and pass, all their split loads issued before the first add: at batch 64
        // one block reads up to 512 KB here, so it must keep many loads in flight (U = 2 there; 1 at small
        // batches, where the registers matter more).
        const int q = nr >> 2, items = q * B;  // float4 per batch row, in all
        for (int i0 = threadIdx.x; i0 < items; i0 += U * blockDim.x) {
            float4 o[U][GEMV_RING_SPLITS_MAX];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = min(i0 + u * (int)blockDim.x, items - 1);
                const float* src = ws + (u64)(i / q) * N + row0 + (i % q) * 4;
#pragma unroll
                for (int sp = 0; sp < GEMV_RING_SPLITS_MAX; ++sp)
                    if (sp < S) o[u][sp] = __ldcg((const float4*)(src + (u64)sp * B * N));
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = i0 + u * (int)blockDim.x;
                if (i >= items) continue;
                float4 v = o[u][0];
#pragma unroll
                for (int sp = 1; sp < GEMV_RING_SPLITS_MAX; ++sp)
                    if (sp < S) {
                        v.x += o[u][sp].x;
                        v.y += o[u][sp].y;
                        v.z += o[u][sp].z;
                        v.w += o[u][sp].w;
                    }
                const int b = i / q, row = row0 + (i % q) * 4;
                const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) store_out(p.out[grp], (u64)b * N + row + e, vs[e], p.out_bf16);
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < nr * B; i += blockDim.x) {
        const int b = i / nr, row = row0 + i % nr;
        const float* src = ws + (u64)b * N + row;
        float v = __ldcg(src);
        for (int sp = 1; sp < S; ++sp) v += __ldcg(src + (u64)sp * B * N);
        store_out(p.out[grp], (u64)b * N + row, v, p.out_bf16);
    }
}

template <int NT, int MT, bool FP8>
__device__ __forceinline__ void gemv_ring(const GemvParams& p, int depth) {
    extern __shared__ __align__(16) u8 gv_smem[];
    constexpr int ROWS = MT * 16 * GEMV_WARPS;
    constexpr int WBYTES = ROWS * 128;
    constexpr int SBYTES = WBYTES + NT * 8 * (FP8 ? GEMV_XS_FP8 : GEMV_XS_BF16);
    const int grp = blockIdx.z, N = p.n[grp], B = p.B, K = p.K;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * ROWS;
    if (row0 >= N) {  // block-uniform: this group has fewer row tiles than the largest
        pdl_wait();
        return;
    }
    const u32 splits = gridDim.y, rank = blockIdx.y;
    const int row_bytes = FP8 ? K : 2 * K;
    int s0, nsteps;
    ring_split_range(row_bytes, s0, nsteps);
    const u8* w = (const u8*)p.w[grp];
    const u16* x = p.x[grp];
    const u32 ring = smem_u32(gv_smem);
    for (int i = 0; i < depth - 1 && i < nsteps; ++i)
        ring_issue_w<MT>(ring + i * SBYTES, w, row0, N, row_bytes, s0 + i);  // weights: before the wait
    pdl_wait();
    for (int i = 0; i < depth - 1 && i < nsteps; ++i)
        ring_issue_x<FP8>(ring + i * SBYTES + WBYTES, x, B, K, s0 + i);
    cp_async_commit();
    float acc[MT * NT * 4];
#pragma unroll
    for (int i = 0; i < MT * NT * 4; ++i) acc[i] = 0.f;
    const int wr0 = warp * MT * 16;                  // the warp's first row in the stage
    const bool wactive = row0 + wr0 < N;             // warp-uniform
    const u8* srow = FP8 && wactive ? p.s[grp] + (u64)((row0 + wr0) >> 7) * ((K + 127) >> 7) + s0 : nullptr;
    for (int i = 0; i < nsteps; ++i) {
        const u32 e = FP8 && wactive ? (u32)srow[i] : 0u;
        __syncthreads();  // the slot refilled below was last read in step i - 1
        const int nx = i + depth - 1;
        if (nx < nsteps) {
            const u32 st = ring + (nx % depth) * SBYTES;
            ring_issue_w<MT>(st, w, row0, N, row_bytes, s0 + nx);
            ring_issue_x<FP8>(st + WBYTES, x, B, K, s0 + nx);
        }
        cp_async_commit();
        if (i == 0) cp_async_wait<1>();  // the prologue group (steps 0..depth-2)
        else gv_wait_n(depth - 1);  // step i's group (committed depth-1 groups ago)
        __syncthreads();            // ... for every thread's copies
        if (wactive) {
            const u32 st = ring + (i % depth) * SBYTES;
            if (FP8)
                ring_fp8_step<NT, MT>(acc, st, st + WBYTES, wr0, e, g, t);
            else
                ring_bf16_step<NT, MT>(acc, st, st + WBYTES, wr0, g, t);
        }
    }
    pdl_trigger();  // the next kernel's start overlaps this block's stores and split-K finish
    float* ws = splits > 1 ? p.ws + (u64)grp * splits * B * p.nmax : nullptr;
    if (wactive) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = row0 + wr0 + mt * 16 + g + (i >> 1) * 8;
                    const int b = j * 8 + 2 * t + (i & 1);
                    if (row >= N || b >= B) continue;
                    const float v = acc[(mt * NT + j) * 4 + i];
                    if (splits == 1) store_out(p.out[grp], (u64)b * N + row, v, p.out_bf16);
                    else ws[((u64)rank * B + b) * N + row] = v;
                }
    }
    if (splits > 1) ring_splitk_finish<ROWS, NT >= 4 ? 2 : 1>(p, grp, row0, ws);
}

// Register budget: as many blocks per SM as the shared-memory ring allows (3 / 2 / 1).
#define GEMV_RING_MINB(NT, MT) ((NT) == 1 && (MT) == 1 ? 3 : ((NT) >= 4 || (MT) == 2 ? 1 : 2))
#define GEMV_RING_KERNELS(NT, MT)                                                                               \
    extern "C" __global__ void __launch_bounds__(256, GEMV_RING_MINB(NT, MT)) gemv_ring_fp8_nt##NT##_mt##MT(        \
        GemvParams p, int depth) {                                                                         \
        gemv_ring<NT, MT, true>(p, depth);                                                                 \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(256, GEMV_RING_MINB(NT, MT)) gemv_ring_bf16_nt##NT##_mt##MT(       \
        GemvParams p, int depth) {                                                                         \
        gemv_ring<NT, MT, false>(p, depth);                                                                \
    }
GEMV_RING_KERNELS(2, 1)
GEMV_RING_KERNELS(4, 1)
GEMV_RING_KERNELS(8, 1)
GEMV_RING_KERNELS(2, 2)
GEMV_RING_KERNELS(4, 2)
GEMV_RING_KERNELS(8, 2)
#undef GEMV_RING_KERNELS
