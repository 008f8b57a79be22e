// Dense prefill GEMMs on wgmma with a warp-specialised TMA pipeline (sm_90a only): the same products and
// parameters as prefill_wgmma.cu's pf_wgmma_bf16_* (bf16 x [M, K] times bf16 W [n, K] per group, up to 8 groups
// sharing M and K, f32 or bf16 out), with 128 x 256 output tiles and no block barrier in the K loop.
//
// Math:    y[m, n] = sum_k x[m, k] * W[n, k]: exact bf16 products, f32 accumulation by the tensor core through the
//          whole K (m64n256k16), as pf_wgmma_bf16_s6; only the f32 summation order differs from pf_gemm.
// Launch:  persistent: min(tiles, SMs) blocks of 384 threads walk the tiles t = blockIdx.x, + gridDim.x, ...
//          Tiles run group by group; inside a group in super-columns of PFT_SUPER n tiles (2048 columns of W),
//          m tile by m tile, so the ~132 tiles in flight share ~16 x tiles and <= 8 W tiles through L2 (x, the
//          activations, is re-read once per super-column; each W tile is read from DRAM about once).
// Roles:   warpgroup 0 is the producer (setmaxnreg down to 40 registers; one thread works): per K block of 64
//          values it waits for the stage's `empty` mbarrier, arms its `full` mbarrier with the 48 KB it expects
//          and issues two TMA tile loads (cp.async.bulk.tensor.2d: x 128 rows x 128 B, W 256 rows x 128 B, the
//          128-byte swizzle, rows / columns / K past the tensor zero-filled by the copy engine, the box always
//          counted whole). Warpgroups 1 and 2 consume (setmaxnreg up to 232): consumer c owns rows 64c..64c+63
//          of the tile, 128 f32 accumulators a thread; per K block it waits for `full`, issues 4 wgmma
//          m64n256k16, commits, waits until one group is left in flight and then releases the previous stage
//          (one `empty` arrival per consumer warp, 8 in all). The ring is PFT_STAGES deep and its stage / phase
//          run on across tiles, so the producer fills the next tile's stages while the consumers store.
// Memory:  ring of PFT_STAGES x (16 + 32) KB aligned to 1024 B (the swizzle pattern; the same layout as
//          prefill_wgmma.cu's: row r at 128 r, 16-byte chunk c at 16 (c ^ r % 8), descriptor SBO 1024 B, k16 steps
//          of 32 B on the start address), then the full / empty mbarriers. 193 KB: one block per SM.
// Host:    the launcher (kernels/src/ops/prefill_wgmma_ws.rs) encodes per group a tensor map of x (box 64 x 128)
//          and of W (box 64 x 256) with cuTensorMapEncodeTiled; they travel in the __grid_constant__ parameter
//          block (the TMA reads them from parameter space). x and W 16-byte aligned, K % 8 == 0.
// Constraints: sm_90a only; elsewhere (sm_120a SASS, compute_90 PTX, NVRTC) a trap and the host never selects
//          it (GpuContext::has_wgmma). Uses PFW_GROUPS, PFW_ENABLED and pfw_store_rows of prefill_wgmma.cu (same
//          translation unit, sorted first).
// SASS (nvcc 13.0): 168 registers at entry, no stack; the K loop is 4 HGMMA.64x256x16 then
//          `WARPGROUP.DEPBAR.LE gsb0, 0x1`, no C7515 serialisation warning; USETMAXREG 232 / 40; 2 UTMALDG.2D.
// Timings (H200, kbench pf, TFLOP/s, pf_wgmma_bf16_s6 in brackets; BENCH_NOTES "pf_wgmma_bf16_ws"): M = 8192:
//          wq_a+wkv 760 (576), wq_b+iwq_b 549 (466), wo_a x8 755 (581), wo_b 776 (641), shared w1+w3 765 (592),
//          w2 687 (524); M = 1024: 274 (415: only 48 tiles, s6 stays the engine's there), 545 (434), 733 (592),
//          792 (639), 706 (576), 574 (494). wq_b+iwq_b gains least (K = 1024: 16 K blocks a tile, f32 out of
//          40960 columns, 1.3 GB at 8K): its stores, which both consumers issue between tiles (no ping-pong of
//          the warpgroups), are the likely limit (not profiled).
#include "common.cuh"

#define PFT_BN 256                   // output columns of a tile
#define PFT_STAGES 4                 // ring depth
#define PFT_A (128 * 128)            // bytes of a stage's x tile: 128 rows x 64 bf16
#define PFT_B (PFT_BN * 128)         // bytes of its W tile
#define PFT_STAGE (PFT_A + PFT_B)
#define PFT_SUPER 8                  // n tiles per super-column of the tile order

// A CUtensorMap (opaque, 128 bytes; cuda.h 13 aligns it to 128).
struct __align__(128) PfTmap {
    u64 v[16];
};

struct PfWgmmaTma {
    PfTmap x[PFW_GROUPS];
    PfTmap w[PFW_GROUPS];
    void* out[PFW_GROUPS];
    int n[PFW_GROUPS];
    int M, K, out_bf16, groups, tiles, pad;
};

#if defined(PFW_ENABLED)
// TMA: the box of `map` at (c0 = k, c1 = row) into shared `dst`; its bytes complete on mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(u32 dst, const PfTmap* map, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"(dst), "l"((u64)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

#define PFT_D128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define PFT_R8(i)                                                                                             \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define PFT_R128                                                                                               \
    PFT_R8(0), PFT_R8(8), PFT_R8(16), PFT_R8(24), PFT_R8(32), PFT_R8(40), PFT_R8(48), PFT_R8(56), PFT_R8(64),  \
        PFT_R8(72), PFT_R8(80), PFT_R8(88), PFT_R8(96), PFT_R8(104), PFT_R8(112), PFT_R8(120)

// d (+)= A[64 x 32 B] . B[256 x 32 B]^T (bf16, k16), f32 out; `acc` = 0 overwrites d.
__device__ __forceinline__ void pft_mma(float (&d)[128], u64 a, u64 b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" PFT_D128 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : PFT_R128
                 : "l"(a), "l"(b), "r"(acc));
}

// Tile t of the launch (the order of the header): group g, first row m0, first column n0.
__device__ __forceinline__ void pft_tile(const PfWgmmaTma& p, int t, int mt, int& g, int& m0, int& n0) {
    g = 0;
    int nt = (p.n[0] + PFT_BN - 1) / PFT_BN;
    while (t >= mt * nt && g + 1 < p.groups) {
        t -= mt * nt;
        ++g;
        nt = (p.n[g] + PFT_BN - 1) / PFT_BN;
    }
    const int full = nt / PFT_SUPER, span = mt * PFT_SUPER;
    int mi, ni;
    if (t < full * span) {
        const int sb = t / span, r = t - sb * span;
        mi = r / PFT_SUPER;
        ni = sb * PFT_SUPER + r % PFT_SUPER;
    } else {
        const int r = t - full * span, w = nt - full * PFT_SUPER;
        mi = r / w;
        ni = full * PFT_SUPER + r % w;
    }
    m0 = mi * 128;
    n0 = ni * PFT_BN;
}

// The producer thread: every tile's K blocks into the ring.
__device__ __forceinline__ void pft_produce(const PfWgmmaTma& p, u32 ring, u32 full, u32 empty) {
    const int mt = (p.M + 127) >> 7, kbs = (p.K + 63) >> 6;
    int s = 0;
    u32 ph = 0;
    for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
        int g, m0, n0;
        pft_tile(p, t, mt, g, m0, n0);
        for (int kb = 0; kb < kbs; ++kb) {
            mbar_wait(empty + 8 * s, ph ^ 1);
            const u32 dst = ring + s * PFT_STAGE, bar = full + 8 * s;
            mbar_expect_tx(bar, PFT_STAGE);
            tma_load_2d(dst, &p.x[g], kb * 64, m0, bar);
            tma_load_2d(dst + PFT_A, &p.w[g], kb * 64, n0, bar);
            if (++s == PFT_STAGES) {
                s = 0;
                ph ^= 1;
            }
        }
    }
}

// Consumer warpgroup c (0, 1): rows 64c.. of every tile of this block.
__device__ __forceinline__ void pft_consume(const PfWgmmaTma& p, int c, u32 ring, u32 full, u32 empty) {
    const int mt = (p.M + 127) >> 7, kbs = (p.K + 63) >> 6, lane = threadIdx.x & 31;
    int s = 0;
    u32 ph = 0;
    for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
        int g, m0, n0;
        pft_tile(p, t, mt, g, m0, n0);
        float acc[128];
        int prev = 0;
        for (int kb = 0; kb < kbs; ++kb) {
            mbar_wait(full + 8 * s, ph);
            const u32 a = ring + s * PFT_STAGE + c * (PFT_A / 2), b = ring + s * PFT_STAGE + PFT_A;
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < 4; ++j)
                pft_mma(acc, wgmma_desc_sw128(a + 32 * j), wgmma_desc_sw128(b + 32 * j), kb > 0 || j > 0);
            wgmma_commit();
            wgmma_wait<1>();  // block kb - 1's wgmma are done: its stage may be refilled
            if (kb > 0 && lane == 0) mbar_arrive(empty + 8 * prev);
            prev = s;
            if (++s == PFT_STAGES) {
                s = 0;
                ph ^= 1;
            }
        }
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(empty + 8 * prev);
        pfw_store_rows<32>(p.out[g], p.M, p.n[g], p.out_bf16, m0 + 64 * c, n0, acc);
    }
}

__device__ __forceinline__ void pft_body(const PfWgmmaTma& p) {
    extern __shared__ __align__(1024) u8 pft_smem[];
    const u32 ring = (smem_u32(pft_smem) + 1023u) & ~1023u;  // the swizzle pattern repeats every 1024 B
    const u32 full = ring + PFT_STAGES * PFT_STAGE, empty = full + 8 * PFT_STAGES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < PFT_STAGES; ++s) {
            mbar_init(full + 8 * s, 1);   // the producer's expect_tx arrival (+ the TMA bytes)
            mbar_init(empty + 8 * s, 8);  // one arrival per consumer warp
        }
        mbar_init_fence();
    }
    __syncthreads();
    pdl_wait();
    const int wg = threadIdx.x >> 7;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 0) pft_produce(p, ring, full, empty);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        pft_consume(p, wg - 1, ring, full, empty);
    }
}
#endif

// 384 threads (producer + 2 consumer warpgroups), one block per SM: 65536 registers = 128 x 40 + 256 x 232 (+ slack).
#if defined(PFW_ENABLED)
extern "C" __global__ void __launch_bounds__(384, 1) pf_wgmma_bf16_ws(const __grid_constant__ PfWgmmaTma p) {
    pft_body(p);
}
#else
extern "C" __global__ void __launch_bounds__(384, 1) pf_wgmma_bf16_ws(const __grid_constant__ PfWgmmaTma p) {
    __trap();
}
#endif
