// Glue kernels of the model split over ranks (tensor parallel on one GPU or several).
//
// rank_sum_f32: the all-reduce of ranks simulated on ONE GPU (in place of NCCL): every buffer gets
//          sum_r buf[r][i], summed in rank order (deterministic). Buffers are device pointers of the same
//          context. Launch: grid-stride, block 256.
// moe_localize: the global expert ids of a step (moe_route's output) as ids of the rank's expert range
//          [e0, e1): out = id - e0 inside, -1 outside (moe_group and moe_rank_sum skip -1). Launch: one
//          thread per slot.
// moe_rank_sum: a rank's MoE partial output, out[r, c] = sum_k y[r*topk + k, c] over the slots whose local
//          id is >= 0 (k in order), + shared[r, c] when the rank holds shared-expert rows. With every slot
//          local and the shared expert present this is exactly the sum hc_post forms unsplit. Launch: grid
//          (rows, ceil(D/256)), block 256.
// gather_cols_bf16: out[r, j] = x[r, c0 + j] for j < w (a rank's column slice of a latent row, made
//          contiguous for the GEMV). Launch: grid rows, block 256.
#include "common.cuh"

#define RANK_MAX 8

struct RankBufs {
    u64 buf[RANK_MAX];
};

extern "C" __global__ void __launch_bounds__(256) rank_sum_f32(RankBufs b, int ranks, u64 n) {
    pdl_wait();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float s = ((const float*)b.buf[0])[i];
        for (int r = 1; r < ranks; ++r) s += ((const float*)b.buf[r])[i];
        for (int r = 0; r < ranks; ++r) ((float*)b.buf[r])[i] = s;
    }
}

extern "C" __global__ void __launch_bounds__(256) moe_localize(const i32* __restrict__ ids, i32* __restrict__ out,
                                                              int S, int e0, int e1) {
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= S) return;
    const int e = ids[i];
    out[i] = (e >= e0 && e < e1) ? e - e0 : -1;
}

extern "C" __global__ void __launch_bounds__(256) moe_rank_sum(const float* __restrict__ y,
                                                              const i32* __restrict__ local,
                                                              const float* __restrict__ shared,
                                                              float* __restrict__ out, int topk, int D) {
    pdl_wait();
    const int r = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= D) return;
    float s = 0.f;
    for (int k = 0; k < topk; ++k) {
        const u64 slot = (u64)r * topk + k;
        if (local[slot] >= 0) s += y[slot * D + c];
    }
    out[(u64)r * D + c] = shared ? s + shared[(u64)r * D + c] : s;
}

extern "C" __global__ void __launch_bounds__(256) gather_cols_bf16(const u16* __restrict__ x, u16* __restrict__ out,
                                                                  int width, int c0, int w) {
    pdl_wait();
    const u64 r = blockIdx.x;
    for (int j = threadIdx.x; j < w; j += blockDim.x) out[r * w + j] = x[r * width + c0 + j];
}
