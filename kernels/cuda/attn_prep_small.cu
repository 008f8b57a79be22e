// attn_vec_prep_small: attn_vec_prep (attn_prep.cu) for launches of few rows (decode): a 128-thread block per
// (vector, row), every step through shared memory. Same inputs, outputs and bits as attn_vec_prep (the
// gpu_attention_prep test checks them against each other), but its blocks are short, which is what a
// decode step with 129 vectors per row needs: ncu at batch 1, 6.0 us per launch against attn_vec_prep's 15.4
// us; at 8192 rows it is the slower (110.9 ms per prefill call against 52.2).
#include "common.cuh"
#define VPS_U 4  // channels per thread: dim <= 512 over 128 threads

__device__ __forceinline__ void vps_one(const AttnVecPrep p, int vec, int nvec, int row) {
    __shared__ float v[512];
    __shared__ float tmp[512];
    __shared__ float red[33];
    // Every global input is loaded up front (v1 loaded the norm weights, the position, the RoPE frequency and
    // the ring slot where each was used: four dependent round trips after the vector's own).
    const float* src = p.x + (u64)row * p.x_stride + (u64)vec * p.dim;
    float xv[VPS_U], wv[VPS_U];
#pragma unroll
    for (int u = 0; u < VPS_U; ++u) {
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
        for (int u = 0; u < VPS_U; ++u)
            if (threadIdx.x + u * blockDim.x < p.dim) ss += xv[u] * xv[u];
        const float inv = 1.0f / sqrtf(attn_block_sum(ss, red) / (float)p.dim + p.eps);
#pragma unroll
        for (int u = 0; u < VPS_U; ++u) xv[u] = p.norm_w ? wv[u] * (xv[u] * inv) : xv[u] * inv;
    }
#pragma unroll
    for (int u = 0; u < VPS_U; ++u) {
        const int i = threadIdx.x + u * blockDim.x;
        if (i < p.dim) v[i] = xv[u];
    }
    __syncthreads();
    // attn_rope_smem, the first pair per thread from the preloaded frequency.
    const int start = p.dim - p.rdim;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float sn, cs;
        attn_rope_angle(pos, i == (int)threadIdx.x ? fq : p.freqs[i], 0, sn, cs);
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

extern "C" __global__ void __launch_bounds__(128) attn_vec_prep_small(AttnVecPrepJobs p) {
    pdl_wait();
    // Constant job indices: the body reads its parameters at fixed offsets (no indexed parameter loads).
    const int v = blockIdx.x, row = blockIdx.y;
    if (v < p.nvec[0] || p.njobs == 1)
        vps_one(p.job[0], v, p.nvec[0], row);
    else if (v < p.nvec[0] + p.nvec[1] || p.njobs == 2)
        vps_one(p.job[1], v - p.nvec[0], p.nvec[1], row);
    else
        vps_one(p.job[2], v - p.nvec[0] - p.nvec[1], p.nvec[2], row);
}
