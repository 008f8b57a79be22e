//! Every buffer a prefill call touches, sized once for `max_tokens` rows (no allocation per call).

use super::super::workspace::{zeros, BlockIo, ExpertBufs};
use super::super::RunnerError;
use crate::gpu::attention::AttnActs;
use crate::model::ModelConfig;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{bf16, pf_max_tiles, GpuContext};

/// Per-row i32 arrays of a call, in this order, each `max_tokens` long (one upload per call).
pub const META_ARRAYS: usize = 6;
pub const META_SLOTS: usize = 0;
pub const META_POSITIONS: usize = 1;
pub const META_ROW0: usize = 2;
pub const META_POS0: usize = 3;
pub const META_SEGLEN: usize = 4;
/// `r` in row r: the indexer top-k reads score row `rowid[r]` of the current row group.
pub const META_ROWID: usize = 5;
/// f32 budget of the indexer score rows (a long call is scored a group of rows at a time).
const SCORE_BYTES: usize = 256 << 20;
/// Row tiles of the routed-expert GEMM: the grouping is sized for the smaller tile (the most tiles).
pub const EXPERT_MIN_BM: usize = 64;

pub struct PrefillWs {
    pub max_tokens: usize,
    /// Token ids of the rows (embedding and hash routing).
    pub tokens: CudaSlice<i32>,
    /// `[META_ARRAYS, max_tokens]` i32 (see META_*).
    pub meta: CudaSlice<i32>,
    /// Segment table and compressor jobs, 4 ints each (see plan.rs).
    pub jobs: CudaSlice<i32>,
    pub io: BlockIo,
    pub attn: AttnBufs,
    pub moe: MoeBufs,
    /// The FP8 weights of one dense GEMM launch dequantised to bf16 for the wgmma GEMM (gemm::fp8); only
    /// where the device runs it (`GpuContext::has_wgmma`).
    pub wbf: Option<CudaSlice<bf16>>,
}

/// Attention intermediates: the per-row ones shared with the decode scratch, plus what only a call of many
/// rows needs.
pub struct AttnBufs {
    pub act: AttnActs,
    /// This call's window rows bf16 [rows, head_dim].
    pub kv: CudaSlice<bf16>,
    /// Indexer scores of one row group: [score_rows, cap].
    pub scores: CudaSlice<f32>,
    pub score_rows: usize,
}

/// MoE intermediates; routed ones are per slot (row·topk + k).
pub struct MoeBufs {
    pub gate: CudaSlice<f32>,
    pub ids: CudaSlice<i32>,
    pub wts: CudaSlice<f32>,
    pub order: CudaSlice<i32>,
    pub tiles: CudaSlice<i32>,
    pub ex: ExpertBufs,
}

/// bf16 elements of the largest dense FP8 GEMM launch's weights (all groups): wq_a + wkv, wq_b + the
/// indexer's wq_b, the wo_a groups, wo_b, the shared expert's w1 + w3 and w2.
pub fn wbf_elems(cfg: &ModelConfig) -> usize {
    let (d, hd, ql) = (
        cfg.hidden_size,
        cfg.num_attention_heads * cfg.head_dim,
        cfg.q_lora_rank,
    );
    let lora = cfg.o_groups * cfg.o_lora_rank;
    let shared = cfg.moe_intermediate_size * cfg.n_shared_experts.max(1);
    [
        (ql + cfg.head_dim) * d,
        (hd + cfg.index_n_heads * cfg.index_head_dim) * ql,
        cfg.o_lora_rank * hd,
        d * lora,
        2 * shared * d,
    ]
    .into_iter()
    .max()
    .unwrap_or(0)
}

/// Indexer entries per sequence at `max_context` (the compressed caches' capacity).
pub fn index_cap(max_context: usize) -> usize {
    (max_context / crate::model::CSA_RATIO).max(1)
}

/// Ints of the job table for calls of up to `t` rows: the segment table, then per distinct compression ratio
/// r one job per entry completed (at most t / r + one per segment).
pub fn jobs_len(cfg: &ModelConfig, t: usize) -> usize {
    let segs = crate::gpu::MAX_ROWS;
    let jobs: usize = super::plan::ratios(cfg).iter().map(|&r| t / r + segs).sum();
    4 * (segs + jobs)
}

impl PrefillWs {
    pub fn new(
        ctx: &GpuContext,
        cfg: &ModelConfig,
        max_tokens: usize,
        max_context: usize,
    ) -> Result<Self, RunnerError> {
        let t = max_tokens.max(1);
        let cap = index_cap(max_context);
        let score_rows = (SCORE_BYTES / (4 * cap)).clamp(1, t);
        let attn = AttnBufs {
            // Every buffer of the workspace has at least one element (see `zeros`).
            act: AttnActs::new(&ctx.stream, cfg, t, 1)?,
            kv: zeros(ctx, t * cfg.head_dim)?,
            scores: zeros(ctx, score_rows * cap)?,
            score_rows,
        };
        let (e, k) = (cfg.n_routed_experts, cfg.num_experts_per_tok);
        let slots = t * k;
        let moe = MoeBufs {
            gate: zeros(ctx, t * e)?,
            ids: zeros(ctx, slots)?,
            wts: zeros(ctx, slots)?,
            order: zeros(ctx, slots)?,
            tiles: zeros(ctx, 1 + 3 * pf_max_tiles(slots, e, EXPERT_MIN_BM))?,
            ex: ExpertBufs::new(ctx, t, slots, cfg)?,
        };
        Ok(PrefillWs {
            max_tokens: t,
            tokens: zeros(ctx, t)?,
            meta: zeros(ctx, META_ARRAYS * t)?,
            jobs: zeros(ctx, jobs_len(cfg, t))?,
            io: BlockIo::new(ctx, t, cfg.hidden_size)?,
            attn,
            moe,
            wbf: if ctx.has_wgmma() {
                Some(zeros(ctx, wbf_elems(cfg))?)
            } else {
                None
            },
        })
    }

    /// The wgmma weight scratch as (device address, bf16 elements), if allocated.
    pub fn wbf_scratch(&mut self, s: &CudaStream) -> Option<(u64, usize)> {
        self.wbf
            .as_mut()
            .map(|b| (super::super::attention::dptr_mut(b, s), b.len()))
    }

    /// Device bytes of a workspace for `max_tokens` rows (for memory planning), without allocating.
    pub fn bytes_for(cfg: &ModelConfig, max_tokens: usize, max_context: usize) -> usize {
        let t = max_tokens.max(1);
        let d = cfg.hidden_size;
        let cap = index_cap(max_context);
        let score_rows = (SCORE_BYTES / (4 * cap)).clamp(1, t);
        let (e, k) = (cfg.n_routed_experts, cfg.num_experts_per_tok);
        // The shared per-row buffers, this call's window rows (kv, bf16) and one group's indexer scores.
        let attn = t * (AttnActs::bytes_per_row(cfg) + 2 * cfg.head_dim) + 4 * score_rows * cap;
        let moe = t * (4 * e + 12 * k) + ExpertBufs::bytes_for(t, t * k, cfg);
        let rest = t * (4 + 4 * META_ARRAYS) + BlockIo::bytes_for(t, d);
        // The wgmma weight scratch, counted whether or not the device will allocate it.
        attn + moe + rest + 2 * wbf_elems(cfg)
    }
}
