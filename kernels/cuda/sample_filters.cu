// Temperature / top-k / top-p / min-p sampling on the device, one block per row, so that only
// token ids come back to the host and the decision needs no logits copy.
//
// Spec: engine/src/sampler/{draw,select}.rs (`pick`), which this must reproduce token for token:
//   greedy (T <= 0, T NaN, 1/T not finite, top_k == 1) or no finite max -> argmax (ties to the
//   smaller id, NaN never wins);
//   w[i] = (float)exp((double)((l[i] - max) * (1/T))), NaN -> 0;
//   B = the top_k largest (w desc, id asc) when 0 < top_k < V, else all; M = sum of w over B;
//   P = the shortest prefix of B in that order whose mass reaches top_p * M when top_p < 1
//       (all of B when it never does);
//   K = P with w > 0 and w >= min_p; r = u * sum_K w; walk K in id order, r -= w, the first to
//   take r below zero wins (the last of K when rounding leaves a sliver).
// How: keys are the f32 bit patterns of w (w >= 0, so bits order like values). The top-k and
// top-p cut points are found by a 4-round MSB-first radix select (counts for top-k, f64 mass for
// top-p) and ties at the cut are resolved by id with a block prefix count. The walk is a block
// exclusive scan of per-thread sums over contiguous id chunks.
// Layout: logits f32 [rows, V]; params f64 [rows, 5] = (T, top_k, top_p, min_p, u);
//         scratch f32 [rows, V] (the weights); out i32 [rows]. Launch: grid rows, block 1024.
#include "common.cuh"

#define SMP_THREADS 1024
#define SMP_WARPS (SMP_THREADS / 32)

struct SmpShared {
    u32 hist[256];
    double hmass[256];
    double red_d[SMP_WARPS];
    int red_i[SMP_WARPS];
    float red_f[SMP_WARPS];
    // Results of the single-thread steps, broadcast to the block.
    u32 sel_bin;
    int sel_rank;
    double sel_acc;
    int found;
};

// Cut point of a selection: elements with key > key_cut, plus those with key == key_cut and
// id <= id_cut, are in. all = 1: everything is in.
struct SmpCut {
    u32 key;
    int id;
    int all;
};

__device__ __forceinline__ bool smp_in(const SmpCut& c, u32 key, int i) {
    return c.all || key > c.key || (key == c.key && i <= c.id);
}

__device__ __forceinline__ void smp_better_arg(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

__device__ double smp_sum_d(double v, SmpShared& sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_d[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < SMP_WARPS; ++w) t += sh.red_d[w];
    return t;
}

// Exclusive prefix sum of one value per thread, in thread order.
__device__ double smp_excl_d(double v, SmpShared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    double ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) ex = 0.0;
    __syncthreads();
    if (lane == 31) sh.red_d[warp] = x;
    __syncthreads();
    double base = 0.0;
    for (int w = 0; w < warp; ++w) base += sh.red_d[w];
    return base + ex;
}

__device__ int smp_excl_i(int v, SmpShared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    int ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) ex = 0;
    __syncthreads();
    if (lane == 31) sh.red_i[warp] = x;
    __syncthreads();
    int base = 0;
    for (int w = 0; w < warp; ++w) base += sh.red_i[w];
    return base + ex;
}

// The id of the rank-th (1-based) element, in id order, with key == key among those `in` set.
__device__ int smp_tie_id(const float* w, int V, const SmpCut& in, u32 key, int rank, SmpShared& sh) {
    const int chunk = (V + SMP_THREADS - 1) / SMP_THREADS;
    const int lo = min(V, (int)threadIdx.x * chunk), hi = min(V, lo + chunk);
    int n = 0;
    for (int i = lo; i < hi; ++i) {
        const u32 k = __float_as_uint(w[i]);
        n += (k == key && smp_in(in, k, i));
    }
    int before = smp_excl_i(n, sh);
    if (threadIdx.x == 0) sh.sel_rank = -1;
    __syncthreads();
    if (before < rank && rank <= before + n) {
        for (int i = lo; i < hi; ++i) {
            const u32 k = __float_as_uint(w[i]);
            if (k == key && smp_in(in, k, i) && ++before == rank) sh.sel_rank = i;
        }
    }
    __syncthreads();
    return sh.sel_rank;
}

// Top-k: the k-th largest key among all elements, and the id cut among its ties.
__device__ SmpCut smp_top_k(const float* w, int V, int k, SmpShared& sh) {
    u32 prefix = 0, mask = 0;
    int rank = k;
    const SmpCut all = {0, 0, 1};
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (threadIdx.x < 256) sh.hist[threadIdx.x] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
            const u32 key = __float_as_uint(w[i]);
            if ((key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int b = 255;
            for (; b > 0 && rank > (int)sh.hist[b]; --b) rank -= (int)sh.hist[b];
            sh.sel_bin = (u32)b;
            sh.sel_rank = rank;
        }
        __syncthreads();
        prefix |= sh.sel_bin << shift;
        mask |= 255u << shift;
        rank = sh.sel_rank;
        __syncthreads();
    }
    SmpCut c = {prefix, 0, 0};
    c.id = smp_tie_id(w, V, all, prefix, rank, sh);
    return c;
}

// Top-p: the shortest prefix of `b` (w desc, id asc) whose mass reaches target.
__device__ SmpCut smp_top_p(const float* w, int V, const SmpCut& b, double target, SmpShared& sh) {
    u32 prefix = 0, mask = 0;
    double acc = 0.0;  // mass of b's elements with keys above the current prefix's range
    u32 ties = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (threadIdx.x < 256) {
            sh.hist[threadIdx.x] = 0;
            sh.hmass[threadIdx.x] = 0.0;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
            const u32 key = __float_as_uint(w[i]);
            if ((key & mask) == prefix && smp_in(b, key, i)) {
                const u32 bin = (key >> shift) & 255u;
                atomicAdd(&sh.hist[bin], 1u);
                atomicAdd(&sh.hmass[bin], (double)w[i]);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int found = 0;
            for (int bin = 255; bin >= 0; --bin) {
                if (sh.hist[bin] == 0) continue;
                if (acc + sh.hmass[bin] >= target) {
                    sh.sel_bin = (u32)bin;
                    sh.sel_rank = (int)sh.hist[bin];
                    found = 1;
                    break;
                }
                acc += sh.hmass[bin];
            }
            sh.found = found;
            sh.sel_acc = acc;
        }
        __syncthreads();
        if (!sh.found) {
            const SmpCut everything = {0, 0, 1};
            return everything;
        }
        prefix |= sh.sel_bin << shift;
        mask |= 255u << shift;
        acc = sh.sel_acc;
        ties = (u32)sh.sel_rank;
        __syncthreads();
    }
    // The cut lies among the ties at `prefix`: take the fewest that reach the target.
    const double wt = (double)__uint_as_float(prefix);
    int need = 1;
    if (wt > 0.0) need = (int)fmin((double)ties, fmax(1.0, ceil((target - acc) / wt)));
    while (need > 1 && acc + (need - 1) * wt >= target) --need;
    while (need < (int)ties && acc + need * wt < target) ++need;
    SmpCut c = {prefix, 0, 0};
    c.id = smp_tie_id(w, V, b, prefix, need, sh);
    return c;
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
    sample_rows(const float* __restrict__ logits, int V, const double* __restrict__ params,
                float* __restrict__ scratch, i32* __restrict__ out) {
    __shared__ SmpShared sh;
    pdl_wait();
    const int r = blockIdx.x;
    const float* lr = logits + (u64)r * V;
    float* w = scratch + (u64)r * V;
    const double* p = params + (u64)r * 5;
    const float temp = (float)p[0], top_p = (float)p[2], min_p = (float)p[3];
    const long long top_k = (long long)p[1];
    const double u = p[4];
    const float inv_t = 1.0f / temp;

    // Max (ignoring NaN) and argmax (the greedy pick and every fallback).
    float v = -INFINITY;
    int arg = 0x7fffffff;
    for (int c = threadIdx.x; c < V; c += SMP_THREADS) smp_better_arg(v, arg, lr[c], c);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        smp_better_arg(v, arg, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, arg, o));
    if ((threadIdx.x & 31) == 0) {
        sh.red_f[threadIdx.x >> 5] = v;
        sh.red_i[threadIdx.x >> 5] = arg;
    }
    __syncthreads();
    float mx = sh.red_f[0];
    arg = sh.red_i[0];
    for (int i = 1; i < SMP_WARPS; ++i) smp_better_arg(mx, arg, sh.red_f[i], sh.red_i[i]);
    if (arg == 0x7fffffff) arg = 0;
    const bool greedy = !(temp > 0.0f) || !isfinite(inv_t) || top_k == 1;
    if (greedy || !isfinite(mx)) {
        if (threadIdx.x == 0) out[r] = arg;
        return;
    }

    for (int c = threadIdx.x; c < V; c += SMP_THREADS) {
        const float l = lr[c];
        float x = isnan(l) ? 0.0f : (float)exp((double)__fmul_rn(__fsub_rn(l, mx), inv_t));
        w[c] = isnan(x) ? 0.0f : x;
    }
    __syncthreads();

    const SmpCut all = {0, 0, 1};
    const SmpCut b = (top_k > 0 && top_k < V) ? smp_top_k(w, V, (int)top_k, sh) : all;
    SmpCut pc = all;
    if (top_p < 1.0f) {
        double m = 0.0;
        for (int c = threadIdx.x; c < V; c += SMP_THREADS)
            if (smp_in(b, __float_as_uint(w[c]), c)) m += (double)w[c];
        m = smp_sum_d(m, sh);
        pc = smp_top_p(w, V, b, (double)top_p * m, sh);
    }
    const float min_w = fminf(fmaxf(min_p, 0.0f), 1.0f);

    // Walk the survivors in id order: per-thread contiguous chunks, exclusive scan of their mass.
    const int chunk = (V + SMP_THREADS - 1) / SMP_THREADS;
    const int lo = min(V, (int)threadIdx.x * chunk), hi = min(V, lo + chunk);
    double mine = 0.0;
    int last = -1;
    for (int i = lo; i < hi; ++i) {
        const float x = w[i];
        const u32 k = __float_as_uint(x);
        if (x > 0.0f && x >= min_w && smp_in(b, k, i) && smp_in(pc, k, i)) {
            mine += (double)x;
            last = i;
        }
    }
    const double total = smp_sum_d(mine, sh);
    const double before = smp_excl_d(mine, sh);
    int lastk = last;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) lastk = max(lastk, __shfl_xor_sync(0xffffffffu, lastk, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_i[threadIdx.x >> 5] = lastk;
    if (threadIdx.x == 0) sh.sel_rank = -1;
    __syncthreads();
    for (int i = 0; i < SMP_WARPS; ++i) lastk = max(lastk, sh.red_i[i]);
    if (!(total > 0.0)) {
        if (threadIdx.x == 0) out[r] = arg;
        return;
    }
    double rem = u * total - before;
    if (rem >= 0.0 && rem < mine) {
        for (int i = lo; i < hi; ++i) {
            const float x = w[i];
            const u32 k = __float_as_uint(x);
            if (x > 0.0f && x >= min_w && smp_in(b, k, i) && smp_in(pc, k, i)) {
                rem -= (double)x;
                if (rem < 0.0) {
                    sh.sel_rank = i;
                    break;
                }
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) out[r] = sh.sel_rank >= 0 ? sh.sel_rank : lastk;
}
