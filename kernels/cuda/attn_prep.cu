// Attention glue kernels around the projections (spec 2.4, 2.6).
//
// attn_row_prep: one row of activations -> bf16 GEMV input.
//   out[r, g*width + c] = x[(g*rows + r)*width + c]   (gathers group-major [G, rows, width] into rows; G = 1
//   is a plain copy); then optionally RMSNorm with weight, then optionally the FP8 activation fake-quant in blocks of `quant_blk` (official numerics, feeding an
//   FP8 GEMM). x is f32 or bf16. Launch: grid (rows, chunks), block 256; G*width <= 8192 (shared row).
//   Without a norm the row is cut into `chunks` pieces of whole quant blocks (one block per piece: the 8192-wide
//   wo_b input no longer runs on one SM per row); with a norm chunks must be 1. attn_row_quant (no norm) and
//   attn_row_norm_quant (a norm, one f32 group) give the same bits with a warp per 128-value block and no
//   shared row: the host takes them wherever the shape allows, at every row count (decode too).
// attn_vec_prep: per (vector, row) of `dim` channels (q heads, indexer q heads, the kv row):
//   [RMS with weight | weightless RMS] -> RoPE at the row's position -> quant mode -> bf16 store,
//   either at out[(row*nvec + v)*dim] or, in ring mode, at the window ring row slot*window + pos % window.
//   Up to 3 jobs (q heads, the kv row, the indexer's q heads) share one launch: blockIdx.x runs over the jobs'
//   blocks of VP_VPB vectors in order. Launch: grid (sum of ceil(nvec / VP_VPB), rows), block 128; dim <= 512.
// Numerics: everything stays f32 until the final bf16 store, like the CPU reference. (The official runtime
//   rounds the norm outputs to bf16 before its quantisers; doing that here made quantisation flips against
//   the CPU reference 5x more frequent: Official-mode row error median 2.9e-2 instead of the bf16 level.)
//   The quantised values (e4m3 * 2^k, e2m1 * 2^k) are exact in bf16, so the store loses nothing there.
// Variants tried: row_prep with one block per row (first version); split into 1024-wide pieces when there is
//   no norm (wo_b input 8192 wide, x 4096 wide). vec_prep v1: a 128-thread block per vector with every step
//   through shared memory, block-wide syncs, the RoPE angles in double per vector and the Hadamard's signs by
//   popc per term: 1.0 ms per 8192-row launch of 64 q heads (~4x the bytes' time at the copy rate); it stays as
//   attn_vec_prep_small (attn_prep_small.cu) for launches of < 128 rows, where its short blocks win (decode).
//   v2 (below): a warp per vector, registers throughout, the angles once per block while the loads are in
//   flight. First cut (8 warps, 2 vectors each, a 16-register Hadamard and quantiser fully unrolled for every
//   job: 21.5K SASS instructions) was slower than v1 everywhere; at 7.4K instructions and 4 vectors per block:
//   8192-row prefill call 110.9 -> 52.2 ms in vec_prep (the 1K TTFT 156.2 -> 149.5 ms), batch 1 6.0 -> 15.4
//   us per launch (hence the split by rows).
#include "common.cuh"

struct AttnRowPrep {
    const void* x;
    const float* norm_w;  // null: no norm
    u16* out;
    u8* q8;               // attn_row_quant / attn_row_norm_quant with 128-value blocks: also the e4m3 codes
    float* q8_scales;     // [rows, n] and their scales [rows, n / 128] (gemv_wq8.cu's input); null: none
    int x_f32, groups, rows, width, quant_blk;  // quant_blk 0: no fake quant
    float eps;
};

#define RP_U 8  // attn_row_prep loads in flight per thread

extern "C" __global__ void __launch_bounds__(256) attn_row_prep(AttnRowPrep p) {
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

// A lane's 4 consecutive values of a 128-value block (the warp holds the block): FP8 fake quant when `quant`
// (attn_quant_block_warp's arithmetic: the block's amax is a max, so any order gives the same scale), then the 4
// bf16 in one 8-byte store at out. With q8 (quant only) also the 4 e4m3 codes at q8 (one 4-byte store; each
// rounded value is exact in e4m3, so the conversion is exact) and, from lane 0, the block's scale at q8_scale.
__device__ __forceinline__ void attn_quant4_store(float (&v)[4], bool quant, u16* out, u8* q8 = nullptr,
                                                  float* q8_scale = nullptr) {
    if (quant) {
        float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
        amax = warp_max(amax);
        const float s = attn_pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f), inv_s = attn_inv_pow2(s);  // exact: s = 2^k
        u32 codes = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float r = attn_round_fmt(fminf(fmaxf(v[i] * inv_s, -448.0f), 448.0f), 3, -6);
            if (q8) codes |= f32_to_e4m3(r) << (8 * i);
            v[i] = r * s;
        }
        if (q8) {
            *(u32*)q8 = codes;
            if ((threadIdx.x & 31) == 0) *q8_scale = s;
        }
    }
    uint2 o;
    o.x = (u32)f32_to_bf16(v[0]) | ((u32)f32_to_bf16(v[1]) << 16);
    o.y = (u32)f32_to_bf16(v[2]) | ((u32)f32_to_bf16(v[3]) << 16);
    *(uint2*)out = o;
}

// attn_row_quant: attn_row_prep without a norm, for rows whose quant blocks (128, or none) never straddle a
// group (width a multiple of 128): a warp per block of 128 values, 4 consecutive values per lane (one 16- or
// 8-byte load, one 8-byte store), no shared memory and no block sync. Same per-value arithmetic as
// attn_quant_block_warp (the block's amax is a max, so any order gives the same scale): the same bits as
// attn_row_prep. Launch: grid ceil(rows * groups * width / 128 / 8), block 256. (attn_row_prep, a 256-thread
// block per 1024-wide piece with a 32 KB shared row: 0.50 ms per 8192-row launch of the 8192-wide wo_b input.)
extern "C" __global__ void __launch_bounds__(256) attn_row_quant(AttnRowPrep p) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int n = p.groups * p.width, nblk = n >> 7;
    const u64 q = (u64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (q >= (u64)p.rows * nblk) return;
    const int r = (int)(q / nblk), e0 = (int)(q % nblk) * 128 + lane * 4;
    const int g = e0 / p.width, c = e0 - g * p.width;
    const u64 src = ((u64)g * p.rows + r) * p.width + c;
    float v[4];
    if (p.x_f32) {
        const float4 t = *(const float4*)((const float*)p.x + src);
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
        const uint2 t = *(const uint2*)((const u16*)p.x + src);
        v[0] = bf16_to_f32((u16)(t.x & 0xffffu)), v[1] = bf16_to_f32((u16)(t.x >> 16));
        v[2] = bf16_to_f32((u16)(t.y & 0xffffu)), v[3] = bf16_to_f32((u16)(t.y >> 16));
    }
    const u64 at = (u64)r * n + e0;
    if (p.q8) attn_quant4_store(v, p.quant_blk > 0, p.out + at, p.q8 + at, p.q8_scales + at / 128);
    else attn_quant4_store(v, p.quant_blk > 0, p.out + at);
}

// attn_row_norm_quant: attn_row_prep with a norm, for rows of one group of f32 values, at most 256 RNQ_U wide,
// whose 128-value quant blocks (or none) are whole: the row's sum of squares exactly as attn_rms_smem sums it
// (thread t adds t, t + 256, ... in order, then attn_block_sum), then a warp per 128-value block with 4
// consecutive values a lane in registers (read again, from L1), normalised and quantised as attn_row_quant does:
// the same bits as attn_row_prep, without its shared row and the barriers around it. Launch: grid rows, block
// 256. (attn_row_prep took 5.1 us for the 1024-wide q_lora row at batch 1, a one-block launch on the critical
// path of every layer.)
#define RNQ_U 8  // values a thread adds to the sum of squares: rows up to 2048 wide

extern "C" __global__ void __launch_bounds__(256) attn_row_norm_quant(AttnRowPrep p) {
    pdl_wait();
    __shared__ float red[33];
    const int n = p.width, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* x = (const float*)p.x + (u64)blockIdx.x * n;
    prefetch_l1(p.norm_w, n * 4);  // read after the sum
    float t[RNQ_U];
#pragma unroll
    for (int u = 0; u < RNQ_U; ++u) {
        const int i = threadIdx.x + u * 256;
        t[u] = i < n ? x[i] : 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < RNQ_U; ++u)
        if (threadIdx.x + u * 256 < n) ss += t[u] * t[u];
    const float inv = 1.0f / sqrtf(attn_block_sum(ss, red) / (float)n + p.eps);
    for (int e0 = warp * 128 + lane * 4; e0 < n; e0 += 8 * 128) {  // warp-uniform: the whole block is in the row
        const float4 xv = *(const float4*)(x + e0);
        const float4 wv = *(const float4*)(p.norm_w + e0);
        float v[4] = {wv.x * (xv.x * inv), wv.y * (xv.y * inv), wv.z * (xv.z * inv), wv.w * (xv.w * inv)};
        const u64 at = (u64)blockIdx.x * n + e0;
        if (p.q8) attn_quant4_store(v, p.quant_blk > 0, p.out + at, p.q8 + at, p.q8_scales + at / 128);
        else attn_quant4_store(v, p.quant_blk > 0, p.out + at);
    }
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

// attn_vec_prep layout: a warp per vector, lane l holding channels e = l + 32c (c < VP_C). The 128-thread
// block of v1 (one block per vector) had thread t = l + 32w holding channels t + 128u, i.e. c = w + 4u: the RMS
// partial sums below keep v1's order (per old thread, then per old warp, then across the 4 old warps), so the
// outputs are bit for bit v1's. A block takes VP_VPB vectors of one row of one job, one per warp, and computes
// the row's RoPE sines and cosines once for all of them (v1: once per vector, in double) while their loads
// are in flight.
#define VP_WARPS 4
#define VP_VPB 4
#define VP_C 16  // channels per lane: dim <= 512

struct VpTrig {
    float sn[256], cs[256];
};

// Sum of squares over the vector, in v1's order: thread (w, l) summed u = 0..3 in turn, each warp reduced with
// warp_sum, then warp 0 reduced the 4 warp sums (in lanes 0..3) with warp_sum again.
__device__ __forceinline__ float vp_sum_squares(const float (&x)[VP_C]) {
    const int lane = threadIdx.x & 31;
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        float ss = 0.f;
#pragma unroll
        for (int u = 0; u < 4; ++u) ss += x[w + 4 * u] * x[w + 4 * u];
        ss = warp_sum(ss);
        total = lane == w ? ss : total;
    }
    return warp_sum(total);
}

// Interleaved-pair RoPE of channels [start, dim): the even channel of a pair sits in an even lane, its partner
// in the next lane (same register).
__device__ __forceinline__ void vp_rope(float (&x)[VP_C], const VpTrig& t, int dim, int start) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int c = 0; c < VP_C; ++c) {
        const int e = lane + 32 * c;
        const float other = __shfl_xor_sync(0xffffffffu, x[c], 1);
        if (e >= start && e < dim) {
            const int i = (e - start) >> 1;
            const float sn = t.sn[i], cs = t.cs[i];
            if (((e - start) & 1) == 0) {
                x[c] = x[c] * cs - other * sn;
            } else {
                x[c] = other * sn + x[c] * cs;
            }
        }
    }
}

// Fake quantisation of channels [0, n) in blocks of 32 * G (a trailing partial block is one shorter block):
// block b is registers bG .. bG+G-1 of every lane. Same per-element arithmetic as attn_quant_block_warp, with
// x / s as x * (1 / s): s is a power of two, so 1 / s is exact and so is the product.
template <int G>
__device__ __forceinline__ void vp_quant(float (&x)[VP_C], int n, int fp4) {
    const int lane = threadIdx.x & 31;
    const float maxv = fp4 ? 6.0f : 448.0f;
    const float floorv = fp4 ? 6.0f * 1.17549435e-38f : 1e-4f;
#pragma unroll
    for (int b = 0; b < VP_C / G; ++b) {
        if (b * 32 * G >= n) break;
        float amax = 0.f;
#pragma unroll
        for (int c = b * G; c < b * G + G; ++c)
            if (lane + 32 * c < n) amax = fmaxf(amax, fabsf(x[c]));
        amax = warp_max(amax);
        const float s = attn_pow2_ceil(fmaxf(amax, floorv) / maxv), inv_s = attn_inv_pow2(s);
#pragma unroll
        for (int c = b * G; c < b * G + G; ++c) {
            if (lane + 32 * c < n) {
                const float q = fminf(fmaxf(x[c] * inv_s, -maxv), maxv);
                x[c] = (fp4 ? attn_round_fmt(q, 1, 0) : attn_round_fmt(q, 3, -6)) * s;
            }
        }
    }
}

// Natural-order Walsh-Hadamard transform scaled by n^-1/2 (n = dim, a power of two), with attn_hadamard_smem's
// sequential sum per output (bit-exact: an FP4 rounding follows). Output i = l + 32c (c < NC = n / 32, or one
// register of n lanes when n < 32) adds sign(i, j) * x_j for j = 0, 1, ...; with j = j0 + jl, sign =
// parity(l & jl) ^ parity(32c & j0). The lane's part goes into the sign bit of x_j once per j (mask `low`), the
// register's part by negating the accumulator around each 32-chunk (-(-a + t) == a - t exactly under
// round-to-nearest-even), so each output costs one add per j.
template <int NC>
__device__ __forceinline__ void vp_hadamard_nc(float (&x)[VP_C], const float* tmp, int n) {
    const int lane = threadIdx.x & 31;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.f;
    if ((n & 31) == 0) {
        // Whole 32-chunks: the lane's sign of each jl as a float, so each term is one FFMA (x_j * +-1 is
        // exact, so fma(x_j, +-1, a) is the add a + (+-x_j) bit for bit), and x_j four at a time (broadcast
        // 16-byte shared loads): ~4.25 instructions per j instead of 7 (load, shift, xor, add).
        float sg[32];
#pragma unroll
        for (int jl = 0; jl < 32; ++jl) sg[jl] = (__popc(lane & jl) & 1) ? -1.f : 1.f;
        for (int j0 = 0; j0 < n; j0 += 32) {
#pragma unroll
            for (int c = 0; c < NC; ++c)
                if (__popc((32 * c) & j0) & 1) acc[c] = -acc[c];
            const float4* t4 = reinterpret_cast<const float4*>(tmp + j0);
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const float4 v = t4[q];
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    acc[c] = fmaf(v.x, sg[4 * q], acc[c]);
                    acc[c] = fmaf(v.y, sg[4 * q + 1], acc[c]);
                    acc[c] = fmaf(v.z, sg[4 * q + 2], acc[c]);
                    acc[c] = fmaf(v.w, sg[4 * q + 3], acc[c]);
                }
            }
#pragma unroll
            for (int c = 0; c < NC; ++c)
                if (__popc((32 * c) & j0) & 1) acc[c] = -acc[c];
        }
    } else {
        // n < 32 (one register, n lanes): the sign bit of x_j from the lane's mask.
        u32 low = 0;
        for (int jl = 0; jl < 32; ++jl) low |= (u32)(__popc(lane & jl) & 1) << jl;
        for (int jl = 0; jl < n; ++jl) {
            const float t = __uint_as_float(__float_as_uint(tmp[jl]) ^ ((low << (31 - jl)) & 0x80000000u));
#pragma unroll
            for (int c = 0; c < NC; ++c) acc[c] += t;
        }
    }
    const float scale = 1.0f / sqrtf((float)n);
#pragma unroll
    for (int c = 0; c < NC; ++c) x[c] = acc[c] * scale;
}

__device__ __forceinline__ void vp_hadamard(float (&x)[VP_C], float* tmp, int n) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int c = 0; c < VP_C; ++c)
        if (lane + 32 * c < n) tmp[lane + 32 * c] = x[c];
    __syncwarp();
    if (n >= 512) {
        vp_hadamard_nc<16>(x, tmp, n);
    } else if (n >= 256) {
        vp_hadamard_nc<8>(x, tmp, n);
    } else if (n >= 128) {
        vp_hadamard_nc<4>(x, tmp, n);
    } else if (n >= 64) {
        vp_hadamard_nc<2>(x, tmp, n);
    } else {
        vp_hadamard_nc<1>(x, tmp, n);
    }
    __syncwarp();
}

// One vector (warp-wide), its channels and norm weights already loaded: [RMS], RoPE, quant mode, bf16 store.
__device__ __forceinline__ void vp_finish(const AttnVecPrep& p, const VpTrig& t, float* tmp, float (&x)[VP_C],
                                          const float (&w)[VP_C], int vec, int nvec, int row, int pos, int slot) {
    const int lane = threadIdx.x & 31;
    if (p.rms) {
        const float inv = 1.0f / sqrtf(vp_sum_squares(x) / (float)p.dim + p.eps);
#pragma unroll
        for (int c = 0; c < VP_C; ++c) x[c] = p.norm_w ? w[c] * (x[c] * inv) : x[c] * inv;
    }
    vp_rope(x, t, p.dim, p.dim - p.rdim);
    if (p.quant == ATTN_QUANT_Q8_NOPE) {
        vp_quant<2>(x, p.dim - p.rdim, 0);
    } else if (p.quant == ATTN_QUANT_HAD_Q4) {
        vp_hadamard(x, tmp, p.dim);
        vp_quant<1>(x, p.dim, 1);
    }
    u16* dst = p.window > 0 ? p.out + ((u64)slot * p.window + pos % p.window) * p.dim
                            : p.out + ((u64)row * nvec + vec) * p.dim;
#pragma unroll
    for (int c = 0; c < VP_C; ++c)
        if (lane + 32 * c < p.dim) dst[lane + 32 * c] = f32_to_bf16(x[c]);
}

// The block's share: vector v0 + warp of job `p` in row blockIdx.y. Every global input is requested first, so
// the vector and its weights are in flight while the row's angles are computed (the angles need the position).
__device__ __forceinline__ void vp_block(const AttnVecPrep& p, int nvec, int v0) {
    __shared__ VpTrig trig;
    __shared__ __align__(16) float tmp[VP_WARPS][512];
    const int row = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int vec = v0 + warp;
    const bool live = vec < nvec;
    const float* src = p.x + (u64)row * p.x_stride + (u64)min(vec, nvec - 1) * p.dim;
    float x[VP_C], w[VP_C];
#pragma unroll
    for (int c = 0; c < VP_C; ++c) {
        const int e = lane + 32 * c;
        x[c] = live && e < p.dim ? src[e] : 0.f;
        w[c] = p.norm_w && e < p.dim ? p.norm_w[e] : 0.f;
    }
    const int pos = p.positions[row];
    const int slot = p.window > 0 ? p.slots[row] : 0;
    for (int i = threadIdx.x; i < p.rdim / 2; i += blockDim.x) {
        attn_rope_angle(pos, p.freqs[i], 0, trig.sn[i], trig.cs[i]);
    }
    __syncthreads();
    if (live) vp_finish(p, trig, tmp[warp], x, w, vec, nvec, row, pos, slot);
}

// The parameter block is a grid constant so the job can be picked by index without copying it.
extern "C" __global__ void __launch_bounds__(128, 8) attn_vec_prep(const __grid_constant__ AttnVecPrepJobs p) {
    pdl_wait();
    // Job j owns ceil(nvec[j] / VP_VPB) consecutive blocks along x.
    int b = blockIdx.x, j = 0;
    while (j + 1 < p.njobs && b >= (p.nvec[j] + VP_VPB - 1) / VP_VPB) {
        b -= (p.nvec[j] + VP_VPB - 1) / VP_VPB;
        ++j;
    }
    vp_block(p.job[j], p.nvec[j], b * VP_VPB);
}
