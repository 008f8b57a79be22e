// peer_sum_f32: the all-reduce of ranks on different GPUs of ONE process with peer access (NVLink), in
// place of NCCL for the small messages of the tensor-split decode. One launch per rank, every rank's launch
// with the same n (so the same grid). Block b of rank r:
//   1. pushes its chunk of buf into every peer q's receive slot [parity][r] (remote stores over NVLink);
//   2. raises its flag on every peer (flags_q[r][b] = e, a release store at system scope);
//   3. waits until every peer's flag for block b in its own memory reaches e (acquire loads);
//   4. sums the chunk in rank order, buf[i] = v0 + v1 + ..., v_r its own value and v_q the slot q received.
// Every rank adds the same values in the same order, so every rank gets the same bits (and those of the CPU
// sum in rank order). e is the call's epoch: a counter in device memory that each launch reads (after
// pdl_wait) and the last block to finish advances, so a captured graph replays correctly any number of times
// and eager calls interleave with replays. Why two parities suffice: rank r can only start call k+2 after
// its call k+1 saw every peer's flag k+1, which the peer raised inside its call k+1, i.e. after its call k
// completed (stream order), so nobody still reads the parity-k slot that call k+2 overwrites. A flag can
// run at most one epoch ahead of the waiter (the same argument), hence the `>=` test. Epochs and flags are
// 64-bit: a flag slot that small calls leave unused for a long time can never look current by wrapping.
// A peer that never arrives (its launch failed, a host error mid-step) makes the wait trap after
// PEER_TIMEOUT_NS: the trap aborts the context with an error the host sees at its next sync, so a sum of stale
// data is never produced or used. Launch: grid ceil(n / elements per block) in 1..PEER_BLOCKS (ops/peer.rs),
// block PEER_THREADS.
#include "common.cuh"

#define PEER_RANKS 8
#define PEER_BLOCKS 128
#define PEER_THREADS 256
#define PEER_TIMEOUT_NS 30000000000ull

struct PeerPtrs {
    u64 recv[PEER_RANKS];   // rank q's receive area: f32 [2 parities][world senders][cap]
    u64 flags[PEER_RANKS];  // rank q's flags: u64 [world senders][PEER_BLOCKS], then u64 [2] epoch, blocks done
};

__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_sys(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Spins until *f has reached epoch e, trapping after PEER_TIMEOUT_NS.
__device__ void peer_wait(const u64* f, u64 e) {
    u64 t0 = 0;
    for (u32 k = 1; ld_acquire_sys(f) < e; ++k) {
        if ((k & 1023u) != 0) continue;
        const u64 now = global_ns();
        if (t0 == 0) t0 = now;
        else if (now - t0 > PEER_TIMEOUT_NS) __trap();
    }
}

// The sum of element i (or of 4 at i) in rank order; slot(q) is sender q's received copy.
__device__ __forceinline__ float4 peer_sum4(float4 own, const float* slots, u64 cap, u64 i, int rank, int world) {
    float4 s = rank == 0 ? own : __ldcg((const float4*)(slots + i));
    for (int q = 1; q < world; ++q) {
        const float4 v = q == rank ? own : __ldcg((const float4*)(slots + (u64)q * cap + i));
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
    }
    return s;
}

__device__ __forceinline__ float peer_sum1(float own, const float* slots, u64 cap, u64 i, int rank, int world) {
    float s = rank == 0 ? own : __ldcg(slots + i);
    for (int q = 1; q < world; ++q) s += q == rank ? own : __ldcg(slots + (u64)q * cap + i);
    return s;
}

extern "C" __global__ void __launch_bounds__(PEER_THREADS)
    peer_sum_f32(float* __restrict__ buf, u64 n, const __grid_constant__ PeerPtrs p, u64* __restrict__ state, int rank, int world, u64 cap) {
    pdl_wait();
    __shared__ u64 s_epoch;
    if (threadIdx.x == 0) s_epoch = *(volatile u64*)state + 1ull;
    __syncthreads();
    const u64 e = s_epoch;
    const u64 par = e & 1ull;
    // The block's chunk [lo, hi): a multiple of 4 long except the last, so float4 accesses stay aligned.
    const u64 per = ((n + gridDim.x - 1) / gridDim.x + 3) & ~3ull;
    const u64 lo = min(n, (u64)blockIdx.x * per), hi = min(n, lo + per);
    const u64 quads = (hi - lo) / 4, tail = lo + quads * 4;

    for (int q = 0; q < world; ++q) {
        if (q == rank) continue;
        float* dst = (float*)p.recv[q] + (par * world + rank) * cap;
#pragma unroll 4
        for (u64 j = threadIdx.x; j < quads; j += blockDim.x) {
            const u64 i = lo + 4 * j;
            *(float4*)(dst + i) = *(const float4*)(buf + i);
        }
        for (u64 i = tail + threadIdx.x; i < hi; i += blockDim.x) dst[i] = buf[i];
    }
    __syncthreads();
    const int t = threadIdx.x;
    if (t < world && t != rank) {
        // The release covers the whole block's pushes: they precede it through the barrier (PTX release
        // patterns are cumulative), so no separate system fence is needed.
        st_release_sys((u64*)p.flags[t] + (u64)rank * PEER_BLOCKS + blockIdx.x, e);
        peer_wait((const u64*)p.flags[rank] + (u64)t * PEER_BLOCKS + blockIdx.x, e);
    }
    __syncthreads();

    const float* slots = (const float*)p.recv[rank] + par * world * cap;
#pragma unroll 4
    for (u64 j = threadIdx.x; j < quads; j += blockDim.x) {
        const u64 i = lo + 4 * j;
        *(float4*)(buf + i) = peer_sum4(*(const float4*)(buf + i), slots, cap, i, rank, world);
    }
    for (u64 i = tail + threadIdx.x; i < hi; i += blockDim.x) buf[i] = peer_sum1(buf[i], slots, cap, i, rank, world);

    // The last block to finish advances the epoch (every block has read it by then).
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(state + 1, 1ull) == gridDim.x - 1) {
            state[1] = 0ull;
            state[0] = e;
        }
    }
}
