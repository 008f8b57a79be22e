// Routed-expert FP4 (e2m1, per-32 UE8M0 scales) GEMV, grouped by expert, for decode.
//
// Math:    for each slot i = b*topk + k with expert e = ids[i]:
//          y[i, n] = sum_j x[r(i), j] * fp4(Wq[e, n, j]) * S[e, n, j / 32],  r(i) = i if x_per_slot else b.
//          (w1/w3 read the token's row: x_per_slot = 0; w2 reads each slot's own hidden row: x_per_slot = 1.)
// Layout:  Wq u8 [E, N, K/2], element 2m in the LOW nibble of byte m; S u8 UE8M0 [E, N, K/32]; x bf16
//          [rows, K]; y f32 or bf16 [B*topk, N]; ids i32 [B*topk] in device memory.
// Grouping: `moe_group` (one block), or the last block of `moe_route_group` (moe_route.cu), turns ids into
//          groups on the device: meta = [num_groups, group_expert[S], group_start[S+1], slots[S], counter]
//          with S = B*topk, slots sorted by expert then by slot (deterministic). Every expert's weights are
//          then read ONCE for all the tokens that chose it. (counter: moe_route_group's, zero between launches.)
// Launch:  fp4_expert_mtM (M = 1, 2): grid (ceil(N / (64 M / kw)), min(E, S), matrices), block 128 (4 warps);
//          blockIdx.z picks the matrix (routed w1 and w3 in one launch, see FP4_EXPERT_KERNEL); blocks
//          past num_groups exit at once (fixed grid: graph-capturable). A warp owns 16 M rows of one expert;
//          kw warps (1, 2, 4) split K and reduce through shared memory in a fixed order; M and kw are picked
//          on the host from the shape (Fp4Tune). Decode groups hold 1-2 tokens, so the token tile is one mma
//          n8 tile; a group of more than 8 tokens takes further passes (its weights come again, mostly L2).
//          fp4_expert_n{N}k{K}w{KW} (fp4_expert_fixed, v6): the same kernel with the model's sizes compiled in;
//          the host takes it instead of fp4_expert_mt2 when the shape and kw match (same bits).
// Memory:  each thread streams its 2M rows x 16 B per 128-wide K chunk global -> shared with cp.async.cg into
//          a private 3-stage ring (a thread reads back only what it copied), so 2 chunks are in flight while it
//          computes one. The scale words (K % 128 == 0) ride along: lane l copies the 4-byte word of its warp's
//          row l into a warp-shared ring one slot deeper (see fp4_expert_body); otherwise they are plain byte
//          loads. x comes through L1 (every warp of the group re-reads it); with 16-row warps only the lanes
//          of real columns load it (batch 1: 4 of 32 lanes), padding columns keep zeros.
// Compute: mma.sync m16n8k16 bf16 (sm_80+). 16 weight bytes = 32 fp4 values = exactly one scale group per
//          thread and row. Nibbles 2i and 2i+1 of a word form one bf16x2 (so x's words are the B fragments as
//          loaded), each a bf16 bit pattern (value * 2^-126) from the device layout's rotation and mask
//          (fp4_pairs, common.cuh), then one packed bf16 multiply by 2^126 * S (exact: power of two). That
//          decode is what bounds the kernel once the loads are in flight: the integer pipe runs at half rate.
// Weights: Wq and S are in the device layouts (fp4_layout.cu), not the checkpoint's order: bits moved within each
//          word, and (fp4_tiled) the rows in 2 KB tiles, a warp's chunk of 32 rows contiguous (fp4_w_at).
// Default tuning (Fp4Tune::for_shape, after v5 and the scale layout): mt2 at every batch, kw = chunks / 8
//          clamped to 1..4 (kbench 2026-11-30: 32-row warps now beat 16-row ones at batch 1 too).
// Constraints: K % 32 == 0, scale exponent byte <= 128 (scale <= 2; real scales are far smaller), E <= 1024.
//
// Variants (H200, `kbench fp4`: w1 2048x4096 per token / w2 4096x2048 per slot, 256 experts, top-6, with
// the moe_group launch, ids rotated over 8 sets so L2 holds no weights; x = time over the floor of weight +
// scale bytes at the measured copy rate 4234 GB/s):
//   v1  NT (1/2/4/8 mma n-tiles) picked from the WHOLE batch, 256 threads split K 8 ways, registers only
//       (8 x 16 B loads per thread, then compute; fixed ids): w1 B=1 18.4 us, B=8 94 us (2.3x), B=64 1279 us
//       (5.1x: NT=8 with 172 registers for groups of ~1.5 tokens, 1 block per SM).
//   v2  NT=1 always, cp.async rings (depth 3 or 4), 32-row warps, kw 1/2/4, 72 registers, 7 blocks/SM:
//       w1 B=1 25.0 us (kw4), B=8 112.6 (kw4, 2.2x), B=64 502 (kw2, 1.94x); w2 B=1 22.7, B=8 105.6 (kw2,
//       2.1x), B=64 480 (kw1/2, 1.85x). Depth 4 (5 blocks/SM) slower everywhere by 1-10%. All variants
//       at ~2.1-2.3 TB/s whatever kw or depth: SASS showed 697 instructions per chunk and warp, half of them
//       address/predicate work and generic->shared conversions around the copies, so issue-bound.
//   v3  32-bit row offsets, shared addresses computed once, unconditional x loads, 16-row warps (mt1) for
//       small batches: 462 instructions per chunk; measured (2026-11-29, third session) w1 B=64 ~475 us.
//   v4  (this) ncu at B=64 showed the L1 data pipe 92% busy and DRAM 38%: each 4-byte scale cp.async cost one
//       L1 wavefront per lane (32 per instruction, 4 instructions per chunk, the 4 lanes of a row copying the
//       same word) = 70% of all L1 wavefronts. Now one 4-byte copy per lane and chunk, lane l = row l (L1 60%,
//       the ALU pipe 72% and issue 76% are the limit now), and for 16-row warps whose block has every row,
//       one offset + stride instead of per-slot offsets (ptxas rematerialised those from the parameters
//       every chunk); for 32-row warps that variant measured 10% slower (a worse schedule), so it is not
//       used there. With kw 4 for 32-row warps (kbench, us, old default kw2 -> now): w1 B=8 100.5 -> 85.6,
//       B=64 453.8 -> 381-397; w2 B=8 87.0 -> 84.7, B=64 404 -> 401. Full model +10% tok/s at batch 8 and 64.
//   v5  (this) weights in the device layout (fp4_layout.cu): 9 integer ops per word instead of 15; the main
//       chunk loop went from 478 to 382 SASS instructions (mt2) and 263 to 215 (mt1). Measured (2026-11-30,
//       kbench, rotated ids, us): w1 B=8 85.6 -> 83.0, B=64 381-397 -> 385.5; w2 B=8 84.7 -> 83.3, B=64 401
//       -> 378; full model (graphs, 4K) batch 8 471.8 -> 481.2 tok/s, batch 64 1094 -> 1137, 1K-prompt
//       TTFT 280 -> 265 ms. Far less than the 20% fewer instructions: integer issue was not the only limit.
//   v6  (this; kernel alone, the grouping made up front) fixed-size kernels for the model's w1 / w3 (2048 x
//       4096, kw 4) and w2 (4096 x 2048, kw 2). ncu of v5 (kbench fp4prof): the integer ALU pipe the busiest
//       (44-67%) at every batch, the math-pipe throttle the top stall at batch 8-64, and at batch 1 a single
//       partial wave (0.42-0.83) of 2.8-5 warps per scheduler, "no eligible" 39-52%. ~90 of the 383 SASS per
//       chunk were bookkeeping ptxas recomputed from the parameters each chunk (slot offsets, validity bits,
//       ring indices, x address); with N, K, kw constants and the 8 chunks unrolled the chunk costs 325 (ALU
//       191 -> 160). Same bits. kbench 2026-11-30 (rotated ids, us, 2-3 runs, v5 -> v6): w1+w3 B=1 23.2-24.8
//       -> 23.1-23.9, B=8 133-136 -> 125-127, B=64 687-689 -> 603-604; w2 B=1 15.6-16.8 -> 14.2-15.2, B=8
//       74-76 -> 72-74, B=64 356 -> 304. Batch 1 stays latency-bound (one partial wave), not issue-bound.
#include "common.cuh"

#define FP4_WARPS 4  // warps per block (128 threads)
#define FP4_ST 3     // cp.async ring depth: 2 chunks in flight while one is computed (depth 4 measured slower)
#define FP4_SST (FP4_ST + 1)  // scale-word ring depth (see fp4_expert_body)

__device__ __forceinline__ u32 word4(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// bf16x2 multiplier 2^126 * 2^(es-127) for a UE8M0 byte (clamped to 128 so the bf16 stays finite):
// (es + 126) << 7 in both halves, as one multiply-add.
__device__ __forceinline__ u32 scale_pair(u32 es) {
    es = es > 128u ? 128u : es;
    return es * 0x00800080u + 126u * 0x00800080u;
}

// One 128-wide K chunk of one warp: 16 * MT rows (2 * MT per thread) x the group's 8-token column tile, given
// this thread's 32 x values xv.
template <int MT>
__device__ __forceinline__ void fp4_chunk_x(float* acc, const uint4 (&wv)[2 * MT], const u32 (&f)[2 * MT],
                                            const uint4 (&xv)[4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        // Word q of a row holds weights k0 + 8q .. + 8 as the pairs (8q + 2I, 8q + 2I + 1) (fp4_pairs), which are
        // x's own bf16x2 words: k-step 2q takes pairs 0, 1 (x words 0, 1), k-step 2q + 1 pairs 2, 3.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            u32 p0[4], p1[4];  // word q of rows g and g + 8
            fp4_pairs(word4(wv[2 * mt], q), p0);
            fp4_pairs(word4(wv[2 * mt + 1], q), p1);
            const u32 f0 = f[2 * mt], f1 = f[2 * mt + 1];
            mma_bf16_16816(&acc[mt * 4], bf16x2_mul(p0[0], f0), bf16x2_mul(p1[0], f1), bf16x2_mul(p0[1], f0),
                           bf16x2_mul(p1[1], f1), xv[q].x, xv[q].y);
            mma_bf16_16816(&acc[mt * 4], bf16x2_mul(p0[2], f0), bf16x2_mul(p1[2], f1), bf16x2_mul(p0[3], f0),
                           bf16x2_mul(p1[3], f1), xv[q].z, xv[q].w);
        }
    }
}

// fp4_chunk_x with the x values loaded here from xp.
template <int MT>
__device__ __forceinline__ void fp4_chunk(float* acc, const uint4 (&wv)[2 * MT], const u32 (&f)[2 * MT],
                                          const u16* xp) {
    uint4 xv[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) xv[q] = ldg_keep(xp + 8 * q);
    fp4_chunk_x<MT>(acc, wv, f, xv);
}

// The block's group (expert e, its slots s0 .. s0 + cnt of `slots`), this thread's place and its warp's K split
// and rows, as the first statements of both bodies (a block past the device's group count exits). A macro, not a
// function: as a function that returns the values, ptxas allocated the bodies' registers differently (measured
// SASS changed), and these are the statements the measurements were made with.
#define FP4_BLOCK_PLACE(MT, KW)                                                    \
    const int grp = blockIdx.y;                                                    \
    if (grp >= meta[0]) return;                                                    \
    const int e = meta[1 + grp];                                                   \
    const int s0 = meta[1 + S + grp];                                              \
    const int cnt = meta[2 + S + grp] - s0;                                        \
    const i32* slots = meta + 2 + 2 * S;                                           \
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;                 \
    const int g = lane >> 2, t = lane & 3;                                         \
    const int kw = warp % KW;                                                      \
    const int row0 = (blockIdx.x * (FP4_WARPS / KW) + warp / KW) * (16 * MT);

// The end of one pass (both bodies): the KW warps of each row group summed in a fixed order through `red` (the
// ring, free once every copy has landed), then warp kw = 0 stores its rows of the pass's real columns.
template <int MT>
__device__ __forceinline__ void fp4_finish(float* acc, uint4* ring, int KW, int kw, int warp, int row0, int N, int c0,
                                           int cnt, const i32* slots, void* out, int out_bf16) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (KW > 1) {  // block-uniform
        float* red = reinterpret_cast<float*>(ring);
        __syncthreads();
        if (kw != 0) {
#pragma unroll
            for (int i = 0; i < MT * 4; ++i) red[(warp * MT * 4 + i) * 32 + lane] = acc[i];
        }
        __syncthreads();
        if (kw == 0) {
            for (int j = 1; j < KW; ++j)
#pragma unroll
                for (int i = 0; i < MT * 4; ++i) acc[i] += red[((warp + j) * MT * 4 + i) * 32 + lane];
        }
        __syncthreads();  // the next pass refills the ring
    }
    if (kw == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + mt * 16 + g + (i >> 1) * 8;
                const int cc = c0 + 2 * t + (i & 1);
                if (row >= N || cc >= cnt) continue;
                store_out(out, (u64)slots[cc] * N + row, acc[mt * 4 + i], out_bf16);
            }
    }
}

template <int MT, bool SCA, bool FULL>
__device__ __forceinline__ void fp4_expert_body(const u16* __restrict__ x, const u8* __restrict__ w,
                                                const u8* __restrict__ s, const i32* __restrict__ meta,
                                                void* __restrict__ out, int S, int topk, int N, int K,
                                                int x_per_slot, int out_bf16, int KW,
                                                uint4 (&ring)[FP4_ST][2 * MT][FP4_WARPS * 32],
                                                u32 (&sring)[FP4_SST][FP4_WARPS][32]) {
    FP4_BLOCK_PLACE(MT, KW)
    const int kb2 = K >> 1, ks = K >> 5, nch = (K + 127) >> 7;
    // SCA = (K % 128 == 0): no partial last chunk, and the 4 scale bytes of a chunk row are one aligned word
    // that rides along in the ring (the device scale layout puts a chunk's words of consecutive rows side by
    // side: a warp's copy is one coalesced line); otherwise scales are plain byte loads.
    const bool sc_async = SCA, kfull = SCA;

    // Slot i holds row row0 + 8i + g (mt = i / 2, h = i % 2). Rows past N and lanes past K copy zero bytes
    // (zero-fill) from an address inside the expert (row 0, chunk 0). 32-bit offsets: an expert is < 4 GB.
    const u8* wbase = w + (u64)e * N * kb2 + t * 16;
    const u8* sbase = s + (u64)e * N * ks;
    // FULL (block-uniform: every row of the block exists; used for MT = 1 only, see the header's v4): slot i's
    // offset is roff0 + i * rs8, so the copies need one offset and one stride, not 2 MT offsets and validity
    // bits (which ptxas rematerialised from the parameters at every chunk: ~50 instructions per chunk).
    // Rows in 2 KB tiles (fp4_tiled: a warp's rows lie in one 32-row band, chunk c is the band's tile c) or as in
    // the checkpoint (row * kb2, chunk c at 64 c).
    const bool tiled = fp4_tiled(N, K);
    const u32 cstride = tiled ? 2048u : 64u;
    const u32 roff0 = (u32)fp4_w_at(row0 + g, 0, N, K), rs8 = tiled ? 512u : 8u * (u32)kb2;
    u32 roff[2 * MT];  // fp4_w_at(row, 0) (weights); untiled: row * ks = roff / 16 (scales, !SCA only)
    u32 rok = 0;       // bit i: slot i's row exists
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) {
        const int r = row0 + 8 * i + g;
        rok |= (FULL || r < N ? 1u : 0u) << i;
        roff[i] = FULL ? roff0 + (u32)i * rs8 : (r < N ? (u32)fp4_w_at(r, 0, N, K) : 0u);
    }

    // Scale words (sc_async): lane l < 16 MT copies the 4 bytes of its warp's row l, one copy per chunk and
    // warp. (Before: every thread copied the word of each of its 2 MT rows, the 4 lanes of a row the same
    // word; ncu showed each 4-byte copy costing one L1 wavefront per lane, 32 per instruction, which made the
    // L1 data pipe, not DRAM, the limit: 92% busy at batch 64.) Lanes read rows other lanes copied, hence the
    // __syncwarp after each wait, and a ring one slot deeper than the weights' so that a slot is rewritten
    // only after every lane has passed the barrier that follows its last read.
    const int srow = row0 + lane;
    const u32 sbytes = (lane < 16 * MT && srow < N) ? 4u : 0u;
    const u32 sroff = sbytes ? (u32)srow * 4u : 0u, sstride = 4u * (u32)N;  // device scale layout (SCA)

    // Queues chunk c into ring slot `sl` and scale slot `ssl` (shared addresses: this thread's entry +
    // constant strides).
    const u32 ring_s = smem_u32(&ring[0][0][tid]), sring_s = smem_u32(&sring[0][warp][lane]);
    auto issue = [&](int c, int sl, int ssl) {
        const bool kin = kfull || c * 128 + t * 32 < K;
        const u32 coff = kin ? (u32)c * cstride : 0u;
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i) {
            const u32 n16 = (kin && (FULL || ((rok >> i) & 1u))) ? 16u : 0u;
            const u32 si = (u32)(sl * 2 * MT + i) * (FP4_WARPS * 32);
            cp_async16(ring_s + si * 16u, wbase + (roff[i] + coff), n16);
        }
        if (sc_async && lane < 16 * MT)
            cp_async4(sring_s + (u32)ssl * (FP4_WARPS * 32 * 4), sbase + (sroff + (u32)c * sstride), sbytes);
    };

    for (int c0 = 0; c0 < cnt; c0 += 8) {
        // Columns past the group read its last token (finite data; those outputs are never stored).
        const int col = min(c0 + g, cnt - 1);
        const int xs = slots[s0 + col];
        const u16* xrow = x + (u64)(x_per_slot ? xs : xs / topk) * K;
        float acc[MT * 4];
#pragma unroll
        for (int i = 0; i < MT * 4; ++i) acc[i] = 0.f;

        // 16-row warps: only lanes whose column is a real token load x; a padding column's B fragment stays
        // zero (set once per pass, never reloaded). An mma's output column n depends only on column n of B,
        // so the stored columns keep their bits, while at batch 1 the x loads shrink from 32 lanes x 64 B to
        // 4 lanes x 64 B per chunk and warp (the measured limit there was the L1/LSU path, not DRAM).
        const bool xon = c0 + g < cnt;
        uint4 xpre[MT == 1 ? 4 : 1];
#pragma unroll
        for (int q = 0; q < (MT == 1 ? 4 : 1); ++q) xpre[q] = make_uint4(0u, 0u, 0u, 0u);
        if (row0 < N) {  // warp-uniform
#pragma unroll
            for (int i = 0; i < FP4_ST - 1; ++i) {
                if (kw + i * KW < nch) issue(kw + i * KW, i, i);
                cp_async_commit();
            }
            int rd = 0, wr = FP4_ST - 1, srd = 0, swr = FP4_ST - 1;
#pragma unroll 1
            for (int c = kw; c < nch; c += KW) {
                const int cn = c + (FP4_ST - 1) * KW;
                if (cn < nch) issue(cn, wr, swr);
                cp_async_commit();
                const int k0 = c * 128 + t * 32;
                // Lanes past K (partial last chunk) hold zero weights; their x is read from the row's last
                // 32 values instead, so no address leaves the row. With 16-row warps (small batches, 64
                // registers to spare) x is loaded before the wait so that its latency overlaps the weights';
                // 32-row warps would spill the extra live registers, so they load it after.
                if constexpr (MT == 1) {
                    const u16* xq = xrow + (kfull || k0 < K ? k0 : K - 32);
                    if (xon) {
#pragma unroll
                        for (int q = 0; q < 4; ++q) xpre[q] = ldg_keep(xq + 8 * q);
                    }
                }
                cp_async_wait<FP4_ST - 1>();  // this thread's copies of chunk c have landed
                if (sc_async) __syncwarp();   // ... and every lane's (the scale words)
                const u16* xp = xrow + (kfull || k0 < K ? k0 : K - 32);
                uint4 wv[2 * MT];
                u32 f[2 * MT];
#pragma unroll
                for (int i = 0; i < 2 * MT; ++i) wv[i] = ring[rd][i][tid];
                if (sc_async) {
#pragma unroll
                    for (int i = 0; i < 2 * MT; ++i)
                        f[i] = scale_pair(byte_perm(sring[srd][warp][8 * i + g], 0u, 0x4440u | (u32)t));
                } else {
                    const bool kin = k0 < K;
#pragma unroll
                    for (int i = 0; i < 2 * MT; ++i)
                        f[i] = scale_pair((kin && ((rok >> i) & 1u)) ? (u32)__ldg(sbase + (roff[i] >> 4) + (k0 >> 5))
                                                                     : 0u);
                }
                if constexpr (MT == 1)
                    fp4_chunk_x<MT>(acc, wv, f, xpre);
                else
                    fp4_chunk<MT>(acc, wv, f, xp);
                rd = rd + 1 == FP4_ST ? 0 : rd + 1;
                wr = wr + 1 == FP4_ST ? 0 : wr + 1;
                srd = srd + 1 == FP4_SST ? 0 : srd + 1;
                swr = swr + 1 == FP4_SST ? 0 : swr + 1;
            }
            cp_async_wait<0>();
            if (sc_async) __syncwarp();  // the next pass rewrites scale slots other lanes read in this one
        }

        pdl_trigger();  // the next kernel's start overlaps the reduction and store (idempotent per block)
        fp4_finish<MT>(acc, &ring[0][0][0], KW, kw, warp, row0, N, c0, cnt, slots + s0, out, out_bf16);
    }
}

#define FP4_XS_COLS 2  // XS passes: columns of x in shared memory (a decode group rarely holds more)

// fp4_expert_fixed's x source when x is in global memory (every launch but the fused SwiGLU one): nothing to do.
struct Fp4NoXs {
    u32 addr = 0;
    __device__ __forceinline__ void prepare(const i32*, int) {}
};

// The model's routed-expert shapes with every size a compile-time constant (v6): N rows, K inputs, KW warps over
// K, 32-row warps, N % (128 / KW) == 0 (every row of every block exists) and K % (128 KW) == 0 (every warp runs
// M = K / (128 KW) whole chunks). The same copies, products and sums in the same order as fp4_expert_body<2,
// true, false> with the same KW, so the same bits; only the bookkeeping differs: one weight and one scale
// pointer per thread, slots and chunks at constant offsets from them, and a fully unrolled chunk loop whose
// ring slots are constants. (The generic body recomputes per chunk, from the parameters, the per-slot offsets,
// validity bits, ring indices and x address: ~90 of its 383 SASS instructions per chunk, half of them on the
// integer ALU pipe that bounds it.)
// XS (moe_swiglu_down.cu): x is not read from global memory but made per pass by `xsrc.prepare` (the SwiGLU of the
// pass's slots) into shared memory, FP4_XS_COLS columns a pass; the same products and sums per column, so each
// output has the bits it has with x in global memory.
template <int N, int K, int KW, bool XS = false, class XSrc = Fp4NoXs>
__device__ __forceinline__ void fp4_expert_fixed(const u16* __restrict__ x, const u8* __restrict__ w,
                                                 const u8* __restrict__ s, const i32* __restrict__ meta,
                                                 void* __restrict__ out, int S, int topk, int x_per_slot,
                                                 int out_bf16, uint4 (&ring)[FP4_ST][4][FP4_WARPS * 32],
                                                 u32 (&sring)[FP4_SST][FP4_WARPS][32], XSrc xsrc = XSrc(),
                                                 bool wait_after_issue = false) {
    constexpr int MT = 2, KB2 = K / 2, M = K / (128 * KW);
    constexpr int PC = XS ? FP4_XS_COLS : 8;  // columns a pass (8: the mma's n8 tile)
    static_assert(!XS || KW > 1, "XS needs fp4_finish's closing barrier before the next pass rewrites x");
    static_assert(K % (128 * KW) == 0 && N % (16 * MT * FP4_WARPS / KW) == 0, "not a fixed shape");
    FP4_BLOCK_PLACE(MT, KW)
    // This warp's chunk j is c = kw + j KW: its 32 rows are one band of 2 KB tiles (fp4_w_at; the fixed shapes are
    // always fp4_tiled), so slot i's 16 weight bytes are at wp + i 512 + j KW 2048; the scale word of row
    // row0 + lane (device scale layout) at sp + j KW 4 N, x at xp + j KW 128.
    static_assert(K % 128 == 0 && N % 32 == 0 && K <= FP4_TILE_MAX_K, "fixed shapes are tiled");
    const u8* wp = w + (u64)e * N * KB2 + fp4_w_at(row0 + g, kw * 64 + t * 16, N, K);
    const u8* sp = s + (u64)e * N * (K / 32) + ((u32)kw * N + (u32)(row0 + lane)) * 4u;
    const u32 ring_s = smem_u32(&ring[0][0][tid]), sring_s = smem_u32(&sring[0][warp][lane]);
    auto issue = [&](int j) {  // j is a constant after unrolling
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i)
            cp_async16(ring_s + (u32)((j % FP4_ST) * 2 * MT + i) * (FP4_WARPS * 32 * 16),
                       wp + (i * 512 + j * KW * 2048), 16u);
        cp_async4(sring_s + (u32)(j % FP4_SST) * (FP4_WARPS * 32 * 4), sp + (u64)j * KW * 4 * N, 4u);
    };

    for (int c0 = 0; c0 < cnt; c0 += PC) {
        const u16* xp = nullptr;  // x in global memory (XS: none)
        if constexpr (!XS) {
            const int col = min(c0 + g, cnt - 1);  // padding columns read the group's last token
            const int xs = slots[s0 + col];
            xp = x + (u64)(x_per_slot ? xs : xs / topk) * K + kw * 128 + t * 32;
        }
        float acc[MT * 4];
#pragma unroll
        for (int i = 0; i < MT * 4; ++i) acc[i] = 0.f;
#pragma unroll
        for (int j = 0; j < FP4_ST - 1; ++j) {
            if (j < M) issue(j);
            cp_async_commit();
        }
        if (wait_after_issue && c0 == 0) pdl_wait();  // the weights (constant) are in flight; x comes after
        int pend = cnt;  // the pass stores columns c0 .. pend (XS: only its own; else every one up to c0 + 8)
        u32 xa = 0;      // XS: this lane's x in shared memory (its column, K offset)
        if constexpr (XS) {
            const int np = min(PC, cnt - c0);  // real columns of this pass
            xsrc.prepare(slots + s0 + c0, np);  // ends with a block barrier: x complete
            xa = xsrc.addr + (u32)((min(g, np - 1) * K + kw * 128 + t * 32) * 2);
            pend = c0 + np;
        }
#pragma unroll
        for (int j = 0; j < M; ++j) {
            if (j + FP4_ST - 1 < M) issue(j + FP4_ST - 1);
            cp_async_commit();
            cp_async_wait<FP4_ST - 1>();  // this thread's copies of chunk j have landed
            __syncwarp();                 // ... and every lane's (the scale words)
            uint4 wv[2 * MT];
            u32 f[2 * MT];
#pragma unroll
            for (int i = 0; i < 2 * MT; ++i) wv[i] = ring[j % FP4_ST][i][tid];
#pragma unroll
            for (int i = 0; i < 2 * MT; ++i)
                f[i] = scale_pair(byte_perm(sring[j % FP4_SST][warp][8 * i + g], 0u, 0x4440u | (u32)t));
            if constexpr (XS) {
                uint4 xv[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) xv[q] = lds128(xa + (u32)((j * KW * 128 + 8 * q) * 2));
                fp4_chunk_x<MT>(acc, wv, f, xv);
            } else {
                fp4_chunk<MT>(acc, wv, f, xp + j * KW * 128);
            }
        }
        cp_async_wait<0>();
        __syncwarp();  // the next pass rewrites scale slots other lanes read in this one
        pdl_trigger();  // the next kernel's start overlaps the reduction and store (idempotent per block)
        fp4_finish<MT>(acc, &ring[0][0][0], KW, kw, warp, row0, N, c0, pend, slots + s0, out, out_bf16);
    }
}

// Per-thread rings: each thread copies and later reads only its own entries, so the pipeline needs no
// barrier; `ring` doubles as the cross-warp reduction buffer after the K loop. Declared here so that both
// bodies share them. MINB: blocks per SM the register budget must allow (shared memory allows 7 for MT = 2:
// 72 registers; MT = 1 is for small batches, where more warps matter more than registers).
// blockIdx.z picks the matrix: 0 -> (w, s, out), 1 -> (w + dw, s + ds, out + dout) (byte offsets, wrapping
// u64: the second matrix's buffers minus the first's). The routed w1 and w3 read the same x with the same
// grouping, so they run as one launch of grid z = 2 (one fewer dependent launch per layer); each block still
// computes exactly what a single-matrix launch computes, so the bits do not change. Why offsets and not a
// second set of pointers: ptxas rematerialises the per-thread bases from parameters and special registers;
// pointers picked by `blockIdx.z ? w_b : w` had to stay in registers, and the spills (4-16 -> 56-60 bytes
// per thread, sm_90a) made the kernel ~7% slower at batch 64 (measured). With offsets: 0 bytes of spills.
#define FP4_ARGS                                                                                          \
    x, (const u8*)((u64)w + blockIdx.z * dw), (const u8*)((u64)s + blockIdx.z * ds), meta,                \
        (void*)((u64)out + blockIdx.z * dout), S, topk, N, K, x_per_slot, out_bf16, kw, ring, sring
#define FP4_EXPERT_KERNEL(MT, MINB)                                                                       \
    extern "C" __global__ void __launch_bounds__(FP4_WARPS * 32, MINB) fp4_expert_mt##MT(                 \
        const u16* x, const u8* w, const u8* s, const i32* meta, void* out, u64 dw, u64 ds, u64 dout,     \
        int S, int topk, int N, int K, int x_per_slot, int out_bf16, int kw, int pre_issue) {             \
        __shared__ __align__(16) uint4 ring[FP4_ST][2 * MT][FP4_WARPS * 32];                              \
        __shared__ u32 sring[FP4_SST][FP4_WARPS][32];                                                     \
        pdl_wait();                                                                                       \
        const bool full = (int)(blockIdx.x + 1) * (16 * MT * FP4_WARPS / kw) <= N;                        \
        if ((K & 127) != 0)                                                                               \
            fp4_expert_body<MT, false, false>(FP4_ARGS);                                                  \
        else if (MT == 1 && full)                                                                         \
            fp4_expert_body<MT, true, true>(FP4_ARGS);                                                    \
        else                                                                                              \
            fp4_expert_body<MT, true, false>(FP4_ARGS);                                                   \
    }
FP4_EXPERT_KERNEL(1, 8)
FP4_EXPERT_KERNEL(2, 7)
#undef FP4_ARGS

// fp4_expert_fixed at the model's shapes, named fp4_expert_n{N}k{K}w{KW} (the host picks one when the launch
// matches it: the same bits as fp4_expert_mt2 with that KW). Same parameters as fp4_expert_mtM (N, K, kw are
// ignored: the name's). pre_issue (the group table was written two or more launches back, so it is complete when
// this grid starts early under PDL): each block reads the table and issues its first weight chunks before it
// waits for the previous kernel (whose output is x), so those loads overlap that kernel's run (the generic
// kernels ignore it and wait first).
#define FP4_FIXED_KERNEL(N_, K_, KW_)                                                                     \
    extern "C" __global__ void __launch_bounds__(FP4_WARPS * 32, 7) fp4_expert_n##N_##k##K_##w##KW_(      \
        const u16* x, const u8* w, const u8* s, const i32* meta, void* out, u64 dw, u64 ds, u64 dout,     \
        int S, int topk, int N, int K, int x_per_slot, int out_bf16, int kw, int pre_issue) {             \
        __shared__ __align__(16) uint4 ring[FP4_ST][4][FP4_WARPS * 32];                                   \
        __shared__ u32 sring[FP4_SST][FP4_WARPS][32];                                                     \
        if (!pre_issue) pdl_wait();                                                                       \
        fp4_expert_fixed<N_, K_, KW_>(x, (const u8*)((u64)w + blockIdx.z * dw),                           \
                                      (const u8*)((u64)s + blockIdx.z * ds), meta,                        \
                                      (void*)((u64)out + blockIdx.z * dout), S, topk, x_per_slot,         \
                                      out_bf16, ring, sring, Fp4NoXs(), pre_issue != 0);                  \
    }
FP4_FIXED_KERNEL(2048, 4096, 4)  // routed w1 / w3
FP4_FIXED_KERNEL(4096, 2048, 2)  // routed w2
#undef FP4_FIXED_KERNEL
