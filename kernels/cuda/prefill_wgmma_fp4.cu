// Routed FP4 experts of the batched prefill on Hopper's wgmma (sm_90a only): the grouped w1/w3 and w2 GEMMs of
// pf_gemm_fp4_expert (same PfGemm parameters, row tiles and order from pf_moe_group), with the FP4 weights decoded
// straight into wgmma's register A operand (no bf16 copy of the experts anywhere, not even in shared memory).
//
// Math:    y[slot, n] = sum_k x[r(slot), k] * W[e, n, k], W = e2m1 * UE8M0 scale per 32 k (exact in bf16), f32
//          accumulation by the tensor core through the whole K: the products of pf_gemm_fp4_expert, only the f32
//          summation order differs. Rows r(slot), outputs per slot and groups (w1 + w3) as in prefill_gemm.cu.
// Swap AB: the weights are wgmma's M side (each warpgroup 64 output rows, A from registers) and the tile's
//          gathered rows its N side (NT = 16..256 columns, B from shared memory): an expert with 24 rows costs a
//          32-column wgmma, not a 64-row tile, and one pass over its weights serves up to 256 rows.
// K order: a thread's A fragment holds, per k16 step, the k pairs (2t, 2t+1) and (2t+8, 2t+9) of its rows g and
//          g+8 (t = lane % 4, g = lane / 4 of its warp's 16 rows); a device-layout FP4 word gives the bf16 pairs
//          (2i, 2i+1), i < 4, of 8 consecutive k (fp4_pairs). So each 128-wide K chunk is summed in a permuted
//          order: in k32 sub-chunk j thread t decodes word 4t + j of its rows' chunk (its 32-k scale group is t),
//          and pair i of that word feeds step 2j + i/2, slot a0/a1 (i even) or a2/a3 (i odd). x must be stored in
//          the same order: pf_kperm writes x' [rows, Kp] (Kp = K rounded up to 128, zero padded) with the bf16
//          pair q = 16j + 4i + t of each chunk = x[8(4t + j) + 2i] and x[8(4t + j) + 2i + 1] (x's own pair
//          16t + 4j + i: a permutation of 4-byte words); w2's input h' comes in that order straight from the
//          SwiGLU (pf_swiglu_kperm, prefill_swiglu.cu). A permutation of K changes no product, only (again) the
//          order of the f32 sums.
// Launch:  grid (ceil(N / 128), max tiles, groups), 256 threads = 2 warpgroups; block (x, y) multiplies weight
//          rows 128x .. 128x + 127 of tile y's expert by the tile's rows (blocks past tiles[0] exit), so the blocks
//          that read one tile's x run together and x comes from L2 after the first. The tile's row count picks NT
//          (the smallest instance >= rows). Two kernels: pf_wgmma_fp4_expert (tiles of <= 256 rows, one block per
//          SM) and pf_wgmma_fp4_expert_s (<= 64 rows, half the ring, two blocks per SM: short prompts, where the
//          decode and load latencies, not the tensor cores, set the pace).
// Memory:  a ring of STAGES(NT) stages of one 128-k chunk: x' [2 halves][NT rows][128 B] in the 128-byte swizzle
//          of prefill_wgmma.cu (descriptor SBO 1024, k16 steps 32 B apart), then the raw FP4 weights
//          [128 rows][64 B]; both by cp.async (x rows past the tile's are not copied: their columns are never
//          stored; weight rows past N and k past K are zero-filled), and the rows' scale words of the chunk (the
//          device scale layout, K % 128 == 0: 128 x 4 contiguous bytes) in a ring of their own; the checkpoint
//          scale layout (K % 128 != 0, tests) is read from global one chunk ahead. 225 KB (112 KB) of shared memory.
// Compute: per chunk: wait for its stage, fence.proxy.async, barrier, refill the stage read two chunks ago; each
//          thread loads its two rows' 16 raw bytes and, per k32 sub-chunk, decodes 2 words into 8 registers (a
//          rotate/mask and one bf16x2 multiply per pair), then 2 wgmma m64nNTk16 and a commit. Three groups stay
//          in flight while the next sub-chunk decodes (wait 3 before it overwrites registers read 4 commits ago).
//          The first wgmma of a tile overwrites the accumulators: zero-filling them instead made ptxas serialize
//          the wgmma pipeline of some instances (C7515), as did a run-time branch on the scale layout (a template
//          parameter now). The SASS keeps `WARPGROUP.DEPBAR.LE gsb0, 0x3` in every loop; check after edits.
// Constraints: K % 32 == 0 (the FP4 rule); sm_90a only (elsewhere a trap; the host gates on has_wgmma). Uses
//          the wgmma helpers of common.cuh, PFW_ENABLED of prefill_wgmma.cu and PfGemm of prefill_gemm.cu (same
//          translation unit; both sort first).
// Timings (H200, kbench pfexp: 256 experts, hidden 4096, intermediate 2048, top-6 of uniform routing; us per
//          layer for w1+w3 / w2, TFLOP/s): M = 1024 tokens: pf_gemm_fp4_expert bm64 2743 / 1434 (75 / 72),
//          pf_wgmma_fp4_expert_s 952 / 508 (217 / 203), pf_wgmma_fp4_expert 1210 / 677 (170 / 152); M = 8192:
//          pf_gemm_fp4_expert bm128 8707 / 4710 (189 / 175), pf_wgmma_fp4_expert tiles of 256 3723 / 2176
//          (443 / 379), of 128 4091 / 2397 (403 / 344); pf_kperm of x / h 10 / 23 us (1K), 55 / 149 us (8K) (the
//          engine's h' now comes from pf_swiglu_kperm). Before the scale ring (scales read from global one chunk
//          ahead) the 1K GEMMs took 1486 / 837 us: a DRAM round trip a chunk.
#include "common.cuh"

#define PFX_ROWS 128                          // weight rows of a block (2 warpgroups x 64)
#define PFX_WBYTES (PFX_ROWS * 64)            // raw FP4 bytes of one stage: 128 rows x 128 k
#define PFX_RING (216 * 1024)                 // ring bytes of pf_wgmma_fp4_expert: 3 stages at NT = 256
#define PFX_RING_S (104 * 1024)               // ... of pf_wgmma_fp4_expert_s (two blocks per SM): 4 at NT = 64
#define PFX_SRING (12 * 512)                  // the scale words' ring: 128 rows x 4 B, up to 12 stages

// x [rows, K] -> x' [rows, Kp] in the K order above. One thread per (row, 128-chunk, j): reads the 4 physical
// 16-byte pieces 4t + j (t < 4) and writes the 64 logical bytes 64 j .. 64 j + 63 of the chunk. Portable.
struct PfKperm {
    const u16* x;
    u16* out;
    int rows, k;
};

extern "C" __global__ void __launch_bounds__(256) pf_kperm(PfKperm p) {
    pdl_wait();
    const int kc = (p.k + 127) >> 7;
    const u64 i = (u64)blockIdx.x * 256 + threadIdx.x;
    if (i >= (u64)p.rows * kc * 4) return;
    const u64 row = i / ((u64)kc * 4);
    const int c = (int)(i / 4 % kc), j = (int)(i & 3);
    uint4 v[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int k = c * 128 + 8 * (4 * t + j);
        v[t] = k < p.k ? ldg_keep(p.x + row * p.k + k) : make_uint4(0, 0, 0, 0);
    }
    // Physical piece t holds the pairs (k0, k1) (k2, k3) (k4, k5) (k6, k7): pair i is its word i.
    const u32 o[4][4] = {{v[0].x, v[1].x, v[2].x, v[3].x},
                         {v[0].y, v[1].y, v[2].y, v[3].y},
                         {v[0].z, v[1].z, v[2].z, v[3].z},
                         {v[0].w, v[1].w, v[2].w, v[3].w}};
    uint4* d = (uint4*)(p.out + row * (u64)(kc * 128) + c * 128 + 32 * j);
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = make_uint4(o[i][0], o[i][1], o[i][2], o[i][3]);
}

#if defined(PFW_ENABLED)

// wgmma m64nNTk16, A (4 registers a thread) from registers, B by descriptor, d (+)= A . B (NT / 2 accumulators;
// acc = 0 overwrites d). The operand strings list %0 .. %(NT/2 - 1) for d, then a, b and acc.
#define PFX_S1 "%0, %1, %2, %3, %4, %5, %6, %7"
#define PFX_S2 PFX_S1 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define PFX_S3 PFX_S2 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define PFX_S4 PFX_S3 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define PFX_S5 PFX_S4 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define PFX_S6 PFX_S5 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define PFX_S7 PFX_S6 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define PFX_S8 PFX_S7 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define PFX_S9 PFX_S8 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define PFX_S10 PFX_S9 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define PFX_S11 PFX_S10 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define PFX_S12 PFX_S11 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define PFX_S13 PFX_S12 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define PFX_S14 PFX_S13 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define PFX_S15 PFX_S14 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define PFX_S16 PFX_S15 ", %120, %121, %122, %123, %124, %125, %126, %127"
#define PFX_R8(d, i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define PFX_R1(d) PFX_R8(d, 0)
#define PFX_R2(d) PFX_R1(d), PFX_R8(d, 8)
#define PFX_R3(d) PFX_R2(d), PFX_R8(d, 16)
#define PFX_R4(d) PFX_R3(d), PFX_R8(d, 24)
#define PFX_R5(d) PFX_R4(d), PFX_R8(d, 32)
#define PFX_R6(d) PFX_R5(d), PFX_R8(d, 40)
#define PFX_R7(d) PFX_R6(d), PFX_R8(d, 48)
#define PFX_R8x(d) PFX_R7(d), PFX_R8(d, 56)
#define PFX_R9(d) PFX_R8x(d), PFX_R8(d, 64)
#define PFX_R10(d) PFX_R9(d), PFX_R8(d, 72)
#define PFX_R11(d) PFX_R10(d), PFX_R8(d, 80)
#define PFX_R12(d) PFX_R11(d), PFX_R8(d, 88)
#define PFX_R13(d) PFX_R12(d), PFX_R8(d, 96)
#define PFX_R14(d) PFX_R13(d), PFX_R8(d, 104)
#define PFX_R15(d) PFX_R14(d), PFX_R8(d, 112)
#define PFX_R16(d) PFX_R15(d), PFX_R8(d, 120)

template <int NT>
__device__ __forceinline__ void pfx_mma(float (&d)[NT / 2], const u32 (&a)[4], u64 b, u32 acc);

// S / R: the operand-list macros for NT / 16 groups of 8 accumulators; A0..ONE: the numbers that follow them.
#define PFX_MMA(NT, S, R, A0, A1, A2, A3, B, ONE)                                                             \
    template <>                                                                                              \
    __device__ __forceinline__ void pfx_mma<NT>(float (&d)[NT / 2], const u32(&a)[4], u64 b, u32 acc) {               \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ONE ", 0;\n"                                       \
                     "wgmma.mma_async.sync.aligned.m64n" #NT "k16.f32.bf16.bf16 {" S "}, {%" A0 ", %" A1       \
                     ", %" A2 ", %" A3 "}, %" B ", p, 1, 1, 0;\n}\n"                                            \
                     : R(d)                                                                                  \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));                          \
    }
PFX_MMA(16, PFX_S1, PFX_R1, "8", "9", "10", "11", "12", "13")
PFX_MMA(32, PFX_S2, PFX_R2, "16", "17", "18", "19", "20", "21")
PFX_MMA(48, PFX_S3, PFX_R3, "24", "25", "26", "27", "28", "29")
PFX_MMA(64, PFX_S4, PFX_R4, "32", "33", "34", "35", "36", "37")
PFX_MMA(96, PFX_S6, PFX_R6, "48", "49", "50", "51", "52", "53")
PFX_MMA(128, PFX_S8, PFX_R8x, "64", "65", "66", "67", "68", "69")
PFX_MMA(160, PFX_S10, PFX_R10, "80", "81", "82", "83", "84", "85")
PFX_MMA(192, PFX_S12, PFX_R12, "96", "97", "98", "99", "100", "101")
PFX_MMA(224, PFX_S14, PFX_R14, "112", "113", "114", "115", "116", "117")
PFX_MMA(256, PFX_S16, PFX_R16, "128", "129", "130", "131", "132", "133")

// Ring depth for NT columns: as many (x', weights) stages as `ring` bytes hold, at most 12.
__host__ __device__ constexpr int pfx_stages(int nt, int ring) {
    return ring / (PFX_WBYTES + nt * 256) < 12 ? ring / (PFX_WBYTES + nt * 256) : 12;
}

// What one block works on: its group, expert, tile rows and the per-row tables in shared memory.
struct PfxTile {
    const u8* w;       // the expert's weights (its rows at fp4_w_at)
    const u8* s;       // the expert's scales
    const u8* x;       // x' of the group
    const int* slot;   // [NT] output slot of each tile row (shared)
    const u32* xrow;   // [NT] x' row of each tile row (shared)
    u32 base, sring;   // shared addresses of the ring and of the scale ring
    int N, K, n0, rows, xbytes;  // xbytes: bytes of one x' row (2 Kp)
};

// cp.async of chunk kb into stage `stage`: x' rows < t.rows (16 threads a row, 16 B each), the block's 128
// weight rows x 64 B (4 threads a row; rows past N and k past K zero-filled) and, in the device scale layout,
// the rows' scale words of the chunk (one thread a row).
template <int NT, bool SDEV>
__device__ __forceinline__ void pfx_load(const PfxTile& t, int kb, int stage) {
    const int tid = threadIdx.x, c16 = tid & 15;
    const u32 st = t.base + stage * (PFX_WBYTES + NT * 256);
    if (SDEV && tid < PFX_ROWS) {
        const bool ok = t.n0 + tid < t.N;
        const u8* src = t.s + ((u64)kb * t.N + t.n0 + tid) * 4;
        cp_async4(t.sring + stage * 512 + tid * 4, ok ? (const void*)src : (const void*)t.s, ok ? 4u : 0u);
    }
    const u32 xdst = st + (c16 >> 3) * NT * 128;
#pragma unroll
    for (int i = 0; i < NT / 16; ++i) {
        const int r = (tid >> 4) + 16 * i;
        if (r < t.rows) {
            const u8* src = t.x + (u64)t.xrow[r] * t.xbytes + kb * 256 + c16 * 16;
            cp_async16(xdst + r * 128 + (((c16 & 7) ^ (r & 7)) << 4), src, 16u);
        }
    }
    const u32 wdst = st + NT * 256;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int c = tid + 256 * i, r = c >> 2, part = c & 3;
        const bool ok = t.n0 + r < t.N && kb * 128 + part * 32 < t.K;
        const u8* src = t.w + fp4_w_at(t.n0 + r, kb * 64 + part * 16, t.N, t.K);  // device layout (tiles)
        cp_async16(wdst + r * 64 + part * 16, ok ? (const void*)src : (const void*)t.w, ok ? 16u : 0u);
    }
}

// This thread's scale bytes of chunk kb for its rows n and n + 8 from global memory (checkpoint scale layout,
// K % 128 != 0); 0 outside N and K.
__device__ __forceinline__ void pfx_scales(const PfxTile& t, int kb, int n, u32 (&e)[2]) {
    const int gi = 4 * kb + (threadIdx.x & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = n + 8 * h;
        e[h] = r < t.N && gi < t.K / 32 ? (u32)__ldg(t.s + fp4_scale_at(r, gi, t.N, t.K)) : 0u;
    }
}

// Decodes word j of the two raw rows (lo: row g, hi: row g + 8) into the A registers of k16 steps 2j, 2j + 1.
__device__ __forceinline__ void pfx_decode(u32 lo, u32 hi, u32 flo, u32 fhi, u32 (&a0)[4], u32 (&a1)[4]) {
    u32 p[4], q[4];
    fp4_pairs(lo, p);
    fp4_pairs(hi, q);
    a0[0] = bf16x2_mul(p[0], flo);
    a0[1] = bf16x2_mul(q[0], fhi);
    a0[2] = bf16x2_mul(p[1], flo);
    a0[3] = bf16x2_mul(q[1], fhi);
    a1[0] = bf16x2_mul(p[2], flo);
    a1[1] = bf16x2_mul(q[2], fhi);
    a1[2] = bf16x2_mul(p[3], flo);
    a1[3] = bf16x2_mul(q[3], fhi);
}

__device__ __forceinline__ u32 pfx_word(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// Stores the warpgroup's 64 x NT tile: value i of a thread is weight row 16 warp + g + 8 ((i/2) % 2), tile row
// 8 (i/4) + 2t + i%2 (the wgmma accumulator layout).
template <int NT>
__device__ __forceinline__ void pfx_store(const PfGemm& p, const PfxTile& t, int g, const float (&acc)[NT / 2]) {
    const int lane = threadIdx.x & 31;
    const int n = t.n0 + 64 * (threadIdx.x >> 7) + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) {
        const int r = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1), row = n + 8 * ((i >> 1) & 1);
        if (r < t.rows && row < t.N) store_out(p.out[g], (u64)t.slot[r] * t.N + row, acc[i], p.out_bf16);
    }
}

// SDEV: K % 128 == 0, the device scale layout (staged through the scale ring); else the checkpoint layout, read
// from global one chunk ahead. A template parameter: a run-time branch on it makes ptxas serialize the wgmmas.
template <int NT, bool SDEV, int RING>
__device__ __forceinline__ void pfx_run(const PfGemm& p, const PfxTile& t, int g) {
    constexpr int STAGES = pfx_stages(NT, RING), AHEAD = STAGES - 2, SB = PFX_WBYTES + NT * 256;
    const int kbs = (t.K + 127) >> 7, tid = threadIdx.x, lane = tid & 31;
    const int wrow = 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + (lane >> 2);  // this thread's row g in the block
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < kbs) pfx_load<NT, SDEV>(t, s, s);
        cp_async_commit();
    }
    // No zero fill: the first wgmma overwrites (with zeroed accumulators, ptxas serialized the wgmma pipeline
    // of some instances, C7515).
    float acc[NT / 2];
    u32 e[2] = {0u, 0u};
    if (!SDEV) pfx_scales(t, 0, t.n0 + wrow, e);

    for (int kb = 0; kb < kbs; ++kb) {
        cp_async_wait<AHEAD - 1>();
        fence_proxy_async();
        __syncthreads();  // chunk kb is in for all; every warpgroup is done with the stage refilled below
        const int nk = kb + AHEAD;
        if (nk < kbs) pfx_load<NT, SDEV>(t, nk, nk % STAGES);
        cp_async_commit();
        const u32 st = t.base + (kb % STAGES) * SB;
        uint4 lo, hi;
        const u32 wa = st + NT * 256 + wrow * 64 + 16 * (lane & 3);
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(lo.x), "=r"(lo.y), "=r"(lo.z), "=r"(lo.w) : "r"(wa));
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(hi.x), "=r"(hi.y), "=r"(hi.z), "=r"(hi.w)
                     : "r"(wa + 8 * 64));
        if (SDEV) {  // byte t of the rows' staged scale words (the chunk's 4 groups)
            const u32 sa = t.sring + (kb % STAGES) * 512 + wrow * 4, sh = 8 * (lane & 3);
            u32 wl, wh;
            asm volatile("ld.shared.u32 %0, [%1];" : "=r"(wl) : "r"(sa));
            asm volatile("ld.shared.u32 %0, [%1];" : "=r"(wh) : "r"(sa + 8 * 4));
            e[0] = (wl >> sh) & 255u;
            e[1] = (wh >> sh) & 255u;
        }
        const u32 flo = pf_fp4_scale(e[0]), fhi = pf_fp4_scale(e[1]);
        if (!SDEV && kb + 1 < kbs) pfx_scales(t, kb + 1, t.n0 + wrow, e);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            u32 a0[4], a1[4];
            wgmma_wait<3>();  // the group that read these registers' previous values (4 commits ago) is done
            pfx_decode(pfx_word(lo, j), pfx_word(hi, j), flo, fhi, a0, a1);
            const u32 b = st + (j >> 1) * NT * 128 + (j & 1) * 64;
            wgmma_fence();
            pfx_mma<NT>(acc, a0, wgmma_desc_sw128(b), (kb | j) != 0);
            pfx_mma<NT>(acc, a1, wgmma_desc_sw128(b + 32), 1u);
            wgmma_commit();
        }
    }
    wgmma_wait<0>();
    pfx_store<NT>(p, t, g, acc);
}
#endif

// The block's tile and its dispatch to the instance of NT columns (the smallest >= the tile's rows). RING: the
// ring bytes; MAXNT: the most rows a tile may hold.
template <int RING, int MAXNT>
__device__ __forceinline__ void pfx_main(const PfGemm& p) {
#if defined(PFW_ENABLED)
    extern __shared__ __align__(1024) u8 pfx_smem[];
    pdl_wait();
    const int g = blockIdx.z, N = p.n[g], n0 = blockIdx.x * PFX_ROWS, tile = blockIdx.y;
    if (n0 >= N || tile >= p.tiles[0]) return;
    const int expert = p.tiles[1 + 3 * tile], m0 = p.tiles[2 + 3 * tile], rows = p.tiles[3 + 3 * tile];
    if (rows > MAXNT) __trap();  // grouped for another kernel: a caller bug, never silently wrong
    const u32 base = (smem_u32(pfx_smem) + 1023u) & ~1023u;  // the swizzle pattern repeats every 1024 B
    int* slot = (int*)(pfx_smem + 1024 + RING + PFX_SRING);
    u32* xrow = (u32*)(slot + MAXNT);
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const int s = p.order[m0 + r];
        slot[r] = s;
        xrow[r] = (u32)(p.x_per_slot ? s : s / p.topk);
    }
    __syncthreads();
    const int K = p.K;
    PfxTile t;
    t.w = (const u8*)p.w[g] + (u64)expert * N * (K / 2);
    t.s = p.s[g] + (u64)expert * N * (K / 32);
    t.x = (const u8*)p.x[g];
    t.slot = slot;
    t.xrow = xrow;
    t.N = N;
    t.K = K;
    t.n0 = n0;
    t.rows = rows;
    t.xbytes = ((K + 127) >> 7) * 256;
    t.base = base;
    t.sring = base + RING;
    if ((K & 127) != 0) {  // the checkpoint scale layout (tiny test models): few instances suffice
        if (MAXNT <= 64 || rows <= 64) pfx_run<64, false, RING>(p, t, g);
        else pfx_run<MAXNT, false, RING>(p, t, g);
    } else if (rows <= 16) {
        pfx_run<16, true, RING>(p, t, g);
    } else if (rows <= 32) {
        pfx_run<32, true, RING>(p, t, g);
    } else if (rows <= 48) {
        pfx_run<48, true, RING>(p, t, g);
    } else if (MAXNT <= 64 || rows <= 64) {
        pfx_run<64, true, RING>(p, t, g);
    } else if (rows <= 96) {
        pfx_run<(MAXNT > 64 ? 96 : 64), true, RING>(p, t, g);
    } else if (rows <= 128) {
        pfx_run<(MAXNT > 64 ? 128 : 64), true, RING>(p, t, g);
    } else if (rows <= 160) {
        pfx_run<(MAXNT > 64 ? 160 : 64), true, RING>(p, t, g);
    } else if (rows <= 192) {
        pfx_run<(MAXNT > 64 ? 192 : 64), true, RING>(p, t, g);
    } else if (rows <= 224) {
        pfx_run<(MAXNT > 64 ? 224 : 64), true, RING>(p, t, g);
    } else {
        pfx_run<MAXNT, true, RING>(p, t, g);
    }
#else
    __trap();
#endif
}

// Tiles of up to 256 rows, one block of 256 threads per SM (up to 128 accumulators a thread at NT = 256; 225 KB of
// shared memory).
extern "C" __global__ void __launch_bounds__(256, 1) pf_wgmma_fp4_expert(PfGemm p) { pfx_main<PFX_RING, 256>(p); }
// Tiles of up to 64 rows (short prompts: ~24 rows per expert at 1K tokens), two blocks per SM (<= 128 registers,
// 2 x 111 KB): twice the warps to hide the decode's and the loads' latency where the tensor work is small.
extern "C" __global__ void __launch_bounds__(256, 2) pf_wgmma_fp4_expert_s(PfGemm p) { pfx_main<PFX_RING_S, 64>(p); }
