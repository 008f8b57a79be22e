// Decode GEMVs / skinny GEMMs: FP8 (e4m3, 128x128 UE8M0 block scales) or bf16 weights x bf16 activations,
// one to eight independent matrices ("groups") per launch, split-K reduced inside the kernel.
//
// Math:    for each group g < groups (blockIdx.z): y_g[b, n] = sum_k x_g[b, k] * W_g[n, k], b < B <= 64,
//          n < n[g], f32 accumulation; FP8: W = e4m3(Wq[n, k]) * S[n / 128, k / 128]. Groups share K, B,
//          the weight format and the output type (f32 or bf16); their x, W, y are independent pointers (the
//          8 wo_a groups, wq_a + wkv, wq_b + the indexer's wq_b, the shared expert's w1 + w3: one launch each).
// Layout:  x bf16 [B, K]; W u8 e4m3 or bf16 [N, K] row-major (checkpoint layout, read directly); S u8 UE8M0
//          [ceil(N/128), ceil(K/128)]; y f32 or bf16 [B, N].
// Launch:  grid (ceil(nmax/32), splits, groups), block 256 = 8 warps (gemv_fp8_ntX / gemv_bf16_ntX, NT =
//          ceil(B/8) batch tiles of 8). A block owns 32 rows (two m16 tiles); its warps take 128-byte K steps
//          of each row round-robin (step = split*8 + warp, stride 8*splits): 128 FP8 or 64 bf16 values, so
//          both formats load the same bytes the same way: per step a thread issues 8 x 16 B (2 halves x 4
//          rows) before using any. The warps reduce through shared memory in a fixed order.
// Occupancy: at batch 1-16 the kernel is latency-bound (ncu: DRAM 19%, no eligible warp 71% of cycles) and
//          its rate follows the bytes an SM has in flight, i.e. resident blocks x 32 KB (one K step per warp).
//          So 1-8 rows are bounded to 64 registers (4 blocks per SM; FP8 took 79 = 3 blocks, with the same
//          arithmetic: only address and register allocation changed): wo_a (8 x 1024 x 4096) 16.9 -> 14.8 us.
//          Measured and not kept (kernels/BENCH_NOTES.md, gemvpf): persistent blocks streaming several row tiles
//          with the next K step's loads issued before the current one is computed (128 registers = 2 blocks
//          per SM: 64 KB in flight instead of 96 KB, 5-50% slower), and a one-barrier block reduction (same
//          bits, no measurable change).
// Compute: mma.sync m16n8k16 bf16 (sm_80+: runs on sm_90 and sm_120). FP8: an e4m3 byte becomes a bf16 by
//          moving its bits (value * 2^-120), then one packed bf16 multiply by 2^120 * S (exact: power of two)
//          applies the block scale; K is permuted inside each 16-byte chunk (pairs (b0,b2), (b1,b3)) and x gets
//          the same permutation by byte_perm. bf16: K is permuted inside each 32-wide half (logical pairs
//          (2t, 2t+1) and (2t+8, 2t+9) of mma step st are physical 8t + 4st + {0,1} and {2,3}); x, read with
//          the same per-thread words, follows for free.
// Split-K (gridDim.y > 1): partials go to ws[g][split][B][n[g]]; the last block of each (group, row tile)
//          to arrive (counter in cnt, reset by that block, so graph replays see zeros) sums them in split
//          order: deterministic, and independent of which block arrives last.
// PDL:     the first K step's weights (constant) are loaded before pdl_wait(), so they are in flight while
//          the previous kernel drains; pdl_trigger() after the K loop lets the next kernel start meanwhile.
// FP8 x:   gemv_fp8x_nt{1,2} (1-16 rows, GemvQ8X): x as act_quant's e4m3 codes and per-128 scales, the official
//          FP8 linear (gemv_fp8x_step), for the linears whose input the official numerics quantise (wq_b, wo_b).
// Constraints: FP8 K % 16 == 0 (gemv_fp8x: K % 128 == 0), bf16 K % 8 == 0 (16-byte rows); scale exponent byte
//          <= 134 (scale <= 2^7).
// Variants / timings: kernels/BENCH_NOTES.md (fp8_gemv, attn_gemv before they were folded into this file;
//          the standalone split-K reduce launch is gone).
#include "common.cuh"

#define GEMV_GROUPS 8
#define GEMV_WARPS 8
#define GEMV_MT 2

struct GemvParams {
    const u16* x[GEMV_GROUPS];
    const void* w[GEMV_GROUPS];
    const u8* s[GEMV_GROUPS];  // FP8 scales (unused for bf16)
    void* out[GEMV_GROUPS];
    float* ws;  // [groups, splits, B, nmax] f32 when split
    u32* cnt;   // [groups, ceil(nmax/32)] zeros when split
    int n[GEMV_GROUPS];
    int B, K, nmax, out_bf16;
};

// The FP8 inputs of the FP8-activation GEMVs (gemv_fp8x here, gemv_wq8.cu): per group g, xq[g] e4m3 codes [B, K]
// and xs[g] f32 scales [B, K / 128] (act_quant's outputs: x = code * scale per (row, 128-wide K block)).
struct GemvQ8X {
    const u8* xq[GEMV_GROUPS];
    const float* xs[GEMV_GROUPS];
};

// 4 e4m3 bytes (b0..b3) -> bf16x2 raw bit patterns, value * 2^-120: lo = (b0, b2), hi = (b1, b3).
__device__ __forceinline__ void e4m3x4_raw(u32 w, u32& lo, u32& hi) {
    lo = ((w << 8) & 0x80008000u) | ((w << 4) & 0x07f007f0u);
    hi = (w & 0x80008000u) | ((w >> 4) & 0x07f007f0u);
}

// bf16x2 bits of 2^120 * 2^(e-127) in both halves: the UE8M0 block scale e (clamped to 134) that undoes
// e4m3x4_raw's 2^-120.
__device__ __forceinline__ u32 fp8_scale_x2(u32 e) {
    e = e > 134u ? 134u : e;
    const u32 f = (e + 120u) << 7;
    return f | (f << 16);
}

__device__ __forceinline__ u32 word_of(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// An MMA A fragment from word st of w0 (4 e4m3 weights of row g) and of w1 (row g + 8), scaled by f
// (fp8_scale_x2). PERM: the stored bytes are (b0, b2, b1, b3) (gemv_ring's staged layout), so reorder them first.
// Each word is decoded right after it is read: this order keeps both callers' SASS as it was before the helper.
template <bool PERM>
__device__ __forceinline__ void fp8_frag(u32 (&a)[4], const uint4& w0, const uint4& w1, int st, u32 f) {
    u32 lo0, hi0, lo1, hi1;
    e4m3x4_raw(PERM ? byte_perm(word_of(w0, st), 0u, 0x3120) : word_of(w0, st), lo0, hi0);
    e4m3x4_raw(PERM ? byte_perm(word_of(w1, st), 0u, 0x3120) : word_of(w1, st), lo1, hi1);
    a[0] = bf16x2_mul(lo0, f);
    a[1] = bf16x2_mul(lo1, f);
    a[2] = bf16x2_mul(hi0, f);
    a[3] = bf16x2_mul(hi1, f);
}

// The 8 weight loads of one 128-byte K step: wv[c][mt][h] = row (mt, h) bytes [128 kb + 64 c + 16 t, +16).
__device__ __forceinline__ void gemv_load_step(uint4 (&wv)[2][GEMV_MT][2], const u8* const (&wr)[GEMV_MT][2],
                                               const bool (&rv)[GEMV_MT][2], int kb, int t, int row_bytes) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const int off = kb * 128 + c * 64 + t * 16;
#pragma unroll
        for (int mt = 0; mt < GEMV_MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                wv[c][mt][h] = (off < row_bytes && rv[mt][h]) ? ldg_stream(wr[mt][h] + off) : zero;
    }
}

// One FP8 K step (128 values) of the block's 32 rows against NT batch tiles.
template <int NT>
__device__ __forceinline__ void gemv_fp8_step(float* acc, const uint4 (&wv)[2][GEMV_MT][2], u32 e,
                                              const u16* __restrict__ x, int kb, int g, int t, int B, int K) {
    const u32 f = fp8_scale_x2(e);
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const int k0 = kb * 128 + c * 64 + t * 16;
        u32 a[4][GEMV_MT][4];
#pragma unroll
        for (int st = 0; st < 4; ++st)
#pragma unroll
            for (int mt = 0; mt < GEMV_MT; ++mt)
                fp8_frag<false>(a[st][mt], wv[c][mt][0], wv[c][mt][1], st, f);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int b = j * 8 + g;
            const bool ok = k0 < K && b < B;
            const u16* xp = x + (u64)(ok ? b : 0) * K + (ok ? k0 : 0);
            const uint4 x0 = ok ? ldg_keep(xp) : zero;
            const uint4 x1 = ok ? ldg_keep(xp + 8) : zero;
            const u32 X[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
            for (int st = 0; st < 4; ++st) {
                const u32 b0 = byte_perm(X[2 * st], X[2 * st + 1], 0x5410);  // x[4st], x[4st+2]
                const u32 b1 = byte_perm(X[2 * st], X[2 * st + 1], 0x7632);  // x[4st+1], x[4st+3]
#pragma unroll
                for (int mt = 0; mt < GEMV_MT; ++mt)
                    mma_bf16_16816(&acc[(mt * NT + j) * 4], a[st][mt][0], a[st][mt][1], a[st][mt][2],
                                   a[st][mt][3], b0, b1);
            }
        }
    }
}

// One bf16 K step (64 values) of the block's 32 rows against NT batch tiles.
template <int NT>
__device__ __forceinline__ void gemv_bf16_step(float* acc, const uint4 (&wv)[2][GEMV_MT][2],
                                               const u16* __restrict__ x, int kb, int g, int t, int B, int K) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const int k0 = kb * 64 + c * 32 + t * 8;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int b = j * 8 + g;
            const bool ok = k0 < K && b < B;
            const uint4 xv = ok ? ldg_keep(x + (u64)b * K + k0) : zero;
#pragma unroll
            for (int st = 0; st < 2; ++st) {
                const u32 b0 = word_of(xv, 2 * st), b1 = word_of(xv, 2 * st + 1);
#pragma unroll
                for (int mt = 0; mt < GEMV_MT; ++mt)
                    mma_bf16_16816(&acc[(mt * NT + j) * 4], word_of(wv[c][mt][0], 2 * st),
                                   word_of(wv[c][mt][1], 2 * st), word_of(wv[c][mt][0], 2 * st + 1),
                                   word_of(wv[c][mt][1], 2 * st + 1), b0, b1);
            }
        }
    }
}

// One K step (one 128-wide scale block) of the block's 32 rows against NT batch tiles of e4m3 x codes: the official
// FP8 linear's block sum (products exact, summed in f32 from zero), then its promotion acc += blk * (s_w * s_x[col]),
// as gemv_wq8.cu. The codes become f16 pairs by one F2FP each (no scale: e4m3 values are f16 values) for f16 MMAs:
// ~3 instructions per 4 weights against gemv_fp8_step's ~9 bit moves. (sm_90's e4m3 mma.sync is this same F2FP +
// HMMA, plus an FADD per result.) K order: MMA q of chunk c takes word q of a thread's 16 bytes at 64 c + 16 t, its
// low pair as k (2t, 2t + 1) and high pair as (2t + 8, 2t + 9); x's word q at the same offset the same way, so the
// products pair up. Needs K % 128 == 0.
template <int NT>
__device__ __forceinline__ void gemv_fp8x_step(float* acc, const uint4 (&wv)[2][GEMV_MT][2], u32 e,
                                               const u8* __restrict__ xq, const float* __restrict__ xs, int kb,
                                               int g, int t, int B, int K) {
    const int kblocks = K >> 7;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 xv[NT][2];
    float sx[NT][2];  // the scales of columns 2t, 2t + 1 of each tile (zero past B: their sums are zero too)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int b = j * 8 + g, c0 = j * 8 + 2 * t;
        const u8* xp = xq + (u64)(b < B ? b : 0) * K + kb * 128 + t * 16;
        xv[j][0] = b < B ? ldg_keep(xp) : zero;
        xv[j][1] = b < B ? ldg_keep(xp + 64) : zero;
        sx[j][0] = c0 < B ? __ldg(xs + (u64)c0 * kblocks + kb) : 0.f;
        sx[j][1] = c0 + 1 < B ? __ldg(xs + (u64)(c0 + 1) * kblocks + kb) : 0.f;
    }
    float blk[GEMV_MT * NT * 4];
#pragma unroll
    for (int i = 0; i < GEMV_MT * NT * 4; ++i) blk[i] = 0.f;
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            u32 a[GEMV_MT][4];
#pragma unroll
            for (int mt = 0; mt < GEMV_MT; ++mt) {
                const u32 w0 = word_of(wv[c][mt][0], q), w1 = word_of(wv[c][mt][1], q);
                a[mt][0] = e4m3x2_f16x2<false>(w0);
                a[mt][1] = e4m3x2_f16x2<false>(w1);
                a[mt][2] = e4m3x2_f16x2<true>(w0);
                a[mt][3] = e4m3x2_f16x2<true>(w1);
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const u32 xw = word_of(xv[j][c], q);
                const u32 b0 = e4m3x2_f16x2<false>(xw), b1 = e4m3x2_f16x2<true>(xw);
#pragma unroll
                for (int mt = 0; mt < GEMV_MT; ++mt)
                    mma_f16_16816(&blk[(mt * NT + j) * 4], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
            }
        }
    const float sw = ue8m0_to_f32(e);
#pragma unroll
    for (int mt = 0; mt < GEMV_MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int a = (mt * NT + j) * 4 + i;
                acc[a] = fmaf(blk[a], sw * sx[j][i & 1], acc[a]);
            }
}

// Called by every thread after this block's partials are stored: the last block of the row tile reduces.
__device__ __forceinline__ void gemv_splitk_finish(const GemvParams& p, int g, int N, const float* ws) {
    const int tiles = (p.nmax + 31) >> 5;
    if (!block_arrives_last(p.cnt + (u64)g * tiles + blockIdx.x, gridDim.y)) return;
    const int row0 = blockIdx.x * 32;
    for (int i = threadIdx.x; i < 32 * p.B; i += blockDim.x) {
        const int row = row0 + (i & 31), b = i >> 5;
        if (row >= N) continue;
        float v = 0.f;
        for (int sp = 0; sp < (int)gridDim.y; ++sp) v += __ldcg(ws + ((u64)sp * p.B + b) * N + row);
        store_out(p.out[g], (u64)b * N + row, v, p.out_bf16);
    }
}

// XQ (FP8 weights only): x is e4m3 codes xq with scales xs (GemvQ8X) instead of p.x's bf16.
template <int NT, bool FP8, bool XQ>
__device__ __forceinline__ void gemv_grouped(const GemvParams& p, const u8* xq, const float* xs) {
    __shared__ float red[4 * GEMV_MT * NT * 4 * 32];
    const int grp = blockIdx.z, N = p.n[grp], B = p.B, K = p.K;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 32;
    const bool active = row0 < N;  // block-uniform: this group may have fewer row tiles than the largest
    const int row_bytes = FP8 ? K : 2 * K;
    const int ksteps = (row_bytes + 127) >> 7;
    const u8* w = (const u8*)p.w[grp];
    const u8* wr[GEMV_MT][2];
    bool rv[GEMV_MT][2];
#pragma unroll
    for (int mt = 0; mt < GEMV_MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + mt * 16 + h * 8 + g;
            rv[mt][h] = active && r < N;
            wr[mt][h] = w + (u64)(r < N ? r : 0) * row_bytes;
        }
    float acc[GEMV_MT * NT * 4];
#pragma unroll
    for (int i = 0; i < GEMV_MT * NT * 4; ++i) acc[i] = 0.f;
    const int kb0 = blockIdx.y * GEMV_WARPS + warp, kstride = gridDim.y * GEMV_WARPS;
    uint4 wv[2][GEMV_MT][2];
    if (active && kb0 < ksteps) gemv_load_step(wv, wr, rv, kb0, t, row_bytes);  // weights: before the wait
    pdl_wait();
    if (!active) return;
    const u16* x = p.x[grp];
    const u8* srow = FP8 ? p.s[grp] + (u64)(row0 >> 7) * ((K + 127) >> 7) : nullptr;
    for (int kb = kb0; kb < ksteps; kb += kstride) {
        if (kb != kb0) gemv_load_step(wv, wr, rv, kb, t, row_bytes);
        if (XQ)
            gemv_fp8x_step<NT>(acc, wv, srow[kb], xq, xs, kb, g, t, B, K);
        else if (FP8)
            gemv_fp8_step<NT>(acc, wv, srow[kb], x, kb, g, t, B, K);
        else
            gemv_bf16_step<NT>(acc, wv, x, kb, g, t, B, K);
    }
    pdl_trigger();  // the next kernel's start overlaps this block's reduction and store
    block_reduce_8warps<GEMV_MT * NT * 4>(acc, red);
    float* ws = gridDim.y > 1 ? p.ws + (u64)grp * gridDim.y * B * p.nmax : nullptr;
    if (warp == 0) {
#pragma unroll
        for (int mt = 0; mt < GEMV_MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = row0 + mt * 16 + g + (i >> 1) * 8;
                    const int b = j * 8 + 2 * t + (i & 1);
                    if (row >= N || b >= B) continue;
                    const float v = acc[(mt * NT + j) * 4 + i];
                    if (gridDim.y == 1) store_out(p.out[grp], (u64)b * N + row, v, p.out_bf16);
                    else ws[((u64)blockIdx.y * B + b) * N + row] = v;
                }
    }
    if (gridDim.y > 1) gemv_splitk_finish(p, grp, N, ws);
}

// Four resident blocks for 1-8 rows: every load of a block is issued at once, so resident blocks x 32 KB is what
// an SM has in flight. Unbounded, the FP8 kernel takes 79 registers (3 blocks); ptxas fits it in 64 without spills.
// 9-16 rows spill at 80 registers and keep their plain bound (an explicit minimum of 1 would change their SASS).
#define GEMV_BOUNDS_1 __launch_bounds__(256, 4)
#define GEMV_BOUNDS_2 __launch_bounds__(256)
#define GEMV_BOUNDS_4 __launch_bounds__(256)
#define GEMV_BOUNDS_8 __launch_bounds__(256)
#define GEMV_KERNELS(NT)                                                                                   \
    extern "C" __global__ void GEMV_BOUNDS_##NT gemv_fp8_nt##NT(GemvParams p) {                         \
        gemv_grouped<NT, true, false>(p, nullptr, nullptr);                                                \
    }                                                                                                      \
    extern "C" __global__ void GEMV_BOUNDS_##NT gemv_bf16_nt##NT(GemvParams p) {                        \
        gemv_grouped<NT, false, false>(p, nullptr, nullptr);                                               \
    }
GEMV_KERNELS(1)
GEMV_KERNELS(2)
GEMV_KERNELS(4)
GEMV_KERNELS(8)

// gemv_fp8x for 1-16 rows. 3 blocks per SM at 1-8 rows (73 registers, no spills; at 64 registers, 4 blocks, it
// spilled and took wq_b + iwq_b 14.0 -> 18.0 us), 2 at 9-16 (116). Wider forms are not built: at NT 4-8 they held
// 166-255 registers (one block per SM) and ran 1.5-3x slower than either ring (kbench gemv-q8 / gemv-ab at 32-64
// rows, kernels/BENCH_NOTES.md, twenty-fifth session).
#define GEMV_FP8X_KERNEL(NT, BLOCKS)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, BLOCKS)                                              \
        gemv_fp8x_nt##NT(GemvParams p, const __grid_constant__ GemvQ8X q) {                                \
        gemv_grouped<NT, true, true>(p, q.xq[blockIdx.z], q.xs[blockIdx.z]);                               \
    }
GEMV_FP8X_KERNEL(1, 3)
GEMV_FP8X_KERNEL(2, 2)
#undef GEMV_FP8X_KERNEL
