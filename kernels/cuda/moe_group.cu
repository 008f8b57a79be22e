// Groups the routed slots by expert on the device for the expert GEMVs (fp4_expert.cu, bf16_expert.cu): the
// `meta` layout is described in fp4_expert.cu's header. moe_route.cu's moe_route_group calls moe_group_block in
// its last block. (Moved out of fp4_expert.cu unchanged.)
#include "common.cuh"

// Groups the S = B*topk slots by expert in one block (every loop strides by blockDim; warp 0 scans). Ids
// outside [0, E) are dropped. meta = [num_groups, group_expert[S], group_start[S+1], slots[S]]. `sm` is at
// least 5120 ints of shared memory. The ids are read with ld.global.cg (L2, never the non-coherent read-only
// path): moe_route_group calls this on ids that other blocks of the same launch wrote.
__device__ __forceinline__ void moe_group_block(const i32* ids, int S, int E, i32* __restrict__ meta, int* sm) {
    int* cnt = sm;           // [1024]
    int* start = sm + 1024;  // [1024]
    int* gidx = sm + 2048;   // [1024]
    int* sid = sm + 3072;    // [2048] the ids, when they fit: the rank loop below re-reads them S times
    __shared__ int totals[2];
    const int tid = threadIdx.x, lane = tid & 31;
    for (int e = tid; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < S; i += blockDim.x) {
        const int e = __ldcg(ids + i);
        if (i < 2048) sid[i] = e;
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (tid < 32) {  // exclusive scans of counts and of "expert is used", 32 experts at a time
        int run_c = 0, run_g = 0;
        for (int base = 0; base < E; base += 32) {
            const int e = base + lane;
            const int c = e < E ? cnt[e] : 0, used = c > 0 ? 1 : 0;
            int ic = c, ig = used;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int vc = __shfl_up_sync(0xffffffffu, ic, o), vg = __shfl_up_sync(0xffffffffu, ig, o);
                if (lane >= o) { ic += vc; ig += vg; }
            }
            if (e < E) { start[e] = run_c + ic - c; gidx[e] = run_g + ig - used; }
            run_c += __shfl_sync(0xffffffffu, ic, 31);
            run_g += __shfl_sync(0xffffffffu, ig, 31);
        }
        if (lane == 0) { totals[0] = run_g; totals[1] = run_c; }
    }
    __syncthreads();
    const int G = totals[0];
    i32* group_expert = meta + 1;
    i32* group_start = meta + 1 + S;
    i32* slots = meta + 2 + 2 * S;
    if (tid == 0) { meta[0] = G; group_start[G] = totals[1]; }
    for (int e = tid; e < E; e += blockDim.x)
        if (cnt[e] > 0) { group_expert[gidx[e]] = e; group_start[gidx[e]] = start[e]; }
    for (int i = tid; i < S; i += blockDim.x) {
        const int e = i < 2048 ? sid[i] : __ldcg(ids + i);
        if (e < 0 || e >= E) continue;
        int rank = 0;  // all lanes read sid[j] together: a shared-memory broadcast
        if (S <= 2048)
            for (int j = 0; j < i; ++j) rank += sid[j] == e ? 1 : 0;
        else
            for (int j = 0; j < i; ++j) rank += __ldcg(ids + j) == e ? 1 : 0;
        slots[start[e] + rank] = i;
    }
}

// moe_group: moe_group_block as its own launch (the tensor-split rank groups its localized ids with it).
// The launcher uses 256 threads.
extern "C" __global__ void __launch_bounds__(1024) moe_group(const i32* __restrict__ ids, int S, int E,
                                                             i32* __restrict__ meta) {
    pdl_wait();
    __shared__ int sm[5120];
    moe_group_block(ids, S, E, meta, sm);
}
