//! The host-side plan of one prefill call: which rows belong to which sequence, which compressed entries the
//! call completes (per compression ratio), and the indexer's row groups. Built from positions known on the host
//! (prefill is not graph-captured), uploaded with two copies.

use super::ws::{PrefillWs, META_ARRAYS};
use super::PrefillSeg;
use crate::gpu::RunnerError;
use crate::model::{AttentionKind, ModelConfig, CSA_RATIO};
use dsv4_kernels::cudarc::driver::CudaStream;
use std::sync::Arc;

/// One sequence's rows in the call.
#[derive(Debug, Clone, Copy)]
pub struct SegRows {
    pub slot: usize,
    pub row0: usize,
    pub pos0: usize,
    pub len: usize,
}

/// Jobs of one compression ratio: `count` entries at `offset` ints into the job table.
#[derive(Debug, Clone, Copy)]
pub struct Jobs {
    pub ratio: usize,
    pub offset: usize,
    pub count: usize,
}

/// A group of rows scored together by the indexer (`splits` blocks per row).
#[derive(Debug, Clone, Copy)]
pub struct ScoreGroup {
    pub begin: usize,
    pub len: usize,
    pub splits: usize,
}

pub struct Plan {
    pub rows: usize,
    pub segs: Vec<SegRows>,
    /// Per distinct compression ratio of the model.
    pub jobs: Vec<Jobs>,
    /// Indexer row groups (only rows that see more than index_topk entries need scores).
    pub score_groups: Vec<ScoreGroup>,
    /// The row of each segment's last token.
    pub last_rows: Vec<usize>,
}

/// The distinct nonzero compression ratios of the model's main blocks (the indexer shares CSA's).
pub fn ratios(cfg: &ModelConfig) -> Vec<usize> {
    let mut r: Vec<usize> = (0..cfg.num_hidden_layers)
        .map(|l| cfg.attention_kind(l).ratio())
        .filter(|&r| r > 0)
        .collect();
    if (0..cfg.num_hidden_layers)
        .any(|l| matches!(cfg.attention_kind(l), AttentionKind::Csa { .. }))
    {
        r.push(CSA_RATIO);
    }
    r.sort_unstable();
    r.dedup();
    r
}

impl Plan {
    /// Lays the segments out row after row and uploads the per-row arrays and the job table.
    pub fn build(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        ws: &mut PrefillWs,
        segs: &[PrefillSeg<'_>],
        max_context: usize,
    ) -> Result<Plan, RunnerError> {
        let rows: usize = segs.iter().map(|s| s.tokens.len()).sum();
        let t = ws.max_tokens;
        if rows == 0 || rows > t || segs.len() > crate::gpu::MAX_ROWS {
            return Err(RunnerError::TooManyRows { rows, max: t });
        }
        if let Some(s) = segs
            .iter()
            .find(|s| s.tokens.is_empty() || s.pos + s.tokens.len() > max_context)
        {
            return Err(RunnerError::Unsupported(format!(
                "prefill segment at {} of {} tokens (empty, or past the context of {max_context})",
                s.pos,
                s.tokens.len()
            )));
        }
        let mut meta = vec![0i32; META_ARRAYS * t];
        let mut tokens = vec![0i32; rows];
        let mut out = Vec::with_capacity(segs.len());
        let mut row = 0;
        for s in segs {
            for (i, &tok) in s.tokens.iter().enumerate() {
                let r = row + i;
                tokens[r] = tok as i32;
                for (a, v) in [s.slot, s.pos + i, row, s.pos, s.tokens.len(), r]
                    .iter()
                    .enumerate()
                {
                    meta[a * t + r] = *v as i32;
                }
            }
            out.push(SegRows {
                slot: s.slot,
                row0: row,
                pos0: s.pos,
                len: s.tokens.len(),
            });
            row += s.tokens.len();
        }
        let mut table: Vec<i32> = Vec::new();
        for s in &out {
            table.extend([s.slot, s.row0, s.pos0, s.len].map(|v| v as i32));
        }
        let mut jobs = Vec::new();
        for ratio in ratios(cfg) {
            let offset = table.len();
            for s in &out {
                for w in s.pos0 / ratio..(s.pos0 + s.len) / ratio {
                    table.extend([s.slot, w, s.row0, s.pos0].map(|v| v as i32));
                }
            }
            jobs.push(Jobs {
                ratio,
                offset,
                count: (table.len() - offset) / 4,
            });
        }
        if table.len() > ws.jobs.len() {
            return Err(RunnerError::TooManyRows {
                rows: table.len() / 4,
                max: ws.jobs.len() / 4,
            });
        }
        stream.memcpy_htod(&tokens, &mut ws.tokens.slice_mut(..rows))?;
        stream.memcpy_htod(&meta, &mut ws.meta)?;
        stream.memcpy_htod(&table, &mut ws.jobs.slice_mut(..table.len()))?;
        let last_rows = out.iter().map(|s| s.row0 + s.len - 1).collect();
        let score_groups = score_groups(cfg, &out, ws.attn.score_rows, max_context);
        Ok(Plan {
            rows,
            segs: out,
            jobs,
            score_groups,
            last_rows,
        })
    }

    pub fn jobs_of(&self, ratio: usize) -> Option<Jobs> {
        self.jobs.iter().copied().find(|j| j.ratio == ratio)
    }
}

/// Row groups of at most `group` rows for the indexer scores, each with enough blocks per row that its
/// longest row's entry tiles are spread about 4 per block.
fn score_groups(
    cfg: &ModelConfig,
    segs: &[SegRows],
    group: usize,
    max_context: usize,
) -> Vec<ScoreGroup> {
    let cap = super::ws::index_cap(max_context);
    let tile = dsv4_kernels::prefill::PF_INDEX_TILE;
    let positions: Vec<usize> = segs.iter().flat_map(|s| s.pos0..s.pos0 + s.len).collect();
    positions
        .chunks(group.max(1))
        .enumerate()
        .map(|(i, ps)| {
            let n = ps
                .iter()
                .map(|p| ((p + 1) / CSA_RATIO).min(cap))
                .max()
                .unwrap_or(0);
            let tiles = if n > cfg.index_topk {
                n.div_ceil(tile)
            } else {
                0
            };
            ScoreGroup {
                begin: i * group.max(1),
                len: ps.len(),
                splits: tiles.div_ceil(4).max(1),
            }
        })
        .collect()
}
