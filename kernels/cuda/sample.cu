// Greedy sampling on the device, so that only token ids (4 bytes a row) come back to the host.
//
// Math:    out[r] = argmax_v logits[r, v]; ties go to the smallest id; NaN never wins (it compares false).
// Layout:  logits f32 [rows, V]; out i32 [rows].
// Launch:  grid rows, block 1024: each thread scans a strided slice (coalesced; rounds of 8 float4 loads in
//          flight when V % 4 == 0, else of 8 floats), then a warp-shuffle and shared-memory reduction.
#include "common.cuh"

__device__ __forceinline__ void smp_better(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

#define ARGMAX_U 8  // loads in flight per thread and round
#define ARGMAX_NAN __int_as_float(0x7fc00000)  // a quiet NaN (NVRTC has no math header for NAN)

// One round of argmax_rows' scan: ARGMAX_U loads at once (indices c0 + u * stride), then the comparisons. A
// plain strided loop waited one memory latency per element (126 in series at V = 129280: ~29 us); rounds of
// 8 float4 loads take the 129280 logits in 4. Out-of-range slots hold NaN, which never wins.
template <bool VEC>
__device__ __forceinline__ void argmax_round(const float* __restrict__ lr, int n, int c0, int stride, float& v,
                                             int& i) {
    constexpr int W = VEC ? 4 : 1;
    float x[ARGMAX_U][W];
#pragma unroll
    for (int u = 0; u < ARGMAX_U; ++u) {
        const int c = c0 + u * stride;
        if constexpr (VEC) {
            const float q = ARGMAX_NAN;
            const float4 f = c < n ? __ldg((const float4*)lr + c) : make_float4(q, q, q, q);
            x[u][0] = f.x;
            x[u][1] = f.y;
            x[u][2] = f.z;
            x[u][3] = f.w;
        } else {
            x[u][0] = c < n ? __ldg(lr + c) : ARGMAX_NAN;
        }
    }
#pragma unroll
    for (int u = 0; u < ARGMAX_U; ++u)
#pragma unroll
        for (int w = 0; w < W; ++w) smp_better(v, i, x[u][w], (c0 + u * stride) * W + w);
}

// smp_better is a total order (larger value, then smaller id; NaN never wins), so the scan order does not
// change the winner: the same ids as one thread walking the row.
extern "C" __global__ void __launch_bounds__(1024) argmax_rows(const float* __restrict__ logits, int V,
                                                               i32* __restrict__ out) {
    pdl_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    const int r = blockIdx.x;
    const float* lr = logits + (u64)r * V;
    float v = -INFINITY;
    int i = 0x7fffffff;
    const int stride = blockDim.x, round = stride * ARGMAX_U;
    if ((V & 3) == 0 && ((u64)lr & 15) == 0) {
        for (int c0 = threadIdx.x; c0 < (V >> 2); c0 += round) argmax_round<true>(lr, V >> 2, c0, stride, v, i);
    } else {
        for (int c0 = threadIdx.x; c0 < V; c0 += round) argmax_round<false>(lr, V, c0, stride, v, i);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        smp_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float bv = sv[0];
        int bi = si[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) smp_better(bv, bi, sv[w], si[w]);
        out[r] = bi == 0x7fffffff ? 0 : bi;
    }
}
