// Tensor-core GEMMs of the batched prefill (spec 2.4-2.8, 5): many tokens x one weight, weights read as
// stored (FP8 e4m3 + UE8M0 128x128 scales, FP4 e2m1 + per-32 UE8M0 scales, or bf16), never dequantised in
// global memory.
//
// Math:    y[m, n] = sum_k x[m, k] * W[n, k], f32 accumulation; x bf16 [M, K] row-major; y f32 or bf16 [M, N].
//          FP8: W = e4m3(Wq[n, k]) * S[n / 128, k / 128]; FP4: W = e2m1(Wq[e, n, k]) * S[e, n, k / 32].
//          The weight values are exact in bf16 (a few significant bits times a power of two), so the products
//          are those of the official FP8/FP4 GEMM on the (already fake-quantised, official numerics) bf16
//          activations; only the f32 summation order differs.
// Dense (pf_gemm_{fp8,bf16}_mX): up to 8 groups (blockIdx.z) sharing M and K with their own x, W, S, y, N: wq_a
//          + wkv, wq_b + the indexer's wq_b, the 8 wo_a groups, the shared expert's w1 + w3 each take one launch.
// Expert (pf_gemm_fp4_expert_mX): rows are gathered per routed expert: tiles[0] = number of row tiles, then per
//          tile (expert, begin, rows) into `order` (slot ids sorted by expert, see pf_moe_group); row r of a
//          tile reads x row order[begin + r] / topk (x_per_slot = 0: w1/w3 read the token) or order[begin + r]
//          (w2 reads its slot's hidden row) and writes y row order[begin + r]. Each expert's weights are read
//          once per row tile (one tile per expert unless it holds more than BM rows). Groups = w1 and w3.
// Tiles:   block 256 threads = 8 warps as 2 (M) x 4 (N); BM = 32*MT rows (MT = 2 or 4), BN = 128, BK = 64.
//          Warp tile (16*MT) x 32: MT x 4 mma m16n8k16 per 16-wide k step, fragments by ldmatrix.
// Memory:  x tiles go global -> shared with cp.async; weight tiles are loaded into registers one K tile
//          ahead, converted to bf16 (FP8: byte moves + one packed multiply per pair; FP4, in the device layout
//          of fp4_layout.cu: a rotation + mask + one multiply per pair, then byte moves to natural order) and stored to shared memory after the current tile's mma: a 2-stage pipeline. Shared rows
//          are 72 bf16 (144 B) so ldmatrix reads are conflict-free. Dynamic shared memory: 2 * (BM + 128) * 144 B.
// Grid:    dense (ceil(M/BM), ceil(Nmax/128), groups): consecutive blocks share a weight tile (weights stream
//          from DRAM about once). Expert: (max tiles, ceil(N/128), groups); blocks past tiles[0] exit.
// Constraints: K % 16 == 0 (bf16: K % 8 == 0; FP4: K % 32 == 0): a 16-byte chunk is wholly inside or outside K.
// Variants / timings (H200, full-size synthetic model, one 2048-token call summed over 43 layers): dense
//          FP8 ~150-210 TFLOP/s (attention projections 60 ms, output 55 ms), routed experts at ~48 rows per
//          expert (bm 64) ~117 TFLOP/s (227 ms); an 8192-token call (bm 128 experts) ~170 TFLOP/s. A 32-row
//          expert tile for short calls (1K prompt: ~24 rows per expert) was slower than 64 (TTFT 273 -> 297 ms):
//          each tile converts its expert's weights whatever its rows, so fewer rows per tile only adds tiles.
//          Now (one call, 43 layers): 1K prompt TTFT 280 ms (routed 152, attn.proj 34, attn.out 28, shared 11),
//          8K prompt 5073 tok/s (routed 618, attn.proj 227, attn.out 212, shared 79).
// Tried, not kept (kernels/BENCH_NOTES.md "Prefill GEMM"): a 3-4 stage cp.async ring of the weights as stored
//          (converted from shared memory): slower (1K 309 ms, 8K 4849 tok/s); skipping the mma of 16-row slices
//          past a tile's rows (warps split wm = warp / 4): 1K routed 152 -> 146 ms but every 8K GEMM 3-5% slower.
//          FP8 mma.sync (m16n8k32 e4m3) is no faster here: on sm_90 ptxas lowers it to F2FP unpacks + two f16
//          HMMA.16816 (native QMMA only on sm_89 / sm_120); Hopper's FP8 rate needs wgmma (sm_90a).
#include "common.cuh"

#define PF_BN 128
#define PF_BK 64
#define PF_LDS 72
#define PF_GROUPS 8
#define PF_WT_BF16 0
#define PF_WT_FP8 1
#define PF_WT_FP4 2

struct PfGemm {
    const u16* x[PF_GROUPS];
    const void* w[PF_GROUPS];
    const u8* s[PF_GROUPS];
    void* out[PF_GROUPS];
    const int* tiles;  // expert mode only
    const int* order;  // expert mode only
    int n[PF_GROUPS];
    int M, K, out_bf16, topk, x_per_slot, pad;
};

// Loads one weight K tile into registers (FP8: 2 x 16 B per thread; FP4: 1 x 16 B; bf16 uses cp.async).
template <int WT>
struct PfWeightRegs {
    uint4 v[WT == PF_WT_FP8 ? 2 : 1];
    u32 f[WT == PF_WT_FP8 ? 2 : 1];
};

template <int WT>
__device__ __forceinline__ void pf_load_w(const PfGemm& p, int g, int expert, int n0, int N, int k0,
                                          PfWeightRegs<WT>& r) {
    const int tid = threadIdx.x, K = p.K;
    if (WT == PF_WT_FP8) {
        const u8* w = (const u8*)p.w[g];
        const int kb = (K + 127) >> 7;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int c = tid + 256 * j, row = c >> 2, k = k0 + (c & 3) * 16, n = n0 + row;
            const bool ok = n < N && k < K;
            r.v[j] = ok ? ldg_stream(w + (u64)n * K + k) : make_uint4(0, 0, 0, 0);
            r.f[j] = ok ? fp8_scale_x2(p.s[g][(n >> 7) * kb + (k >> 7)]) : 0u;
        }
    } else if (WT == PF_WT_FP4) {
        const int row = tid >> 1, k = k0 + (tid & 1) * 32, n = n0 + row;
        const bool ok = n < N && k < K;
        const u8* w = (const u8*)p.w[g] + (u64)expert * N * (K / 2) + fp4_w_at(n, k / 2, N, K);  // device layouts
        const u64 si = (u64)expert * N * (K / 32) + fp4_scale_at(n, k / 32, N, K);
        r.v[0] = ok ? ldg_stream(w) : make_uint4(0, 0, 0, 0);
        r.f[0] = ok ? pf_fp4_scale(p.s[g][si]) : 0u;
    }
}

// Converts the staged weight registers to bf16 and stores them into the [128][PF_LDS] tile Bs.
template <int WT>
__device__ __forceinline__ void pf_store_w(const PfWeightRegs<WT>& r, u16* Bs) {
    const int tid = threadIdx.x;
    if (WT == PF_WT_FP8) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int c = tid + 256 * j, row = c >> 2, kc = (c & 3) * 16;
            u32 o[8];
            pf_fp8x16(r.v[j], r.f[j], o);
            uint4* d = (uint4*)(Bs + row * PF_LDS + kc);
            d[0] = make_uint4(o[0], o[1], o[2], o[3]);
            d[1] = make_uint4(o[4], o[5], o[6], o[7]);
        }
    } else if (WT == PF_WT_FP4) {
        const int row = tid >> 1, kc = (tid & 1) * 32;
        u32 o[16];
        pf_fp4x32(r.v[0], r.f[0], o);
        uint4* d = (uint4*)(Bs + row * PF_LDS + kc);
#pragma unroll
        for (int q = 0; q < 4; ++q) d[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
    }
}

// bf16 weights: cp.async of 128 rows x 64 k (4 x 16 B per thread).
__device__ __forceinline__ void pf_async_w_bf16(const PfGemm& p, int g, int n0, int N, int k0, u16* Bs) {
    const u16* w = (const u16*)p.w[g];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = threadIdx.x + 256 * j, row = c >> 3, kc = (c & 7) * 8;
        const int n = n0 + row, k = k0 + kc;
        const bool ok = n < N && k < p.K;
        pf_cp16(smem_u32(Bs + row * PF_LDS + kc), ok ? (const void*)(w + (u64)n * p.K + k) : (const void*)w, ok);
    }
}

template <int MT, int WT, bool EXPERT>
__device__ __forceinline__ void pf_gemm_body(const PfGemm& p) {
    pdl_wait();  // before any read: the previous kernel may still be running (PDL)
    extern __shared__ __align__(16) u8 pf_dyn_smem[];
    constexpr int BM = 32 * MT;
    u16* As = (u16*)pf_dyn_smem;         // [2][BM][PF_LDS]
    u16* Bs = As + 2 * BM * PF_LDS;      // [2][PF_BN][PF_LDS]
    const int g = blockIdx.z, N = p.n[g];
    const int n0 = blockIdx.y * PF_BN;
    if (n0 >= N) return;
    int m0, rows, expert = 0;
    if (EXPERT) {
        const int tile = blockIdx.x;
        if (tile >= p.tiles[0]) return;
        expert = p.tiles[1 + 3 * tile];
        m0 = p.tiles[2 + 3 * tile];
        rows = p.tiles[3 + 3 * tile];
    } else {
        m0 = blockIdx.x * BM;
        rows = min(BM, p.M - m0);
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 1, wn = warp >> 1, K = p.K;
    const u16* x = p.x[g];

    // This thread's x rows (MT chunks of 16 B per K tile), fixed for the whole K loop.
    const u16* arow[MT];
    bool aok[MT];
#pragma unroll
    for (int j = 0; j < MT; ++j) {
        const int row = (tid + 256 * j) >> 3;
        aok[j] = row < rows;
        u64 xr = 0;
        if (aok[j]) {
            if (EXPERT) {
                const int slot = p.order[m0 + row];
                xr = (u64)(p.x_per_slot ? slot : slot / p.topk);
            } else {
                xr = (u64)(m0 + row);
            }
        }
        arow[j] = x + xr * K;
    }
    auto load_a = [&](int stage, int k0) {
        u16* dst = As + stage * BM * PF_LDS;
#pragma unroll
        for (int j = 0; j < MT; ++j) {
            const int c = tid + 256 * j, row = c >> 3, kc = (c & 7) * 8;
            const bool ok = aok[j] && k0 + kc < K;
            pf_cp16(smem_u32(dst + row * PF_LDS + kc), ok ? (const void*)(arow[j] + k0 + kc) : (const void*)x, ok);
        }
    };

    float acc[MT][4][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

    const int ktiles = (K + PF_BK - 1) / PF_BK;
    PfWeightRegs<WT> wr;
    load_a(0, 0);
    if (WT == PF_WT_BF16) pf_async_w_bf16(p, g, n0, N, 0, Bs);
    cp_async_commit();
    if (WT != PF_WT_BF16) {
        pf_load_w<WT>(p, g, expert, n0, N, 0, wr);
        pf_store_w<WT>(wr, Bs);
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        const int cur = kt & 1;
        const bool next = kt + 1 < ktiles;
        if (next) {
            load_a(cur ^ 1, (kt + 1) * PF_BK);
            if (WT == PF_WT_BF16) pf_async_w_bf16(p, g, n0, N, (kt + 1) * PF_BK, Bs + (cur ^ 1) * PF_BN * PF_LDS);
            cp_async_commit();
            if (WT != PF_WT_BF16) pf_load_w<WT>(p, g, expert, n0, N, (kt + 1) * PF_BK, wr);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const u16* At = As + cur * BM * PF_LDS;
        const u16* Bt = Bs + cur * PF_BN * PF_LDS;
#pragma unroll
        for (int ks = 0; ks < PF_BK / 16; ++ks) {
            u32 a[MT][4], b[4][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) pf_frag_a(At, PF_LDS, wm * MT * 16 + mt * 16, ks * 16, a[mt]);
            pf_frag_b(Bt, PF_LDS, wn * 32, ks * 16, b[0], b[1]);
            pf_frag_b(Bt, PF_LDS, wn * 32 + 16, ks * 16, b[2], b[3]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) pf_mma(acc[mt][nt], a[mt], b[nt]);
        }
        if (next && WT != PF_WT_BF16) pf_store_w<WT>(wr, Bs + (cur ^ 1) * PF_BN * PF_LDS);
        __syncthreads();
    }

    const int gq = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wm * MT * 16 + mt * 16 + gq + h * 8;
            if (r >= rows) continue;
            const u64 orow = EXPERT ? (u64)p.order[m0 + r] : (u64)(m0 + r);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int c = n0 + wn * 32 + nt * 8 + 2 * t;
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    if (c + i < N) store_out(p.out[g], orow * N + c + i, acc[mt][nt][h * 2 + i], p.out_bf16);
            }
        }
}

// Two blocks per SM (128 registers a thread) for every tile size: one 8-warp block alone cannot hide the
// global-load latency.
#define PF_GEMM_KERNEL(NAME, MT, WT, EXPERT) \
    extern "C" __global__ void __launch_bounds__(256, 2) NAME(PfGemm p) { pf_gemm_body<MT, WT, EXPERT>(p); }
PF_GEMM_KERNEL(pf_gemm_bf16_m64, 2, PF_WT_BF16, false)
PF_GEMM_KERNEL(pf_gemm_bf16_m128, 4, PF_WT_BF16, false)
PF_GEMM_KERNEL(pf_gemm_fp8_m64, 2, PF_WT_FP8, false)
PF_GEMM_KERNEL(pf_gemm_fp8_m128, 4, PF_WT_FP8, false)
PF_GEMM_KERNEL(pf_gemm_fp4_expert_m64, 2, PF_WT_FP4, true)
PF_GEMM_KERNEL(pf_gemm_fp4_expert_m128, 4, PF_WT_FP4, true)
