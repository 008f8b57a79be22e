// Dense FP8 prefill GEMM on Hopper's FP8 tensor cores (wgmma.mma_async, sm_90a only): the official FP8 linear
// (spec "Official runtime": act_quant'ed x times the block-scaled e4m3 weight) over many tokens.
//
// Math:    y[m, n] = sum_kb s_x[m, kb] * s_w[n / 128, kb] * sum_{k in block kb} xq[m, k] * wq[n, k], kb = k / 128;
//          xq, wq e4m3 codes; s_x f32 powers of two (act_quant_bf16 with G = 128), s_w UE8M0 bytes. Each
//          128-wide K block is summed by the tensor core (f32 accumulator, started at zero), then scaled by the
//          two scales and added into f32 accumulators in registers: the official per-block promotion.
// Layout:  xq u8 [M, K] row-major, xs f32 [M, ceil(K/128)] row-major (act_quant's layout); w u8 [N, K] (the
//          checkpoint's layout), s u8 [ceil(N/128), ceil(K/128)]; y f32 or bf16 [M, N]. Both operands are
//          K-major, which e4m3 wgmma requires. Up to 8 groups (blockIdx.z) share M and K with their own x, W,
//          S, y, N (PfWgmma).
// Launch:  grid (ceil(M/128), ceil(Nmax/128), groups), 256 threads = 2 warpgroups; warpgroup w owns rows
//          64w..64w+63 of the 128 x 128 output tile (m64n128k32, four per K block).
// Memory:  every thread copies 4 + 4 16-byte chunks of each 128 x 128-byte x and W tile global -> shared with
//          cp.async into a STAGES-deep ring (32 KB a stage). Shared tiles use wgmma's no-swizzle core-matrix
//          layout: chunk c of a tile (c = 64 * (row / 8) + 8 * kchunk + row % 8) sits at byte 16c, so a core
//          matrix (8 rows x 16 bytes) is 128 contiguous bytes; descriptor LBO (next K chunk) 128 B, SBO (next 8
//          rows) 1024 B. Eight consecutive threads fill one core matrix: conflict-free stores.
// Compute: per K block: wait for its stage, fence.proxy.async (cp.async writes are generic-proxy, wgmma reads
//          async-proxy), barrier, refill the stage freed one block ago, 4 wgmma into a temporary f32 tile,
//          wait, promote (acc += t * s_x[row] * s_w). Rows/cols past M/N are zero-filled and never stored.
// Constraints: K % 16 == 0 (16-byte chunks wholly inside or outside K); sm_90a only: elsewhere (sm_120a SASS,
//          compute_90 PTX, NVRTC) the kernels compile to a trap and the host never selects them
//          (GpuContext::has_wgmma).
// Variants / timings: kernels/BENCH_NOTES.md "Prefill wgmma".
#include "common.cuh"

#define PFW_GROUPS 8
#define PFW_TILE 16384  // bytes of one 128 x 128 e4m3 tile

struct PfWgmma {
    const u8* xq[PFW_GROUPS];
    const float* xs[PFW_GROUPS];
    const u8* w[PFW_GROUPS];
    const u8* s[PFW_GROUPS];
    void* out[PFW_GROUPS];
    int n[PFW_GROUPS];
    int M, K, out_bf16, pad;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PFW_ENABLED 1

// Shared-memory matrix descriptor: no swizzle, LBO 128 B (K-adjacent core matrices), SBO 1024 B (8-row groups).
__device__ __forceinline__ u64 pfw_desc(u32 addr) {
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)(128 >> 4) << 16) | ((u64)(1024 >> 4) << 32);
}

__device__ __forceinline__ void pfw_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void pfw_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void pfw_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// d (+)= A[64 x 32] . B[128 x 32]^T, e4m3 in, f32 out; `acc` = 0 overwrites d.
__device__ __forceinline__ void pfw_mma(float (&d)[64], u64 a, u64 b, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
          "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
          "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
          "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(acc));
}

// acc += t * (row scale): values with (i & 2) sit 8 rows below the others.
__device__ __forceinline__ void pfw_promote(float (&acc)[64], const float (&t)[64], float f0, float f1) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = fmaf(t[i], (i & 2) ? f1 : f0, acc[i]);
}

// This thread's 4 chunks of a 128-row tile: source row pointers (row clamped to 0 past `rows`) and validity.
struct PfwRows {
    const u8* src[4];
    bool ok[4];
};

__device__ __forceinline__ PfwRows pfw_rows(const u8* base, int r0, int rows, int K) {
    PfwRows r;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = threadIdx.x + 256 * j, row = (c >> 6) * 8 + (c & 7), kc = (c >> 3) & 7;
        r.ok[j] = r0 + row < rows;
        r.src[j] = base + (u64)(r.ok[j] ? r0 + row : 0) * K + kc * 16;
    }
    return r;
}

// cp.async of K block kb of one operand tile into shared address dst (chunk c at byte 16c).
__device__ __forceinline__ void pfw_load(const PfwRows& r, const u8* base, int kb, int K, u32 dst) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = threadIdx.x + 256 * j, k = kb * 128 + ((c >> 3) & 7) * 16;
        const bool ok = r.ok[j] && k < K;
        cp_async16(dst + 16 * c, ok ? (const void*)(r.src[j] + kb * 128) : (const void*)base, ok ? 16u : 0u);
    }
}

// Stores the warpgroup's 64 x 128 f32 tile (wgmma accumulator layout: value i of lane l of warp w sits at row
// 16w + l/4 + 8 ((i/2) % 2), column 8 (i/4) + 2 (l%4) + i%2).
__device__ __forceinline__ void pfw_store(const PfWgmma& p, int g, int N, int m0, int n0, const float (&acc)[64]) {
    const int wtid = threadIdx.x & 127, warp = wtid >> 5, lane = wtid & 31;
    const bool pairs = (N & 1) == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = m0 + (threadIdx.x >> 7) * 64 + warp * 16 + (lane >> 2) + 8 * h;
        if (row >= p.M) continue;
#pragma unroll
        for (int t = 0; t < 16; ++t) {
            const int c = n0 + 8 * t + 2 * (lane & 3);
            const float v0 = acc[4 * t + 2 * h], v1 = acc[4 * t + 2 * h + 1];
            const u64 idx = (u64)row * N + c;
            if (pairs && c + 1 < N) {
                if (p.out_bf16) {
                    *(u32*)((u16*)p.out[g] + idx) = (u32)f32_to_bf16(v0) | ((u32)f32_to_bf16(v1) << 16);
                } else {
                    *(float2*)((float*)p.out[g] + idx) = make_float2(v0, v1);
                }
            } else {
                if (c < N) store_out(p.out[g], idx, v0, p.out_bf16);
                if (c + 1 < N) store_out(p.out[g], idx + 1, v1, p.out_bf16);
            }
        }
    }
}

template <int STAGES, int PROMOTE>
__device__ __forceinline__ void pfw_body(const PfWgmma& p) {
    extern __shared__ __align__(1024) u8 pfw_smem[];
    const int g = blockIdx.z, N = p.n[g], n0 = blockIdx.y * 128;
    if (n0 >= N) return;
    const int m0 = blockIdx.x * 128, K = p.K, kbs = (K + 127) >> 7;
    const u8 *x = p.xq[g], *w = p.w[g];
    const PfwRows ar = pfw_rows(x, m0, p.M, K), br = pfw_rows(w, n0, N, K);
    const u32 base = smem_u32(pfw_smem);
    pdl_wait();

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < kbs) {
            pfw_load(ar, x, s, K, base + s * 2 * PFW_TILE);
            pfw_load(br, w, s, K, base + s * 2 * PFW_TILE + PFW_TILE);
        }
        cp_async_commit();
    }

    // This thread's two output rows (clamped for the scale reads) and the weight scales' row.
    const int wtid = threadIdx.x & 127, wg = threadIdx.x >> 7;
    const int r0 = m0 + wg * 64 + (wtid >> 5) * 16 + ((wtid & 31) >> 2);
    const float* xs = p.xs[g];
    const float* xs0 = xs + (u64)min(r0, p.M - 1) * kbs;
    const float* xs1 = xs + (u64)min(r0 + 8, p.M - 1) * kbs;
    const u8* sw = p.s[g] + (u64)(n0 >> 7) * kbs;

    float acc[64], t[64], u[64];  // u: the second temporary of PROMOTE == 1 (dead code otherwise)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = t[i] = u[i] = 0.f;

    for (int kb = 0; kb < kbs; ++kb) {
        cp_async_wait<STAGES - 2>();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();  // stage kb is complete for everyone; the stage read at kb - 1 is free (its wgmma waited)
        const int nk = kb + STAGES - 1;
        if (nk < kbs) {
            const u32 dst = base + (nk % STAGES) * 2 * PFW_TILE;
            pfw_load(ar, x, nk, K, dst);
            pfw_load(br, w, nk, K, dst + PFW_TILE);
        }
        cp_async_commit();
        const float s0 = xs0[kb], s1 = xs1[kb], f = ue8m0_to_f32(sw[kb]);
        const float f0 = s0 * f, f1 = s1 * f;
        const u32 a = base + (kb % STAGES) * 2 * PFW_TILE + wg * (PFW_TILE / 2);
        const u32 b = base + (kb % STAGES) * 2 * PFW_TILE + PFW_TILE;
        if (PROMOTE == 4) {
            pfw_fence();
#pragma unroll
            for (int j = 0; j < 4; ++j) pfw_mma(t, pfw_desc(a + 256 * j), pfw_desc(b + 256 * j), j);
            pfw_commit();
            pfw_wait<0>();
            pfw_promote(acc, t, f0, f1);
        } else {
            // One k32 step per promotion, two temporaries: step j runs while step j - 1 is promoted.
            pfw_fence();
            pfw_mma(t, pfw_desc(a), pfw_desc(b), 0);
            pfw_commit();
#pragma unroll
            for (int j = 1; j < 4; ++j) {
                pfw_fence();
                if (j & 1) pfw_mma(u, pfw_desc(a + 256 * j), pfw_desc(b + 256 * j), 0);
                else pfw_mma(t, pfw_desc(a + 256 * j), pfw_desc(b + 256 * j), 0);
                pfw_commit();
                pfw_wait<1>();
                if (j & 1) pfw_promote(acc, t, f0, f1);
                else pfw_promote(acc, u, f0, f1);
            }
            pfw_wait<0>();
            pfw_promote(acc, u, f0, f1);
        }
    }
    pfw_store(p, g, N, m0, n0, acc);
}
#endif

// One block of 256 threads per SM (128 accumulator registers a thread plus addressing; 32 KB a stage).
#if defined(PFW_ENABLED)
#define PFW_KERNEL(NAME, STAGES, PROMOTE) \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME(PfWgmma p) { pfw_body<STAGES, PROMOTE>(p); }
#else
#define PFW_KERNEL(NAME, STAGES, PROMOTE) \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME(PfWgmma p) { __trap(); }
#endif
PFW_KERNEL(pf_wgmma_fp8_s4, 4, 4)
PFW_KERNEL(pf_wgmma_fp8_s6, 6, 4)
PFW_KERNEL(pf_wgmma_fp8_s4_k32, 4, 1)
PFW_KERNEL(pf_wgmma_fp8_s6_k32, 6, 1)
