// Prefill GEMMs with a deeper pipeline (the "pipe" variants, pf_pipe_*): same math, tiles, grid, parameter block
// and results as pf_gemm_* (prefill_gemm.cu, whose helpers this file uses), but every global load is a cp.async
// into a ring of S shared-memory stages, S - 1 K tiles ahead of the mma:
//   x tiles      BM x 64 bf16 (rows of PF_LDS), as before;
//   weight tiles as stored: bf16 (PF_LDS rows, read by ldmatrix directly), FP8 128 x 64 bytes, FP4 128 x 32 bytes;
//   scales       loaded once per block before the loop: FP8 the K / 128 bytes of its 128-row block, FP4 the
//                128 x K / 32 bytes of its expert's rows (K <= PF_PIPE_FP4_MAXK).
// Each K tile: wait for its stage, barrier, issue the copies of tile kt + S - 1 (into the stage freed by tile
// kt - 1), convert FP8 / FP4 bytes to bf16 into one conversion tile (second barrier), mma. The per-row K order
// is that of pf_gemm_*, so a row's result does not depend on M or on the variant.
// Stages: S = 4 for 64-row tiles, 3 for 128-row tiles: two blocks per SM fit either way (88-111 KB each)
// (pf_pipe_smem in prefill_params.rs mirrors PfPipe::SMEM).

#define PF_PIPE_MAX_KB 256
#define PF_PIPE_FP4_MAXK 4096

template <int MT, int WT>
struct PfPipe {
    static constexpr int BM = 32 * MT;
    static constexpr int S = MT == 2 ? 4 : 3;
    static constexpr int A_BYTES = BM * PF_LDS * 2;
    static constexpr int W_BYTES = WT == PF_WT_BF16 ? PF_BN * PF_LDS * 2 : (WT == PF_WT_FP8 ? PF_BN * 64 : PF_BN * 32);
    static constexpr int CONV_BYTES = WT == PF_WT_BF16 ? 0 : PF_BN * PF_LDS * 2;
    static constexpr int SCALE_BYTES = WT == PF_WT_FP8 ? PF_PIPE_MAX_KB : (WT == PF_WT_FP4 ? PF_BN * PF_PIPE_FP4_MAXK / 32 : 0);
    static constexpr int SMEM = S * (A_BYTES + W_BYTES) + CONV_BYTES + SCALE_BYTES;
};

// 4-byte global -> shared copy (the FP4 scale rows when K / 32 is a multiple of 4 but not of 16).
__device__ __forceinline__ void pf_cp4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

// The block's scales into shared memory (part of the first cp.async group, or plain stores before the first
// barrier). FP8: sc[i] = S[n0 / 128, i]; FP4: sc[r * K / 32 + i] = S[expert, n0 + r, i] for rows r < N - n0.
template <int WT>
__device__ __forceinline__ void pf_pipe_scales(const PfGemm& p, int expert, int n0, u8* sc) {
    const int g = blockIdx.z, N = p.n[g], K = p.K, tid = threadIdx.x;
    if (WT == PF_WT_FP8) {
        const int kb = (K + 127) >> 7;
        for (int i = tid; i < kb; i += 256) sc[i] = p.s[g][(n0 >> 7) * kb + i];
    } else if (WT == PF_WT_FP4) {
        const int ks = K / 32, rows = min(PF_BN, N - n0);
        const u8* src = p.s[g] + ((u64)expert * N + n0) * ks;  // rows n0.. of this expert, contiguous
        const int bytes = rows * ks;
        const u64 a = (u64)src;
        if ((ks & 15) == 0 && (a & 15) == 0) {
            for (int i = tid * 16; i < bytes; i += 256 * 16) pf_cp16(pf_smem(sc + i), src + i, true);
        } else if ((ks & 3) == 0 && (a & 3) == 0) {
            for (int i = tid * 4; i < bytes; i += 256 * 4) pf_cp4(pf_smem(sc + i), src + i);
        } else {
            for (int i = tid; i < bytes; i += 256) sc[i] = src[i];
        }
    }
}

// Issues the cp.async copies of weight K tile k0 into stage `ws` (layouts in the file header).
template <int WT>
__device__ __forceinline__ void pf_pipe_load_w(const PfGemm& p, int expert, int n0, int k0, u8* ws) {
    const int g = blockIdx.z, N = p.n[g], K = p.K, tid = threadIdx.x;
    if (WT == PF_WT_BF16) {
        pf_async_w_bf16(p, g, n0, N, k0, (u16*)ws);
    } else if (WT == PF_WT_FP8) {
        const u8* w = (const u8*)p.w[g];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int c = tid + 256 * j, n = n0 + (c >> 2), k = k0 + (c & 3) * 16;
            const bool ok = n < N && k < K;
            pf_cp16(pf_smem(ws + c * 16), ok ? (const void*)(w + (u64)n * K + k) : (const void*)w, ok);
        }
    } else {
        const u8* w = (const u8*)p.w[g];
        const int n = n0 + (tid >> 1), k = k0 + (tid & 1) * 32;
        const bool ok = n < N && k < K;
        const u8* src = w + ((u64)expert * N + n) * (K / 2) + k / 2;
        pf_cp16(pf_smem(ws + tid * 16), ok ? (const void*)src : (const void*)w, ok);
    }
}

// Converts the FP8 / FP4 bytes of stage `ws` (K tile k0) to bf16 rows of Bc (zero bytes stay zero).
template <int WT>
__device__ __forceinline__ void pf_pipe_convert(const PfGemm& p, int k0, const u8* ws, const u8* sc, u16* Bc) {
    const int tid = threadIdx.x;
    if (WT == PF_WT_FP8) {
        const u32 f = pf_fp8_scale(sc[k0 >> 7]);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int c = tid + 256 * j, row = c >> 2, kc = (c & 3) * 16;
            u32 o[8];
            pf_fp8x16(*(const uint4*)(ws + c * 16), f, o);
            uint4* d = (uint4*)(Bc + row * PF_LDS + kc);
            d[0] = make_uint4(o[0], o[1], o[2], o[3]);
            d[1] = make_uint4(o[4], o[5], o[6], o[7]);
        }
    } else if (WT == PF_WT_FP4) {
        const int row = tid >> 1, kc = (tid & 1) * 32, k = k0 + kc, ks = p.K / 32;
        // Rows past N and K past the end have zero bytes; their (unloaded) scale only multiplies zeros.
        const u32 f = k < p.K ? pf_fp4_scale(sc[row * ks + k / 32]) : 0u;
        u32 o[16];
        pf_fp4x32(*(const uint4*)(ws + tid * 16), f, o);
        uint4* d = (uint4*)(Bc + row * PF_LDS + kc);
#pragma unroll
        for (int q = 0; q < 4; ++q) d[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
    }
}

template <int MT, int WT, bool EXPERT>
__device__ __forceinline__ void pf_pipe_body(const PfGemm& p) {
    using R = PfPipe<MT, WT>;
    constexpr int BM = R::BM, S = R::S;
    extern __shared__ __align__(16) u8 pf_dyn_smem[];
    u8* As = pf_dyn_smem;                        // [S][BM][PF_LDS] bf16
    u8* Ws = As + S * R::A_BYTES;                // [S] weight tiles as stored
    u16* Bc = (u16*)(Ws + S * R::W_BYTES);       // [PF_BN][PF_LDS] converted weights (FP8 / FP4)
    u8* sc = (u8*)Bc + R::CONV_BYTES;            // scales
    int m0, rows, expert;
    if (!pf_tile<BM, EXPERT>(p, m0, rows, expert)) return;
    const int n0 = blockIdx.y * PF_BN, K = p.K;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp & 1, wn = warp >> 1;
    const u16* x = p.x[blockIdx.z];

    const u16* arow[MT];
    bool aok[MT];
#pragma unroll
    for (int j = 0; j < MT; ++j) arow[j] = pf_x_row<EXPERT>(p, m0, rows, (tid + 256 * j) >> 3, aok[j]);
    auto load = [&](int kt) {
        const int stage = kt % S, k0 = kt * PF_BK;
        u16* dst = (u16*)(As + stage * R::A_BYTES);
#pragma unroll
        for (int j = 0; j < MT; ++j) {
            const int c = tid + 256 * j, row = c >> 3, kc = (c & 7) * 8;
            const bool ok = aok[j] && k0 + kc < K;
            pf_cp16(pf_smem(dst + row * PF_LDS + kc), ok ? (const void*)(arow[j] + k0 + kc) : (const void*)x, ok);
        }
        pf_pipe_load_w<WT>(p, expert, n0, k0, Ws + stage * R::W_BYTES);
    };

    float acc[MT][4][4];
    pf_zero_acc<MT>(acc);
    const int ktiles = (K + PF_BK - 1) / PF_BK;
    pf_pipe_scales<WT>(p, expert, n0, sc);
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (s < ktiles) load(s);
        pf_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        pf_wait<S - 2>();  // this thread's copies of tile kt have landed
        __syncthreads();   // everyone's have; everyone is done with tile kt - 1 (its stage and Bc)
        if (kt + S - 1 < ktiles) load(kt + S - 1);
        pf_commit();       // possibly empty: keeps the group count per iteration fixed
        const int cur = kt % S;
        const u16* Bt = (const u16*)(Ws + cur * R::W_BYTES);
        if (WT != PF_WT_BF16) {
            pf_pipe_convert<WT>(p, kt * PF_BK, Ws + cur * R::W_BYTES, sc, Bc);
            __syncthreads();
            Bt = Bc;
        }
        pf_mma_ktile<MT>((const u16*)(As + cur * R::A_BYTES), Bt, wm, wn, acc);
    }
    pf_store_acc<MT, EXPERT>(p, m0, rows, n0, wm, wn, acc);
}

#define PF_PIPE_KERNEL(NAME, MT, WT, EXPERT) \
    extern "C" __global__ void __launch_bounds__(256, 2) NAME(PfGemm p) { pf_pipe_body<MT, WT, EXPERT>(p); }
PF_PIPE_KERNEL(pf_pipe_bf16_m64, 2, PF_WT_BF16, false)
PF_PIPE_KERNEL(pf_pipe_bf16_m128, 4, PF_WT_BF16, false)
PF_PIPE_KERNEL(pf_pipe_fp8_m64, 2, PF_WT_FP8, false)
PF_PIPE_KERNEL(pf_pipe_fp8_m128, 4, PF_WT_FP8, false)
PF_PIPE_KERNEL(pf_pipe_fp4_expert_m64, 2, PF_WT_FP4, true)
PF_PIPE_KERNEL(pf_pipe_fp4_expert_m128, 4, PF_WT_FP4, true)
