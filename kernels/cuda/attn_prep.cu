// Attention glue kernels around the projections (spec 2.4, 2.6).
//
// attn_row_prep: one row of activations -> bf16 GEMV input.
//   out[r, g*width + c] = x[(g*rows + r)*width + c]   (gathers group-major [G, rows, width] into rows; G = 1
//   is a plain copy); then optionally RMSNorm with weight, then optionally the FP8 activation fake-quant in blocks of `quant_blk` (official numerics, feeding an
//   FP8 GEMM). x is f32 or bf16. Launch: grid (rows, chunks), block 256; G*width <= 8192 (shared row).
//   Without a norm the row is cut into `chunks` pieces of whole quant blocks (one block per piece: the 8192-wide
//   wo_b input no longer runs on one SM per row); with a norm chunks must be 1.
// attn_vec_prep: per (vector, row) of `dim` channels (q heads, indexer q heads, the kv row):
//   [RMS with weight | weightless RMS] -> RoPE at the row's position -> quant mode -> bf16 store,
//   either at out[(row*nvec + v)*dim] or, in ring mode, at the window ring row slot*window + pos % window.
//   Up to 3 jobs (q heads, the kv row, the indexer's q heads) share one launch: blockIdx.x runs over the jobs'
//   vectors in order. Launch: grid (sum of nvec, rows), block 128; dim <= 512.
// Numerics: everything stays f32 until the final bf16 store, like the CPU reference. (The official runtime
//   rounds the norm outputs to bf16 before its quantisers; doing that here made quantisation flips against
//   the CPU reference 5x more frequent: Official-mode row error median 2.9e-2 instead of the bf16 level.)
//   The quantised values (e4m3 * 2^k, e2m1 * 2^k) are exact in bf16, so the store loses nothing there.
// Variants tried: row_prep with one block per row (first version); split into 1024-wide pieces when there is
//   no norm (wo_b input 8192 wide, x 4096 wide).
#include "common.cuh"

struct AttnRowPrep {
    const void* x;
    const float* norm_w;  // null: no norm
    u16* out;
    int x_f32, groups, rows, width, quant_blk;  // quant_blk 0: no fake quant
    float eps;
};

#define RP_U 8  // attn_row_prep loads in flight per thread

extern "C" __global__ void __launch_bounds__(256) attn_row_prep(AttnRowPrep p) {
    pdl_trigger();
    pdl_wait();
    __shared__ float v[8192];
    __shared__ float red[33];
    const int r = blockIdx.x, n = p.groups * p.width;
    // Piece [c0, c1) of the row: whole quant blocks, so the blocks match those of the unsplit row.
    int per = n;
    if (!p.norm_w && gridDim.y > 1) {
        const int q = p.quant_blk > 0 ? p.quant_blk : 1;
        per = ((n + gridDim.y - 1) / gridDim.y + q - 1) / q * q;
    }
    const int c0 = blockIdx.y * per, c1 = min(n, c0 + per);
    if (c0 >= c1) return;
    const int len = c1 - c0;
    if (p.norm_w) prefetch_l1(p.norm_w, n * 4);  // read after the row's sum of squares
    // RP_U loads in flight per thread, then their stores (v1: one load and store per trip, in series). The raw
    // bits are kept (u32: f32 bits or bf16 bits) and converted in the store loop, so no load waits for another.
    for (int i0 = threadIdx.x; i0 < len; i0 += blockDim.x * RP_U) {
        u32 t[RP_U];
#pragma unroll
        for (int u = 0; u < RP_U; ++u) {
            const int i = i0 + u * blockDim.x, e = c0 + min(i, len - 1), g = e / p.width, c = e - g * p.width;
            const u64 src = ((u64)g * p.rows + r) * p.width + c;
            t[u] = p.x_f32 ? __float_as_uint(((const float*)p.x)[src]) : (u32)((const u16*)p.x)[src];
        }
#pragma unroll
        for (int u = 0; u < RP_U; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < len) v[i] = p.x_f32 ? __uint_as_float(t[u]) : bf16_to_f32((u16)t[u]);
        }
    }
    __syncthreads();
    if (p.norm_w) attn_rms_smem(v, n, p.norm_w, p.eps, red);
    if (p.quant_blk > 0) {
        attn_fake_quant_smem(v, len, p.quant_blk, 0);
        __syncthreads();
    }
    for (int i = threadIdx.x; i < len; i += blockDim.x) p.out[(u64)r * n + c0 + i] = f32_to_bf16(v[i]);
}

struct AttnVecPrep {
    const float* x;       // [rows, x_stride], vector v at x + row*x_stride + v*dim
    const float* norm_w;  // null: weightless RMS (when rms != 0)
    const float* freqs;   // [rdim/2]
    const int* slots;     // ring mode only
    const int* positions;
    u16* out;
    int x_stride, dim, rdim, rms, quant, window;  // window > 0: ring mode
    float eps;
    int pad;
};

#define ATTN_PREP_JOBS 3

struct AttnVecPrepJobs {
    AttnVecPrep job[ATTN_PREP_JOBS];
    int nvec[ATTN_PREP_JOBS];
    int njobs;
};

#define VP_U 4  // channels per thread: dim <= 512 over 128 threads

__device__ __forceinline__ void attn_vec_prep_one(const AttnVecPrep p, int vec, int nvec, int row) {
    __shared__ float v[512];
    __shared__ float tmp[512];
    __shared__ float red[33];
    // Every global input is loaded up front (v1 loaded the norm weights, the position, the RoPE frequency and
    // the ring slot where each was used: four dependent round trips after the vector's own).
    const float* src = p.x + (u64)row * p.x_stride + (u64)vec * p.dim;
    float xv[VP_U], wv[VP_U];
#pragma unroll
    for (int u = 0; u < VP_U; ++u) {
        const int i = threadIdx.x + u * blockDim.x;
        xv[u] = i < p.dim ? src[i] : 0.f;
        wv[u] = p.norm_w && i < p.dim ? p.norm_w[i] : 0.f;
    }
    const int pos = p.positions[row];
    const int half = p.rdim >> 1;
    const float fq = (int)threadIdx.x < half ? p.freqs[threadIdx.x] : 0.f;
    const int slot = p.window > 0 ? p.slots[row] : 0;
    if (p.rms) {
        // attn_rms_smem with the values and weights in registers: the same order and operations.
        float ss = 0.f;
#pragma unroll
        for (int u = 0; u < VP_U; ++u)
            if (threadIdx.x + u * blockDim.x < p.dim) ss += xv[u] * xv[u];
        const float inv = 1.0f / sqrtf(attn_block_sum(ss, red) / (float)p.dim + p.eps);
#pragma unroll
        for (int u = 0; u < VP_U; ++u) xv[u] = p.norm_w ? wv[u] * (xv[u] * inv) : xv[u] * inv;
    }
#pragma unroll
    for (int u = 0; u < VP_U; ++u) {
        const int i = threadIdx.x + u * blockDim.x;
        if (i < p.dim) v[i] = xv[u];
    }
    __syncthreads();
    // attn_rope_smem, the first pair per thread from the preloaded frequency.
    const int start = p.dim - p.rdim;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double theta = (double)pos * (double)(i == (int)threadIdx.x ? fq : p.freqs[i]);
        const float sn = (float)sin(theta), cs = (float)cos(theta);
        const float a = v[start + 2 * i], b = v[start + 2 * i + 1];
        v[start + 2 * i] = a * cs - b * sn;
        v[start + 2 * i + 1] = a * sn + b * cs;
    }
    __syncthreads();
    attn_quant_vec(v, tmp, p.dim, p.rdim, p.quant);
    u16* dst;
    if (p.window > 0) {
        dst = p.out + ((u64)slot * p.window + pos % p.window) * p.dim;
    } else {
        dst = p.out + ((u64)row * nvec + vec) * p.dim;
    }
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) dst[i] = f32_to_bf16(v[i]);
}

extern "C" __global__ void __launch_bounds__(128) attn_vec_prep(AttnVecPrepJobs p) {
    pdl_trigger();
    pdl_wait();
    // Constant job indices: the body reads its parameters at fixed offsets (no indexed parameter loads).
    const int v = blockIdx.x, row = blockIdx.y;
    if (v < p.nvec[0] || p.njobs == 1)
        attn_vec_prep_one(p.job[0], v, p.nvec[0], row);
    else if (v < p.nvec[0] + p.nvec[1] || p.njobs == 2)
        attn_vec_prep_one(p.job[1], v - p.nvec[0], p.nvec[1], row);
    else
        attn_vec_prep_one(p.job[2], v - p.nvec[0] - p.nvec[1], p.nvec[2], row);
}
