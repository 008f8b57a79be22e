// fp4_to_device_layout: rewrites FP4 expert weights, in place, from the checkpoint layout (element 2m in the
// low nibble of byte m) into the device layout that fp4_pairs (common.cuh) decodes. Run once per weight
// buffer at load; every kernel that reads FP4 expert weights expects this layout.
//
// Math:    for each 32-bit word (little-endian bytes 4j .. 4j+3): bit b of nibble i moves to fp4_layout_dst(i, b).
// Launch:  grid-stride, any grid; words = bytes / 4 (FP4 rows are K/2 bytes with K % 32 == 0, so whole words).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) fp4_to_device_layout(u32* __restrict__ w, u64 words) {
    pdl_wait();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x) {
        const u32 v = w[i];
        u32 out = 0;
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int b = 0; b < 4; ++b) out |= ((v >> (4 * n + b)) & 1u) << fp4_layout_dst(n, b);
        w[i] = out;
    }
}
