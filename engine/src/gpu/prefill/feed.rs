//! Feeding work through a batched prefill, shared by the one-GPU and the split backend: every item's
//! tokens go through calls of at most [`ChunkRunner::max_tokens`] rows (a longer chunk spans several calls,
//! its sequence's state carrying over), decode items riding along as one-token chunks.

use super::PrefillSeg;
use crate::backend::{BackendError, Work};
use crate::gpu::seqs::{dev, SeqTable, StepRunner};
use crate::gpu::RunnerError;
use crate::sampler::Draw;

/// A runner's batched prefill as the feeding loop needs it; the picking and reading of the last rows'
/// tokens and logits are its decode step's ([`StepRunner`]).
pub(crate) trait ChunkRunner: StepRunner {
    /// Most rows of one call.
    fn max_tokens(&self) -> usize;
    /// Feeds every segment's tokens and runs the head on each segment's last row into rows
    /// 0..segs.len() of the step's outputs.
    fn prefill(&mut self, segs: &[PrefillSeg<'_>]) -> Result<(), RunnerError>;
}

/// Feeds `work` (checked by the caller) through the runner's batched prefill; returns the token each
/// item's draw picks (greedy without `draws`) and, with `logits`, its last row's logits. Positions are
/// advanced by the caller ([`SeqTable::advance`]).
pub(crate) fn feed_chunks<S>(
    runner: &mut impl ChunkRunner,
    table: &SeqTable<S>,
    work: &[Work<'_>],
    draws: Option<&[Draw]>,
    logits: bool,
) -> Result<Vec<(u32, Vec<f32>)>, BackendError> {
    let cap = runner.max_tokens();
    let mut fed = vec![0usize; work.len()];
    let mut out = vec![(0u32, Vec::new()); work.len()];
    while fed.iter().zip(work).any(|(&f, w)| f < w.tokens.len()) {
        let (mut segs, mut items, mut used) = (Vec::new(), Vec::new(), 0usize);
        for (i, w) in work.iter().enumerate() {
            let left = w.tokens.len() - fed[i];
            if left == 0 || used == cap {
                continue;
            }
            let n = left.min(cap - used);
            let seq = table.get(w.seq)?;
            segs.push(PrefillSeg {
                slot: seq.slot,
                pos: seq.pos + fed[i],
                tokens: &w.tokens[fed[i]..fed[i] + n],
            });
            items.push(i);
            used += n;
        }
        runner.prefill(&segs).map_err(dev)?;
        let row_draws: Vec<Draw> = items
            .iter()
            .zip(&segs)
            .map(|(&i, seg)| match draws {
                Some(d) if fed[i] + seg.tokens.len() == work[i].tokens.len() => d[i],
                _ => Draw::GREEDY,
            })
            .collect();
        runner.pick(&row_draws).map_err(dev)?;
        let next = runner.read_next(segs.len()).map_err(dev)?;
        for (row, (&i, seg)) in items.iter().zip(&segs).enumerate() {
            fed[i] += seg.tokens.len();
            if fed[i] == work[i].tokens.len() {
                out[i].0 = next[row] as u32;
                if logits {
                    out[i].1 = runner.read_logits(row).map_err(dev)?;
                }
            }
        }
    }
    Ok(out)
}
