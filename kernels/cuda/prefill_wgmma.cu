// Dense prefill GEMMs on Hopper's warpgroup tensor-core instruction (wgmma.mma_async, sm_90a only), for the FP8
// linears of a long prefill: many tokens x one block-scaled e4m3 weight.
//
// Math:    y[m, n] = sum_k x[m, k] * W[n, k], f32 [M, N] or bf16. x bf16 exactly as pf_gemm reads it
//          (act_quant'ed or not), W bf16 = e4m3(Wq) * S[n/128, k/128] written by pf_fp8_to_bf16 (exact: the
//          same bf16 weights pf_gemm builds in shared memory), products exact, f32 accumulation by the tensor
//          core through the whole K. Only the f32 summation order differs from pf_gemm.
// Layout:  x [M, K], W [N, K] row-major (K-major operands). Up to 8 groups (blockIdx.z) share M and K with
//          their own x, W, y, N (PfWgmma), like pf_gemm.
// Launch:  grid (ceil(M/128), ceil(Nmax/128), groups), 256 threads = 2 warpgroups; warpgroup w owns rows
//          64w..64w+63 of the 128 x 128 output tile: 4 wgmma m64n128k16 per 128-byte (64-value) K block.
// Memory:  each K block of the x and W tiles is 128 rows x 128 bytes: every thread copies 4 + 4 16-byte
//          chunks global -> shared with cp.async (8 consecutive threads one 128-byte row: coalesced,
//          conflict-free stores) into a STAGES-deep ring, 32 KB a stage, in wgmma's 128-byte-swizzle layout:
//          row r at 128 r, chunk c at 16 (c ^ r % 8), ring aligned to 1024 B; descriptor SBO 1024 B, K steps
//          of 32 bytes added to the start address.
// Compute: per K block: wait for its stage, fence.proxy.async (cp.async writes are generic-proxy, wgmma reads
//          async-proxy), barrier, refill the stage every warpgroup is done with, 4 wgmma, commit; one group
//          stays in flight (wait 1), so the refilled stage is the one read two blocks ago. Rows/cols past M/N
//          are zero-filled and never stored; K tails zero-filled.
// Constraints: K % 8 == 0 (pf_fp8_to_bf16: K % 16 == 0): 16-byte chunks wholly inside or outside K. sm_90a
//          only: elsewhere (sm_120a SASS, compute_90 PTX, NVRTC) the GEMM kernels compile to a trap and the
//          host never selects them (GpuContext::has_wgmma); pf_fp8_to_bf16 is portable.
// Variants / timings (H200, kbench pf, TFLOP/s at M = 1024 / 8192; kernels/BENCH_NOTES.md "Prefill wgmma"):
//          pf_gemm_fp8 133-230 / 220-246. s6 409-629 / 446-634: the engine's only for launches whose 128 x 256
//          tiles would fill at most half the SMs; the others take prefill_wgmma_ws.cu (545-792 / 549-776 on
//          the same shapes). s4 368-525 / 413-507, s3 with two blocks per SM 343-539 / 448-515; pf_fp8_to_bf16
//          10-40 us per launch. An e4m3 x e4m3 variant (x as act_quant codes + scales, the official per-128-K
//          promotion) ran 423-637 / 478-637, no faster (the per-block barrier of this 128 x 128 tiling is the
//          limit), and Hopper adds e4m3 products inside one wgmma with a truncated ~13-bit significand: errors
//          12-95x the pf_gemm tests' bound, even at K = 32, so it was removed (code and its tests: branch
//          `wgmma`, commit 8c1bade). The first version's no-swizzle core-matrix layout (LBO 128, SBO 1024)
//          reached only 217-283.
#include "common.cuh"

#define PFW_GROUPS 8
#define PFW_TILE 16384  // bytes of one 128-row x 128-byte operand tile

struct PfWgmma {
    const void* x[PFW_GROUPS];
    const void* w[PFW_GROUPS];
    void* out[PFW_GROUPS];
    int n[PFW_GROUPS];
    int M, K, out_bf16, pad;
};

// pf_fp8_to_bf16: W e4m3 [n, K] with UE8M0 [ceil(n/128), ceil(K/128)] -> bf16 [n, K] per group (blockIdx.y),
// the conversion of pf_gemm (pf_fp8x16: exact, the scale a power of two clamped like fp8_scale_x2).
struct PfDequant {
    const u8* w[PFW_GROUPS];
    const u8* s[PFW_GROUPS];
    u16* out[PFW_GROUPS];
    int n[PFW_GROUPS];
    int K, pad;
};

extern "C" __global__ void __launch_bounds__(256) pf_fp8_to_bf16(PfDequant p) {
    pdl_wait();
    const int g = blockIdx.y, K = p.K, kb = (K + 127) >> 7;
    const u64 c = (u64)blockIdx.x * 256 + threadIdx.x, total = (u64)p.n[g] * K / 16;
    if (c >= total) return;
    const u64 e = c * 16, row = e / K;
    const int k = (int)(e - row * K);
    const uint4 v = ldg_stream(p.w[g] + e);
    u32 o[8];
    pf_fp8x16(v, fp8_scale_x2(p.s[g][(row >> 7) * kb + (k >> 7)]), o);
    uint4* d = (uint4*)(p.out[g] + e);
    d[0] = make_uint4(o[0], o[1], o[2], o[3]);
    d[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

#if defined(DSV4_WGMMA)
#define PFW_ENABLED 1

#define PFW_D64                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                 \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                        \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                        \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define PFW_R64(d)                                                                                           \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),             \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),           \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),           \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),           \
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),           \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),           \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),           \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d (+)= A[64 x 32 B] . B[128 x 32 B]^T (bf16, k16), f32 out; `acc` = 0 overwrites d.
__device__ __forceinline__ void pfw_mma(float (&d)[64], u64 a, u64 b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PFW_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : PFW_R64(d)
                 : "l"(a), "l"(b), "r"(acc));
}

// This thread's 4 chunks of a 128-row tile (chunk c = tid + 256 j: row c / 8, 16-byte column c % 8): source
// row pointers (row clamped to 0 past `rows`), validity, and the swizzled shared offsets (column ^ row % 8).
struct PfwRows {
    const u8* src[4];
    bool ok[4];
};

__device__ __forceinline__ PfwRows pfw_rows(const void* base, int r0, int rows, int kbytes) {
    PfwRows r;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = threadIdx.x + 256 * j, row = c >> 3;
        r.ok[j] = r0 + row < rows;
        r.src[j] = (const u8*)base + (u64)(r.ok[j] ? r0 + row : 0) * kbytes + (c & 7) * 16;
    }
    return r;
}

// cp.async of K block kb (bytes 128 kb .. 128 kb + 127 of every row) of one operand tile into shared `dst`.
__device__ __forceinline__ void pfw_load(const PfwRows& r, const void* base, int kb, int kbytes, u32 dst) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = threadIdx.x + 256 * j, row = c >> 3, col = c & 7;
        const bool ok = r.ok[j] && kb * 128 + col * 16 < kbytes;
        const u32 at = dst + row * 128 + ((col ^ (row & 7)) << 4);
        cp_async16(at, ok ? (const void*)(r.src[j] + kb * 128) : base, ok ? 16u : 0u);
    }
}

// Stores a warpgroup's 64 x 8T f32 tile (wgmma accumulator layout: value i of lane l of warp w sits at row
// 16w + l/4 + 8 ((i/2) % 2), column 8 (i/4) + 2 (l%4) + i%2) at rows row0.., columns n0.. of out [M, N] (f32 or
// bf16); rows >= M and columns >= N are not stored. Also the store of prefill_wgmma_ws.cu (T = 32).
template <int T>
__device__ __forceinline__ void pfw_store_rows(void* out, int M, int N, int out_bf16, int row0, int n0,
                                               const float (&acc)[4 * T]) {
    const int wtid = threadIdx.x & 127, warp = wtid >> 5, lane = wtid & 31;
    const bool pairs = (N & 1) == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + warp * 16 + (lane >> 2) + 8 * h;
        if (row >= M) continue;
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const int c = n0 + 8 * t + 2 * (lane & 3);
            const float v0 = acc[4 * t + 2 * h], v1 = acc[4 * t + 2 * h + 1];
            const u64 idx = (u64)row * N + c;
            if (pairs && c + 1 < N) {
                if (out_bf16) {
                    *(u32*)((u16*)out + idx) = (u32)f32_to_bf16(v0) | ((u32)f32_to_bf16(v1) << 16);
                } else {
                    *(float2*)((float*)out + idx) = make_float2(v0, v1);
                }
            } else {
                if (c < N) store_out(out, idx, v0, out_bf16);
                if (c + 1 < N) store_out(out, idx + 1, v1, out_bf16);
            }
        }
    }
}

// The tensor core accumulates straight into acc and one wgmma group stays in flight (LAG 1), so the stage
// refilled at block kb is the one read at kb - 2.
template <int STAGES>
__device__ __forceinline__ void pfw_body(const PfWgmma& p) {
    constexpr int LAG = 1, AHEAD = STAGES - 1 - LAG;
    extern __shared__ __align__(1024) u8 pfw_smem[];
    const int g = blockIdx.z, N = p.n[g], n0 = blockIdx.y * 128;
    if (n0 >= N) return;
    const int m0 = blockIdx.x * 128, kbytes = p.K * 2, kbs = (kbytes + 127) >> 7;
    const void *x = p.x[g], *w = p.w[g];
    const PfwRows ar = pfw_rows(x, m0, p.M, kbytes), br = pfw_rows(w, n0, N, kbytes);
    const u32 base = (smem_u32(pfw_smem) + 1023u) & ~1023u;  // the swizzle pattern repeats every 1024 B
    pdl_wait();

#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < kbs) {
            pfw_load(ar, x, s, kbytes, base + s * 2 * PFW_TILE);
            pfw_load(br, w, s, kbytes, base + s * 2 * PFW_TILE + PFW_TILE);
        }
        cp_async_commit();
    }

    const int wg = threadIdx.x >> 7;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;

    for (int kb = 0; kb < kbs; ++kb) {
        cp_async_wait<AHEAD - 1>();
        fence_proxy_async();
        __syncthreads();  // stage kb complete for all; every warpgroup is done with the stage refilled below
        const int nk = kb + AHEAD;
        if (nk < kbs) {
            const u32 dst = base + (nk % STAGES) * 2 * PFW_TILE;
            pfw_load(ar, x, nk, kbytes, dst);
            pfw_load(br, w, nk, kbytes, dst + PFW_TILE);
        }
        cp_async_commit();
        const u32 a = base + (kb % STAGES) * 2 * PFW_TILE + wg * (PFW_TILE / 2);
        const u32 b = base + (kb % STAGES) * 2 * PFW_TILE + PFW_TILE;
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) pfw_mma(acc, wgmma_desc_sw128(a + 32 * j), wgmma_desc_sw128(b + 32 * j), 1);
        wgmma_commit();
        wgmma_wait<LAG>();
    }
    wgmma_wait<0>();
    pfw_store_rows<16>(p.out[g], p.M, N, p.out_bf16, m0 + wg * 64, n0, acc);
}
#endif

// One block of 256 threads per SM (64 accumulators a thread, STAGES x 32 KB + 1 KB alignment slack of shared
// memory), or two for the 3-stage instance.
#if defined(PFW_ENABLED)
#define PFW_KERNEL(NAME, STAGES, BLOCKS) \
    extern "C" __global__ void __launch_bounds__(256, BLOCKS) NAME(PfWgmma p) { pfw_body<STAGES>(p); }
#else
#define PFW_KERNEL(NAME, STAGES, BLOCKS) \
    extern "C" __global__ void __launch_bounds__(256, BLOCKS) NAME(PfWgmma p) { __trap(); }
#endif
PFW_KERNEL(pf_wgmma_bf16_s4, 4, 1)
PFW_KERNEL(pf_wgmma_bf16_s6, 6, 1)
PFW_KERNEL(pf_wgmma_bf16_s3x2, 3, 2)  // two blocks per SM (<= 128 registers, 2 x 97 KB)
