// KV compressor, decode step (spec 2.5, 3): one token per row, each row a different sequence slot.
//
// Math: the token's projections kappa = proj[row, kv_off + c], gamma = proj[row, gate_off + c] + ape[pos % m, c]
//   (c < width = ovl*dc, ovl = 2 with overlap) go to state row (ovl == 2 ? m : 0) + pos % m. When the token
//   completes its window ((pos + 1) % m == 0, decided here from the device position) the entry w = pos / m is
//   pooled per channel with a softmax over the window rows (overlap: rows 0..m-1 = previous window with
//   channels [0, dc), rows m..2m-1 = current window with channels [dc, 2dc); an empty previous window has
//   gamma = -inf), RMS-normed (in f32 like the CPU reference; the official bf16 cast before the norm is
//   skipped, see attn_prep.cu) with `norm_w`, roped at position w*m, quantised (Q8 nope for
//   the attention cache, Hadamard + Q4 for indexer keys, or none) and stored bf16 at cache[slot, w]. With
//   overlap the current rows then become the previous ones. All pooling math is f32.
// Layout: proj f32 [rows, proj_stride]; ape f32 [m, width]; state_kv / state_sc f32 [slots, srows, width],
//   srows = ovl*m; cache bf16 [slots, cap, dc] (entries >= cap are dropped).
// Launch: grid (rows, jobs), block 256; dc <= 512. Rows must be distinct slots (one token per sequence per
//   step). Up to 2 jobs (the attention's compressor and the indexer's) share one launch (blockIdx.y).
// Variants tried: none (one block per row; the pooling reads at most 2*m*dc floats once per window).
#include "common.cuh"

struct AttnCompress {
    const float* proj;
    const float* ape;
    const float* norm_w;
    const float* freqs;
    const int* slots;
    const int* positions;
    float* state_kv;
    float* state_sc;
    u16* cache;
    int proj_stride, kv_off, gate_off, dc, ratio, overlap, rdim, quant, cap;
    float eps;
};

struct AttnCompressJobs {
    AttnCompress job[2];
    int njobs, pad;
};

__device__ __forceinline__ void attn_compress_one(const AttnCompress p, int row) {
    __shared__ float v[512];
    __shared__ float tmp[512];
    __shared__ float red[33];
    const int m = p.ratio;
    const int ovl = p.overlap ? 2 : 1, width = ovl * p.dc, srows = ovl * m;
    const int pos = p.positions[row], slot = p.slots[row], j = pos % m;
    float* skv = p.state_kv + (u64)slot * srows * width;
    float* ssc = p.state_sc + (u64)slot * srows * width;
    const float* pr = p.proj + (u64)row * p.proj_stride;
    const int srow = (p.overlap ? m : 0) + j;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
        skv[(u64)srow * width + c] = pr[p.kv_off + c];
        ssc[(u64)srow * width + c] = pr[p.gate_off + c] + p.ape[(u64)j * width + c];
    }
    if ((pos + 1) % m != 0) return;
    __syncthreads();
    for (int c = threadIdx.x; c < p.dc; c += blockDim.x) {
        // rows [r0, r1) read channel c + (r >= m ? dc : 0) when overlapping, channel c otherwise.
        float mx = -INFINITY;
        for (int r = 0; r < srows; ++r) {
            const int ch = (p.overlap && r >= m) ? c + p.dc : c;
            mx = fmaxf(mx, ssc[(u64)r * width + ch]);
        }
        float num = 0.f, den = 0.f;
        for (int r = 0; r < srows; ++r) {
            const int ch = (p.overlap && r >= m) ? c + p.dc : c;
            const float e = expf(ssc[(u64)r * width + ch] - mx);
            den += e;
            num += e * skv[(u64)r * width + ch];
        }
        v[c] = num / den;
    }
    __syncthreads();
    attn_rms_smem(v, p.dc, p.norm_w, p.eps, red);
    const int w = pos / m;
    attn_rope_smem(v, p.dc, p.rdim, p.freqs, (long long)w * m, 0);
    __syncthreads();
    attn_quant_vec(v, tmp, p.dc, p.rdim, p.quant);
    if (w < p.cap) {
        u16* dst = p.cache + ((u64)slot * p.cap + w) * p.dc;
        for (int c = threadIdx.x; c < p.dc; c += blockDim.x) dst[c] = f32_to_bf16(v[c]);
    }
    if (p.overlap) {
        // Every pooling read is done (synced above): the current window becomes the previous one.
        for (int i = threadIdx.x; i < m * width; i += blockDim.x) {
            skv[i] = skv[(u64)m * width + i];
            ssc[i] = ssc[(u64)m * width + i];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) attn_compress(AttnCompressJobs p) {
    pdl_wait();
    // Constant job indices: the body reads its parameters at fixed offsets (no indexed parameter loads).
    if (blockIdx.y == 0)
        attn_compress_one(p.job[0], blockIdx.x);
    else
        attn_compress_one(p.job[1], blockIdx.x);
}
