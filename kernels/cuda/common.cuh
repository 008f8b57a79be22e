// Shared helpers for every kernel file. Compiles under nvcc and NVRTC alike: no system headers (NVRTC has
// no <stdint.h>), bf16 handled as raw u16 bits, fp8/fp4 decoded with bit operations.
#ifndef DSV4_COMMON_CUH
#define DSV4_COMMON_CUH

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;

// nvcc gets INFINITY from the math headers it always includes; NVRTC has no such header.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Programmatic dependent launch (kernels/src/launch.rs, on by default on sm_90+). pdl_wait: block until the
// previous kernel on the stream has completed and its writes are visible (returns at once when launched without
// PDL). Every kernel of this crate calls it, unconditionally and before touching memory that other kernels
// write, so that its completion still implies its predecessor's. What a kernel does before it (address
// arithmetic, loads of constant weights) overlaps the previous kernel's tail.
// The next kernel may be scheduled once every block of this one has exited or called pdl_trigger: kernels
// trigger at exit, except the decode GEMVs (gemv.cu, gemv_ring.cu, gemv_wg.cu) and the routed-expert kernels
// (fp4_expert.cu), which trigger after their main loop, so the next kernel's start and its own weight loads
// overlap their reductions, stores and split-K finish (the same speed as triggering at exit within 0.5%:
// batch 64 44.78-45.06 against 44.85-45.13 ms). Measured (twelfth session, graph
// replay, batch 1 / 8): 7.15 / 15.37 ms without PDL, 6.81 / 14.61 with this placement; triggering right after
// the wait in every kernel (tenth session) was 7.23 / 15.49 (slower than none): the waiting grid's blocks sat
// resident beside the running one from its start. Triggering at the top of every kernel (ninth session) released
// the whole chain at once: 16% slower.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel be scheduled before this block exits (see pdl_wait).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Last-block election over a device counter (split-K finishes, moe_route_group's grouping): every thread's
// writes so far, a block barrier, then one acq_rel atomic at gpu scope by thread 0 (its release is cumulative:
// it covers the block's writes ordered before it by the barrier; its acquire covers the earlier arrivals'),
// then a barrier, after which the last block to arrive (true for all its threads) may read what every block
// wrote before arriving. That block resets the counter, so the next launch (or graph replay) finds zero. The
// same pattern as CUTLASS's split-K semaphore; it replaced a __threadfence (fence.sc.gpu) by every thread of
// every block before the count and another in the last block (kernels/BENCH_NOTES.md, twenty-seventh session).
__device__ __forceinline__ bool block_arrives_last(u32* counter, u32 blocks) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
        last = old == blocks - 1u;
        if (last) asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(counter) : "memory");
    }
    __syncthreads();
    return last;
}

// bf16 bits -> f32: exact (bf16 is the top half of an f32).
__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

// f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// UE8M0 scale byte -> f32 2^(e-127). e = 0 is 2^-127 (an f32 subnormal); 255 (NaN) is never valid.
__device__ __forceinline__ float ue8m0_to_f32(u32 e) {
    return e == 0u ? __uint_as_float(0x00400000u) : __uint_as_float(e << 23);
}

// Streaming 16-byte load for weights: read once, so keep it out of L1 (x and scales stay there).
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// Ordinary read-only 16-byte load (activations: re-read by many warps, so let L1 keep them).
__device__ __forceinline__ uint4 ldg_keep(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// Pulls `bytes` at p into L1, one 128-byte line per thread and trip (the block's threads together): for inputs a
// latency-bound kernel reads only after some dependent phase, so that phase finds them in L1 instead of waiting
// for an L2 or DRAM round trip then. No registers, nothing to wait for.
__device__ __forceinline__ void prefetch_l1(const void* p, int bytes) {
    const char* c = (const char*)p;
    for (int i = threadIdx.x * 128; i < bytes; i += blockDim.x * 128) asm volatile("prefetch.global.L1 [%0];" ::"l"(c + i));
}

// Packed bf16x2 multiply a*b (fma with -0 keeps the sign of zero products). bf16 fma keeps subnormals.
__device__ __forceinline__ u32 bf16x2_mul(u32 a, u32 b) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}

// D += A(16x16 bf16, row) * B(16x8 bf16, col), f32 accumulate. Runs on sm_80+ (sm_90 and sm_120 alike).
__device__ __forceinline__ void mma_bf16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += a . b, f16 x f16 -> f32 (m16n8k16, sm_80+). Fragments: a0 / a2 hold row g's k (2t, 2t + 1) / (2t + 8, 2t + 9),
// a1 / a3 row g + 8's; b0 / b1 column g's k (2t, 2t + 1) / (2t + 8, 2t + 9); c0 c1 row g columns 2t, 2t + 1, c2 c3
// row g + 8.
__device__ __forceinline__ void mma_f16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The two e4m3 codes in the low (HI = false) or high half-word of w as an f16x2, in byte order (exact: every e4m3
// value is an f16). One F2FP (sm_89+: sm_90 and sm_120; sm_90 adds a shift for the high half).
template <bool HI>
__device__ __forceinline__ u32 e4m3x2_f16x2(u32 w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    u32 r;
    const unsigned short h = (unsigned short)(HI ? w >> 16 : w);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(h));
    return r;
#else
    __trap();
    return 0u;
#endif
}

__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 sel) { return __byte_perm(a, b, sel); }

// FP4 expert weights on the device ("device layout"; fp4_layout.cu makes it once, at load). A 32-bit word
// holds the same 8 weights as in the checkpoint (K offsets 8j .. 8j+7 of one row, nibble i = K offset i),
// but with their bits moved so that the bf16x2 pair of weights (2I, 2I + 1) is a rotation and a mask of the
// word: 4 rotations and 5 masks for the 4 pairs, where the checkpoint layout needs 7 shifts and 8 masks.
// Why: the routed-expert kernels are bound by this decode's integer work (ncu: ALU pipe 72%, issue 76%).
// Why (2I, 2I + 1): a pair is then a bf16x2 word of x in memory order, so the MMA's x fragments are x's own
// words (pairing (I, I + 4) would cost two byte permutes per x word).
// Pair I is the bf16 bit pattern of value * 2^-126: e2m1 (sign, e1, e0, m) -> bf16 bits (15, 8, 7, 6) for weight
// 2I, the same + 16 for weight 2I + 1. fp4_layout_dst gives where the device layout keeps each bit: the target
// bit minus the pair's rotation (pair 3 takes e1 from a 4-bit rotation, the rest from a 12-bit one).
__device__ __forceinline__ int fp4_layout_rot(int pair, int bit) {
    return pair == 0 ? 0 : (pair == 1 ? 6 : (pair == 2 ? 10 : (bit == 2 ? 4 : 12)));
}
__device__ __forceinline__ int fp4_layout_dst(int nibble, int bit) {
    const int target = (bit == 3 ? 15 : 6 + bit) + 16 * (nibble & 1);
    return (target - fp4_layout_rot(nibble >> 1, bit)) & 31;
}

// FP4 expert weight bytes on the device: when fp4_tiled(N, K), each matrix [N, K/2] is stored as 2 KB tiles
// [N/32][K/128][32 rows][64 B], so a warp's 128-wide chunk of 32 rows is one contiguous 2 KB and a block's K step
// of its rows is 2-8 KB in a row, instead of 32 pieces of 64 B K/2 apart (kernels/BENCH_NOTES.md: 2-7% on the
// expert kernels in kbench). Otherwise (tiny models, K > FP4_TILE_MAX_K) the rows stay as in the checkpoint.
// fp4_w_at: the offset of byte b of row n inside one matrix (b % 16 == 0 keeps a 16-byte piece inside a tile row).
#define FP4_TILE_MAX_K 4096  // fp4_rows_to_tiles holds a 32-row band (16 K bytes) in registers
__device__ __forceinline__ bool fp4_tiled(int N, int K) {
    return (K & 127) == 0 && (N & 31) == 0 && K <= FP4_TILE_MAX_K;
}
__device__ __forceinline__ u64 fp4_w_at(int n, int b, int N, int K) {
    return fp4_tiled(N, K) ? ((u64)((n >> 5) * (K >> 7) + (b >> 6)) << 11) + (u32)((n & 31) << 6) + (u32)(b & 63)
                           : (u64)n * (K >> 1) + b;
}

// FP4 expert scales on the device: when K % 128 == 0, one expert's UE8M0 bytes [N, K/32] are stored as 32-bit
// words [K/128, N, 4] (the 4 scales of row n's 128-wide K chunk c at word c * N + n), so the words a warp
// needs for one chunk of its consecutive rows are adjacent; otherwise the checkpoint's [N, K/32].
// fp4_scale_at: byte index of (row n, 32-wide group gi) inside one expert's scales.
__device__ __forceinline__ u64 fp4_scale_at(int n, int gi, int N, int K) {
    return (K & 127) == 0 ? ((u64)(gi >> 2) * N + n) * 4 + (gi & 3) : (u64)n * (K >> 5) + gi;
}

// The 4 bf16x2 pairs (value * 2^-126) of a device-layout word: p[I] = weights 2I (low half) and 2I + 1.
__device__ __forceinline__ void fp4_pairs(u32 w, u32 (&p)[4]) {
    const u32 m = 0x81c081c0u;  // bits 15, 8, 7, 6 of both halves
    p[0] = w & m;
    // Pair 1 and pair 3's e1 bits never wrap around: plain shifts, which ptxas may issue as IMAD.SHL on the
    // FMA pipe (the ALU pipe is this decode's bottleneck); pairs 2 and 3 need true rotations.
    p[1] = (w << 6) & m;
    p[2] = __funnelshift_l(w, w, 10) & m;
    p[3] = (__funnelshift_l(w, w, 12) & 0x80c080c0u) | ((w << 4) & 0x01000100u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Warp sums of I values at once, each with warp_sum's bits, in about I shuffles instead of 5 I (recursive
// halving over warp_sum's masks 16, 8, ...: at mask o the lane whose bit o is set keeps the upper half of its
// values and sends the lower half to lane ^ o, which keeps the lower half; each kept value becomes own + partner's,
// exactly warp_sum's step, so every value gets warp_sum's tree). Values are padded to P = the next power of two;
// once one is left the remaining masks are warp_sum's plain steps. The lane then holds the full sum of value
// warp_sums_index<I>(lane) (padding for indices >= I); the lanes with warp_sums_leader<I> hold each index once.
template <int I>
struct WarpSums {
    static constexpr int P = I <= 1 ? 1 : I <= 2 ? 2 : I <= 4 ? 4 : I <= 8 ? 8 : I <= 16 ? 16 : 32;
    static_assert(I >= 1 && I <= 32, "1..32 values");
};

// One halving step at mask 16 >> S over the first 2 H values of a (H >= 1), or warp_sum's plain step (H == 0).
// A template per step so that every index is a compile-time constant (a loop left a[] in local memory).
template <int S, int H, int P>
__device__ __forceinline__ void warp_sums_step(float (&a)[P], int lane) {
    constexpr int o = 16 >> S;
    if constexpr (H >= 1) {
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int j = 0; j < H; ++j) {
            const float send = up ? a[j] : a[j + H], keep = up ? a[j + H] : a[j];
            a[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    } else {
        a[0] += __shfl_xor_sync(0xffffffffu, a[0], o);
    }
}

template <int I>
__device__ __forceinline__ float warp_sums_scatter(const float (&v)[I]) {
    constexpr int P = WarpSums<I>::P;
    const int lane = threadIdx.x & 31;
    float a[P];
#pragma unroll
    for (int i = 0; i < P; ++i) a[i] = i < I ? v[i] : 0.f;
    warp_sums_step<0, P / 2>(a, lane);
    warp_sums_step<1, P / 4>(a, lane);
    warp_sums_step<2, P / 8>(a, lane);
    warp_sums_step<3, P / 16>(a, lane);
    warp_sums_step<4, P / 32>(a, lane);
    return a[0];
}

template <int I>
__device__ __forceinline__ int warp_sums_index(int lane) {
    constexpr int P = WarpSums<I>::P;
    int idx = 0;
#pragma unroll
    for (int s = 0; s < 5; ++s)
        if ((P >> (s + 1)) >= 1 && (lane & (16 >> s)) != 0) idx += P >> (s + 1);
    return idx;
}

template <int I>
__device__ __forceinline__ bool warp_sums_leader(int lane) {
    return (lane & (32 / WarpSums<I>::P - 1)) == 0;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sums the per-warp accumulators of a GEMV block (8 warps, each owning a slice of K) into warp 0, in a fixed
// order (deterministic: no atomics). `red` holds 4 warps' worth of accumulators.
template <int NACC>
__device__ __forceinline__ void block_reduce_8warps(float* acc, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int half = 4; half >= 1; half >>= 1) {
        if (warp >= half && warp < 2 * half) {
#pragma unroll
            for (int i = 0; i < NACC; ++i) red[((warp - half) * NACC + i) * 32 + lane] = acc[i];
        }
        __syncthreads();
        if (warp < half) {
#pragma unroll
            for (int i = 0; i < NACC; ++i) acc[i] += red[(warp * NACC + i) * 32 + lane];
        }
        __syncthreads();
    }
}

// Stores one f32 result as f32 or bf16 (out_bf16 != 0).
__device__ __forceinline__ void store_out(void* out, u64 idx, float v, int out_bf16) {
    if (out_bf16) ((u16*)out)[idx] = f32_to_bf16(v);
    else ((float*)out)[idx] = v;
}

// cp.async (sm_80+) for the rings of fp4_expert.cu and gemv_ring.cu. Shared-memory address of a generic pointer
// (computed once per thread; the copies then add offsets).
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes from a 32-bit shared-memory address (volatile, as ldmatrix: kept in order with the barriers that
// publish what it reads).
__device__ __forceinline__ uint4 lds128(u32 a) {
    uint4 r;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "r"(a));
    return r;
}

// Four 8x8 b16 matrices from shared memory (ldmatrix, sm_75+); lane l supplies the row address of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// The same, each matrix transposed (a B operand from a [k][n] row-major tile).
__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// 16-byte global -> shared copy that skips L1; `bytes` < 16 zero-fills the rest (0: no read at all).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async4(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async8(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// Copies the aligned 4-byte word holding byte *b to shared address dst: how the ring GEMVs bring a K step's weight
// scale byte in with the step's copies (a plain load per step put an L2 round trip on every step's critical path).
__device__ __forceinline__ void cp_async_word_of(u32 dst, const u8* b) {
    cp_async4(dst, (const void*)((u64)b & ~(u64)3), 4u);
}

__device__ __forceinline__ u32 lds_u32(u32 a) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
    return v;
}

__device__ __forceinline__ float2 lds_f32x2(u32 a) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
    return v;
}

// Byte *b out of its word as cp_async_word_of copied it to shared address a.
__device__ __forceinline__ u32 lds_byte_of(u32 a, const u8* b) {
    return (lds_u32(a) >> (8u * (u32)((u64)b & 3))) & 0xffu;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Hopper warpgroup MMA (wgmma, sm_90a only: DSV4_WGMMA is defined just where the instructions exist; the
// kernels that use them compile to a trap elsewhere and the host never selects them).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSV4_WGMMA 1
// Shared-memory matrix descriptor, K-major with the 128-byte swizzle: rows of 128 B, SBO 1024 B (next 8 rows),
// LBO unused (1). The tile must start 1024-byte aligned; a K step inside the row adds its byte offset.
__device__ __forceinline__ u64 wgmma_desc_sw128(u32 addr) {
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
#endif

// sm_90+ (every target this crate builds: sm_90a, sm_120a, compute_90 PTX). Makes this thread's generic-proxy
// shared-memory accesses (cp.async included, once complete) ordered with the async proxy that wgmma and the bulk
// copies use.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Shared-memory mbarriers (sm_90+): the completion of bulk copies (TMA) and the producer / consumer handshakes.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// After this thread's mbar_init calls: makes the initialised barriers visible to the async proxy (bulk copies).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrives once and adds `bytes` to the transactions the current phase waits for.
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Spins until the phase of parity `parity` has completed (a fresh barrier counts parity 1 as completed).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// One bulk copy (sm_90+, no tensor map) of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
// memory into shared `dst`; its bytes complete on mbarrier `bar`.
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

#endif  // DSV4_COMMON_CUH
