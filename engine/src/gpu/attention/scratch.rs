//! Per-step scratch buffers of the attention block, sized once for `max_rows` rows (no allocation in
//! `decode`, so a captured graph replays with the same addresses).
use super::acts::{lin_max, AttnActs};
use super::error::{ensure, GpuError};
use crate::gpu::workspace::SideStream;
use crate::model::ModelConfig;
use dsv4_kernels::attn::{SPARSE_HEADS_PER_BLOCK, SPLITS_MAX};
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{
    gemv_cnt_len, gemv_splits_max, gemv_ws_len, GemvScratch, GemvWeights, GpuContext, GEMV_GROUPS,
    GEMV_ROW_TILE,
};

/// Largest batch of `fp8_gemv`.
pub const MAX_ROWS: usize = 64;

pub struct AttnScratch {
    pub max_rows: usize,
    /// Key splits of the sparse attention per row count (index rows - 1).
    pub splits: Vec<usize>,
    /// Blocks per row of the indexer scoring.
    pub score_blocks: Vec<usize>,
    /// The per-row intermediates shared with prefill. `act.xq` is written by the step itself or, when
    /// [`super::DecodeIn::xq_ready`] says so, by the caller's HCPre.
    pub act: AttnActs,
    /// Split-key partial outputs and (max, sum) pairs of the sparse attention, merged into `act.o`.
    pub part_o: CudaSlice<f32>,
    pub part_ml: CudaSlice<f32>,
    /// Split-K partials and arrival counters of the grouped GEMVs (counters zero between launches).
    pub gemv: GemvScratch,
    /// The stacked bf16 compressor/indexer projection runs on this side stream beside the q/kv chain (it
    /// reads only the block input), with its own split-K scratch.
    pub lin_side: SideStream,
    pub gemv_lin: GemvScratch,
    /// The e4m3 codes `[rows, k]` and scales `[rows, k / 128]` of the wq_b or wo_b input, which its
    /// preparation writes beside the bf16 values when the FP8-activation GEMV runs it ([`super::step::Step::q8`]).
    pub x8: CudaSlice<u8>,
    pub x8_scales: CudaSlice<f32>,
}

/// Workspace and counter lengths of one grouped GEMV over groups of `ns` rows at batch `rows`.
pub(crate) fn gemv_need(
    sms: usize,
    rows: usize,
    ns: &[usize],
    k: usize,
    wt: GemvWeights,
) -> (usize, usize) {
    let tiles = ns.iter().map(|n| n.div_ceil(GEMV_ROW_TILE)).sum();
    let nmax = ns.iter().copied().max().unwrap_or(0);
    // Sized for either kernel family (the batch picks one per launch).
    let splits = gemv_splits_max(sms, tiles, k, wt);
    (
        gemv_ws_len(ns.len(), splits, rows, nmax),
        // Every group slot: the launcher may cut the batch into tiles that run as further groups.
        gemv_cnt_len(GEMV_GROUPS, nmax),
    )
}

/// Splits over the keys so that about two blocks per SM exist even at batch 1.
fn sparse_splits(sms: usize, rows: usize, heads: usize) -> usize {
    let blocks = rows * heads.div_ceil(SPARSE_HEADS_PER_BLOCK);
    (2 * sms).div_ceil(blocks).clamp(1, SPLITS_MAX)
}

impl AttnScratch {
    pub fn new(ctx: &GpuContext, cfg: &ModelConfig, max_rows: usize) -> Result<Self, GpuError> {
        ensure((1..=MAX_ROWS).contains(&max_rows), || {
            format!("max_rows {max_rows} not in 1..={MAX_ROWS}")
        })?;
        let s = &ctx.stream;
        let sms = ctx.info.sm_count as usize;
        let (r, d, h, hd) = (
            max_rows,
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_attention_heads * cfg.head_dim,
        );
        let splits: Vec<usize> = (1..=r).map(|n| sparse_splits(sms, n, h)).collect();
        let row_splits = splits
            .iter()
            .enumerate()
            .map(|(i, s)| (i + 1) * s)
            .max()
            .unwrap_or(1);
        let score_blocks = (1..=r)
            .map(|n| (2 * sms).div_ceil(n).clamp(1, 1024))
            .collect();
        let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
        let lin_max = lin_max(cfg);
        let lora = cfg.o_groups * cfg.o_lora_rank;
        // Every grouped GEMV of `decode` (see decode.rs), its linears FP8 or bf16 (the split-K plan depends
        // on the format); the stacked bf16 matrix has at most lin_max rows.
        let bf = GemvWeights::Bf16;
        let og = cfg.o_groups.max(1);
        let mut needs = Vec::new();
        for wt in [GemvWeights::Fp8, bf] {
            needs.extend([
                gemv_need(sms, r, &[cfg.q_lora_rank, cfg.head_dim], d, wt),
                gemv_need(sms, r, &[hd], cfg.q_lora_rank, wt),
                gemv_need(sms, r, &[hd, ih * id], cfg.q_lora_rank, wt),
                gemv_need(sms, r, &vec![cfg.o_lora_rank; og], hd / og, wt),
                gemv_need(sms, r, &[d], lora, wt),
            ]);
        }
        let lin: Vec<_> = (1..=lin_max)
            .map(|n| gemv_need(sms, r, &[n], d, bf))
            .collect();
        let largest = |v: &[(usize, usize)]| {
            let ws = v.iter().map(|w| w.0).max().unwrap_or(0).max(1);
            (ws, v.iter().map(|w| w.1).max().unwrap_or(0).max(1))
        };
        let (ws, cnt) = largest(&needs);
        let (lin_ws, lin_cnt) = largest(&lin);
        let x8_k = cfg.q_lora_rank.max(lora).max(1);
        Ok(AttnScratch {
            max_rows,
            splits,
            score_blocks,
            act: AttnActs::new(s, cfg, r, 0)?,
            part_o: s.alloc_zeros(row_splits * hd)?,
            part_ml: s.alloc_zeros(row_splits * h * 2)?,
            gemv: GemvScratch::new(s, ws, cnt)?,
            lin_side: SideStream::new(ctx)?,
            gemv_lin: GemvScratch::new(s, lin_ws, lin_cnt)?,
            x8: s.alloc_zeros(r * x8_k)?,
            x8_scales: s.alloc_zeros((r * x8_k).div_ceil(128))?,
        })
    }
}
