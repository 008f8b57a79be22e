// Lightning indexer top-k (spec 2.6), decode and prefill: attn_index_topk writes the indices of the k largest
// scores of each row (all n when n <= k), ascending index order, ties at the threshold broken towards lower
// indices: the CPU reference's rule on the order-preserving u32 image of the f32 scores (attn_order_key: the
// total order of f32::total_cmp, NaNs included). Exact and deterministic: every path below selects the same set,
// and a row's path depends on its own scores only (the same at every batch size).
// scores f32 [slots, cap] (row r reads slot slots[r], n = min((positions[r] + 1) / ratio, cap) entries); sel
// int [rows, k]. Launch: grid rows, block 1024, ~44 KB of static shared memory (sm_120's 99 KB: fine), no
// dynamic; k <= 1024 (TOPK_MAX). Plain CUDA (match.any, ballots, shared atomics, named barrier 1).
//
// Paths (uniform per block):
// - n <= TOPK_CAND (4096; 16K context at ratio 4): the exact select over all keys, staged in shared memory.
// - n > TOPK_CAND, the filter (topk_filter): T = the k-th largest of 2048 group maxima (a select over 2048
//   values); k groups have a maximum >= T, so at least k keys are >= T: T <= the k-th largest key. One pass of
//   ballots counts the keys above (gt) and equal to (eq) T; then
//   - gt < k: T is the k-th largest key; the selection (every key above it, the first k - gt equal to it) is
//     written at once. Ties: all scores equal, as in `dsv4 bench`, whose index keys are all zero.
//   - gt + eq <= TOPK_CAND (random scores: ~1.1-1.4 k): the keys >= T are compacted into shared memory in
//     index order and the exact select runs on them only.
//   - else (an adversarial spread, see the Staircase test): the exact select over all n keys from L2.
// The exact select: radix select (topk_radix) with up to 4 passes of 8 bits (256-bin shared histogram,
// warp-aggregated atomics, the bin holding the k-th largest found by a suffix scan; two barriers a pass), stopping
// once the chosen bin is taken whole; then one ordered pass (topk_emit): each thread owns a contiguous segment,
// one block scan of (above, equal) counts gives its output position.
// History (H200, batch 1, k = 512, n = 16384 at the 64K bench / 1024 at 4K; the bench's scores are all equal):
// eager timings of v1 (serial 256-bin scans) 52 us and v2 (the exact select over all keys in one block, staged in
// dynamic shared memory) 34 us at n 16384. ncu gpu__time_duration: v2 with padded slots 27.8 / 7.6 us; v3's first
// form (ties through the L2 path) 42.7 / 6.5 us; v3 (this) kernels/BENCH_NOTES.md, branch idxtopk.
#include "common.cuh"

#define TOPK_THREADS 1024
#define TOPK_CAND 4096                             // candidate keys the block keeps in shared memory
#define TOPK_CAND_SLOTS (TOPK_CAND + TOPK_CAND / 32)  // with topk_slot's padding
#define TOPK_GROUPS (2 * TOPK_THREADS)             // group maxima of the filter (>= 2 * TOPK_MAX)
#define TOPK_REG_ROUNDS 18  // rounds a thread keeps in registers (n <= 18432): 64 registers, 1 word spilled on sm_120a

struct AttnIndexTopk {
    const float* scores;
    const int* slots;
    const int* positions;
    int* sel;  // [rows, k]
    int cap, ratio, k;
    int pad;
};

__device__ __forceinline__ u32 attn_order_key(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Inclusive prefixes of x and y over the lanes of a warp.
__device__ __forceinline__ void topk_warp_scan2(int& x, int& y) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int xo = __shfl_up_sync(0xffffffffu, x, o), yo = __shfl_up_sync(0xffffffffu, y, o);
        if (lane >= o) {
            x += xo;
            y += yo;
        }
    }
}

// Exclusive prefixes over the block (thread order) of two counts at once; *total gets their sums. `sh` >= 64
// ints, free (no thread still reading it) on entry.
__device__ __forceinline__ int2 topk_scan2(int a, int b, int* sh, int2* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = a, y = b;
    topk_warp_scan2(x, y);
    if (lane == 31) {
        sh[warp] = x;
        sh[32 + warp] = y;
    }
    __syncthreads();
    if (warp == 0) {
        int u = lane < nw ? sh[lane] : 0, v = lane < nw ? sh[32 + lane] : 0;
        topk_warp_scan2(u, v);
        if (lane < nw) {
            sh[lane] = u;  // inclusive warp totals
            sh[32 + lane] = v;
        }
    }
    __syncthreads();
    *total = make_int2(sh[nw - 1], sh[32 + nw - 1]);
    return make_int2((warp > 0 ? sh[warp - 1] : 0) + x - a, (warp > 0 ? sh[32 + warp - 1] : 0) + y - b);
}

// Shared-memory slot of candidate i: one padding word per 32, so that topk_emit, where thread t reads its
// contiguous segment t * seg + j, hits distinct banks (v2 measured a 16-way conflict at seg 16 without it).
__device__ __forceinline__ int topk_slot(int i) { return i + (i >> 5); }

// The k-th largest of the m keys key(i) (k <= m): its top bits in `prefix` (on the bits of `mask`) and how many
// of the keys equal to it on those bits are taken (`remaining`). Two barriers a pass: the histograms and the
// results alternate between two buffers, so that the next pass's histogram is cleared during this pass's scan
// and no thread can overwrite a result another is still reading. Needs hist[0] zero (and a barrier since);
// leaves both histograms dirty. `sh` (>= 8 ints) is free on entry and again on return.
template <class Key>
__device__ __forceinline__ void topk_radix(const Key& key, int m, int k, int (*hist)[256], int* sh,
                                           u32 (*chosen)[3], u32& prefix, u32& mask, int& remaining) {
    const int lane = threadIdx.x & 31;
    prefix = 0;
    mask = 0;
    remaining = k;
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass, b = pass & 1;
        int* h = hist[b];
        for (int c = 0; c < m; c += blockDim.x) {
            const int i = c + threadIdx.x;
            const u32 u = i < m ? key(i) : 0u;
            const bool in = i < m && (u & mask) == prefix;
            const int bin = in ? (int)((u >> shift) & 255u) : -1 - lane;  // distinct dummies never match
            const u32 peers = __match_any_sync(0xffffffffu, bin);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&h[bin], __popc(peers));
        }
        __syncthreads();
        // Suffix counts: thread d < 256 (warps 0-7) finds the bin where the count from the top reaches
        // `remaining`; that bin is unique. Warps 8-15 clear the other histogram meanwhile.
        if (threadIdx.x < 256) {
            const int d = 255 - threadIdx.x;  // thread order = descending bins
            const int hd = h[d];
            int x = hd;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += y;
            }
            if (lane == 31) sh[threadIdx.x >> 5] = x;
            asm volatile("bar.sync 1, 256;" ::: "memory");
            int above = 0;
            for (int w = 0; w < (int)(threadIdx.x >> 5); ++w) above += sh[w];
            const int incl = above + x;  // count of bins >= d
            if (incl >= remaining && incl - hd < remaining) {
                chosen[b][0] = (u32)d;
                chosen[b][1] = (u32)(remaining - (incl - hd));
                chosen[b][2] = (u32)hd;
            }
        } else if (threadIdx.x < 512) {
            hist[b ^ 1][threadIdx.x - 256] = 0;
        }
        __syncthreads();
        prefix |= chosen[b][0] << shift;
        mask |= 255u << shift;
        const bool whole = (int)chosen[b][1] == (int)chosen[b][2];  // every key in the bin is taken
        remaining = (int)chosen[b][1];
        if (whole) break;
    }
}

// Writes idx(i) of the selected keys in order of i: every key above `prefix` (on `mask`) and the first
// `remaining` equal to it. Thread t owns keys [t * seg, (t + 1) * seg); one scan of (above, equal) gives its
// output position: the keys above before it plus min(ties before it, remaining).
template <class Key, class Idx>
__device__ __forceinline__ void topk_emit(const Key& key, const Idx& idx, int m, u32 prefix, u32 mask,
                                          int remaining, int* sh, int* sel) {
    const int seg = (m + blockDim.x - 1) / blockDim.x;
    const int i0 = min((int)threadIdx.x * seg, m), i1 = min(i0 + seg, m);
    int gt = 0, eq = 0;
    for (int i = i0; i < i1; ++i) {
        const u32 u = key(i) & mask;
        gt += u > prefix ? 1 : 0;
        eq += u == prefix ? 1 : 0;
    }
    int2 total;
    const int2 before = topk_scan2(gt, eq, sh, &total);
    int at = before.x + min(before.y, remaining);
    int eq_left = max(remaining - before.y, 0);  // ties this thread may still take
    for (int i = i0; i < i1; ++i) {
        const u32 u = key(i) & mask;
        bool take = u > prefix;
        if (u == prefix && eq_left > 0) {
            take = true;
            --eq_left;
        }
        if (take) sel[at++] = idx(i);
    }
}

// f(r, i, key) for the rounds [lo, hi) of this thread in topk_filter (key 0 past n): rounds below
// TOPK_REG_ROUNDS from kr (indices fixed at compile time once unrolled, so kr stays in registers), later ones
// read from s.
template <class F>
__device__ __forceinline__ void topk_rounds(const u32 (&kr)[TOPK_REG_ROUNDS], const float* s, int n, int lo, int hi,
                                            const F& f) {
#pragma unroll
    for (int r = 0; r < TOPK_REG_ROUNDS; ++r) {
        if (r >= lo && r < hi) f(r, r * TOPK_THREADS + (int)threadIdx.x, kr[r]);
    }
    for (int r = max(lo, TOPK_REG_ROUNDS); r < hi; ++r) {
        const int i = r * TOPK_THREADS + threadIdx.x;
        f(r, i, i < n ? attn_order_key(__ldcg(s + i)) : 0u);
    }
}

#define TOPK_DONE (-2)  // topk_filter wrote the selection itself
#define TOPK_OVERFLOW (-1)  // topk_filter found too many candidates
#define TOPK_ALL 0x7fffffff  // every key equal to T is a candidate

// The filter (n > TOPK_CAND). Round r of thread t is key r * 1024 + t (coalesced); the first TOPK_REG_ROUNDS
// rounds stay in registers, later ones are read again. The groups of the maxima are the residue classes mod
// TOPK_GROUPS, so that each samples the whole row (with groups of neighbouring keys a trend along the row would
// leave T far below the k-th largest). With gt / eq the counts of keys above / equal to T:
// - gt < k: T is the k-th largest itself (k <= gt + eq always), so the selection is every key above T and the
//   first k - gt equal to it. Written to sel at once; returns TOPK_DONE. (Heavy ties: all scores equal, as
//   in `dsv4 bench`, whose index keys are all zero.)
// - else gt + eq <= TOPK_CAND: the keys >= T go to ckey / cidx at topk_slot(j) in index order; returns their
//   count for the exact select.
// - else TOPK_OVERFLOW.
// Ordered writes take 32 rounds at a time: counts per (round, warp) in tgt / teq, one block scan over them in
// (round, warp) order = index order. Rows of more than 32 rounds count their totals in a pass of their own.
__device__ __forceinline__ int topk_filter(const float* s, int n, int k, int* sel, u32* ckey, int* cidx, int* tgt,
                                           int* teq, int (*hist)[256], int* sh, u32 (*chosen)[3]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rounds = (n + TOPK_THREADS - 1) / TOPK_THREADS;
    u32 kr[TOPK_REG_ROUNDS];
#pragma unroll
    for (int r = 0; r < TOPK_REG_ROUNDS; ++r) {
        const int i = r * TOPK_THREADS + threadIdx.x;
        kr[r] = r < rounds && i < n ? attn_order_key(__ldcg(s + i)) : 0u;
    }
    // Group maxima: this thread's even and odd rounds. 0 (an empty group) is below every key but one NaN
    // pattern's: a T of 0 then counts every key as >= T, which stays correct.
    u32 even = 0u, odd = 0u;
    topk_rounds(kr, s, n, 0, rounds, [&](int r, int, u32 u) {
        if (r & 1) odd = max(odd, u);
        else even = max(even, u);
    });
    // The maxima go where the candidates will be (they are dead before the first candidate is written).
    ckey[threadIdx.x] = even;
    ckey[TOPK_THREADS + threadIdx.x] = odd;
    __syncthreads();
    u32 t, tmask;
    int trem;
    topk_radix([&](int i) { return ckey[i]; }, TOPK_GROUPS, k, hist, sh, chosen, t, tmask, trem);
    // t (zero below the mask) <= the k-th largest maximum. Clean histograms for the next select.
    if (threadIdx.x < 512) hist[threadIdx.x >> 8][threadIdx.x & 255] = 0;
    // ties = how many keys equal to t are taken: k - gt (>= 1) when t is the k-th largest, else all of them
    // (TOPK_ALL); 0 while not known.
    int ties = 0;
    auto decide = [&](int gt, int eq) {
        if (gt < k) return k - gt;
        return gt + eq <= TOPK_CAND ? TOPK_ALL : TOPK_OVERFLOW;
    };
    if (rounds > 32) {
        int gt = 0, eq = 0;
        topk_rounds(kr, s, n, 0, rounds, [&](int, int i, u32 u) {
            gt += __popc(__ballot_sync(0xffffffffu, i < n && u > t));
            eq += __popc(__ballot_sync(0xffffffffu, i < n && u == t));
        });
        int2 total;
        topk_scan2(lane == 0 ? gt : 0, lane == 0 ? eq : 0, sh, &total);
        ties = decide(total.x, total.y);
        if (ties == TOPK_OVERFLOW) return TOPK_OVERFLOW;
    }
    const u32 below = (1u << lane) - 1u;
    int gt_done = 0, eq_done = 0;  // counts of the earlier batches
    for (int c0 = 0; c0 < rounds; c0 += 32) {
        const int c1 = min(c0 + 32, rounds);
        topk_rounds(kr, s, n, c0, c1, [&](int r, int i, u32 u) {
            const u32 g = __ballot_sync(0xffffffffu, i < n && u > t), e = __ballot_sync(0xffffffffu, i < n && u == t);
            if (lane == 0) {
                tgt[(r - c0) * 32 + warp] = __popc(g);
                teq[(r - c0) * 32 + warp] = __popc(e);
            }
        });
        __syncthreads();
        const bool live = (int)(threadIdx.x >> 5) < c1 - c0;
        int2 total;
        const int2 before = topk_scan2(live ? tgt[threadIdx.x] : 0, live ? teq[threadIdx.x] : 0, sh, &total);
        if (ties == 0) {  // one batch: its totals are the row's
            ties = decide(total.x, total.y);
            if (ties == TOPK_OVERFLOW) return TOPK_OVERFLOW;
        }
        tgt[threadIdx.x] = gt_done + before.x;
        teq[threadIdx.x] = eq_done + before.y;
        __syncthreads();
        const bool done = ties != TOPK_ALL;
        topk_rounds(kr, s, n, c0, c1, [&](int r, int i, u32 u) {
            const bool fg = i < n && u > t, fe = i < n && u == t;
            const u32 g = __ballot_sync(0xffffffffu, fg), e = __ballot_sync(0xffffffffu, fe);
            const int gb = tgt[(r - c0) * 32 + warp] + __popc(g & below);
            const int eb = teq[(r - c0) * 32 + warp] + __popc(e & below);
            if (fg || (fe && eb < ties)) {
                const int j = gb + min(eb, ties);
                if (done) {
                    sel[j] = i;
                } else {
                    ckey[topk_slot(j)] = u;
                    cidx[topk_slot(j)] = i;
                }
            }
        });
        gt_done += total.x;
        eq_done += total.y;
        __syncthreads();
    }
    return ties != TOPK_ALL ? TOPK_DONE : gt_done + eq_done;
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) attn_index_topk(AttnIndexTopk p) {
    __shared__ u32 ckey[TOPK_CAND_SLOTS];
    __shared__ int cidx[TOPK_CAND_SLOTS];
    __shared__ int tgt[TOPK_THREADS], teq[TOPK_THREADS];
    __shared__ int hist[2][256];
    __shared__ int sh[64];
    __shared__ u32 chosen[2][3];
    if (threadIdx.x < 512) hist[threadIdx.x >> 8][threadIdx.x & 255] = 0;  // topk_radix's precondition
    pdl_wait();
    const int row = blockIdx.x;
    int n = (p.positions[row] + 1) / p.ratio;
    n = n < p.cap ? n : p.cap;
    int* sel = p.sel + (u64)row * p.k;
    if (n <= p.k) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) sel[i] = i;
        return;
    }
    const float* s = p.scores + (u64)p.slots[row] * p.cap;
    u32 prefix, mask;
    int remaining;
    auto cand = [&](int j) { return ckey[topk_slot(j)]; };
    if (n <= TOPK_CAND) {
#pragma unroll 4
        for (int i = threadIdx.x; i < n; i += blockDim.x) ckey[topk_slot(i)] = attn_order_key(__ldcg(s + i));
        __syncthreads();
        topk_radix(cand, n, p.k, hist, sh, chosen, prefix, mask, remaining);
        topk_emit(cand, [](int j) { return j; }, n, prefix, mask, remaining, sh, sel);
        return;
    }
    const int m = topk_filter(s, n, p.k, sel, ckey, cidx, tgt, teq, hist, sh, chosen);
    if (m == TOPK_DONE) return;
    if (m >= 0) {
        topk_radix(cand, m, p.k, hist, sh, chosen, prefix, mask, remaining);
        topk_emit(cand, [&](int j) { return cidx[topk_slot(j)]; }, m, prefix, mask, remaining, sh, sel);
        return;
    }
    auto key = [&](int i) { return attn_order_key(__ldcg(s + i)); };
    topk_radix(key, n, p.k, hist, sh, chosen, prefix, mask, remaining);
    topk_emit(key, [](int i) { return i; }, n, prefix, mask, remaining, sh, sel);
}
