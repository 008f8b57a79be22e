// The device layouts of FP4 expert weights and scales (common.cuh: fp4_pairs, fp4_scale_at), made once per
// buffer at load; every kernel that reads FP4 experts expects them.
// fp4_to_device_layout: weights, in place, from the checkpoint layout (element 2m in the low nibble of byte m).
//          For each 32-bit word (little-endian bytes 4j .. 4j+3): bit b of nibble i moves to fp4_layout_dst(i, b).
//          Grid-stride, any grid; words = bytes / 4 (FP4 rows are K/2 bytes with K % 32 == 0: whole words).
// fp4_rows_to_tiles: weights, in place, for fp4_tiled(N, K) (common.cuh): each 32-row band of a matrix (16 K
//          contiguous bytes, K <= FP4_TILE_MAX_K) into its [K/128][32][64 B] tiles. A block reads a whole band into
//          registers (16-byte pieces, 16 a thread at K = 4096), waits for all its threads, then writes them to
//          their tile places: the band is read before it is rewritten, and bands are disjoint between blocks.
//          Grid-stride over the bands (experts * N / 32).
// fp4_scales_to_device_layout: scales, out of place, for K % 128 == 0: per expert, the [N, K/128] words
//          (4 UE8M0 bytes each) transposed to [K/128, N]. Grid-stride over the destination words.
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

#define FP4_BAND_U (FP4_TILE_MAX_K * 16 / 16 / 256)  // 16-byte pieces a thread holds of the largest band

extern "C" __global__ void __launch_bounds__(256) fp4_rows_to_tiles(uint4* __restrict__ w, u64 bands, int K) {
    pdl_wait();
    const int per_row = K >> 5, pieces = per_row * 32;  // 16-byte pieces of a row, of a band
    for (u64 band = blockIdx.x; band < bands; band += gridDim.x) {
        uint4* b = w + band * (u64)pieces;
        uint4 v[FP4_BAND_U];
#pragma unroll
        for (int j = 0; j < FP4_BAND_U; ++j) {
            const int i = threadIdx.x + 256 * j;
            if (i < pieces) v[j] = b[i];
        }
        __syncthreads();  // the whole band is read before any of it is rewritten
#pragma unroll
        for (int j = 0; j < FP4_BAND_U; ++j) {
            const int i = threadIdx.x + 256 * j, row = i / per_row, c16 = i % per_row;
            // Piece c16 of the row (bytes 16 c16 ..) goes to tile c16 / 4, tile row `row`, quarter c16 % 4.
            if (i < pieces) b[(c16 >> 2) * 128 + row * 4 + (c16 & 3)] = v[j];
        }
        __syncthreads();  // the next band's reads do not overtake this band's writes in other threads
    }
}

extern "C" __global__ void __launch_bounds__(256)
    fp4_scales_to_device_layout(const u32* __restrict__ src, u32* __restrict__ dst, int experts, int N, int chunks) {
    pdl_wait();
    const u64 per = (u64)N * chunks, total = per * experts;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 e = i / per, r = i % per;  // r = c * N + n in the destination
        const u64 c = r / N, n = r % N;
        dst[i] = src[e * per + n * chunks + c];
    }
}
