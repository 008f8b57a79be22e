//! Every buffer a prefill call touches, sized once for `max_tokens` rows (no allocation per call).

use super::super::workspace::{zeros, BlockIo, ExpertBufs};
use super::super::RunnerError;
use crate::gpu::attention::{lin_max, AttnActs};
use crate::model::ModelConfig;
use dsv4_kernels::cudarc::driver::CudaSlice;
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
        })
    }

    /// Device bytes of a workspace for `max_tokens` rows (for memory planning), without allocating.
    pub fn bytes_for(cfg: &ModelConfig, max_tokens: usize, max_context: usize) -> usize {
        let t = max_tokens.max(1);
        let (d, hd) = (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim);
        let cap = index_cap(max_context);
        let score_rows = (SCORE_BYTES / (4 * cap)).clamp(1, t);
        let lora = cfg.o_groups * cfg.o_lora_rank;
        let iq = cfg.index_n_heads * cfg.index_head_dim;
        let (e, k) = (cfg.n_routed_experts, cfg.num_experts_per_tok);
        let attn = t * (2 * d + 6 * cfg.q_lora_rank + 6 * cfg.head_dim + 6 * hd + 4 * lin_max(cfg))
            + t * (6 * iq + 4 * cfg.index_topk + 6 * lora)
            + 4 * score_rows * cap;
        let moe = t * (4 * e + 12 * k) + ExpertBufs::bytes_for(t, t * k, cfg);
        let rest = t * (4 + 4 * META_ARRAYS) + BlockIo::bytes_for(t, d);
        attn + moe + rest
    }
}
