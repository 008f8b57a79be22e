//! Steps with prefill chunks: every item's tokens go through the batched prefill in calls of at most
//! [`PREFILL_TOKENS`](super::PREFILL_TOKENS) rows (a longer chunk spans several calls, its sequence's state
//! carrying over), decode items riding along as one-token chunks.

use super::GpuBackend;
use crate::backend::{BackendError, SeqId, Work};
use crate::gpu::prefill::PrefillSeg;
use crate::gpu::seqs::dev;
use crate::sampler::Draw;

impl GpuBackend {
    /// Feeds `work` (checked by the caller) through the batched prefill; returns the token each item's
    /// draw picks (greedy without `draws`) and, with `logits`, its last row's logits. Positions are
    /// advanced by the caller.
    pub(super) fn feed_prefill(
        &mut self,
        work: &[Work<'_>],
        draws: Option<&[Draw]>,
        logits: bool,
    ) -> Result<Vec<(u32, Vec<f32>)>, BackendError> {
        let Some(ws) = self.prefill.as_mut() else {
            return Err(dev("no prefill workspace"));
        };
        let cap = ws.max_tokens;
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
                let seq = self.table.get(w.seq)?;
                segs.push(PrefillSeg {
                    slot: seq.slot,
                    pos: seq.pos + fed[i],
                    tokens: &w.tokens[fed[i]..fed[i] + n],
                });
                items.push(i);
                used += n;
            }
            self.model.prefill(ws, &segs).map_err(dev)?;
            let row_draws: Vec<Draw> = items
                .iter()
                .zip(&segs)
                .map(|(&i, seg)| match draws {
                    Some(d) if fed[i] + seg.tokens.len() == work[i].tokens.len() => d[i],
                    _ => Draw::GREEDY,
                })
                .collect();
            let vocab = self.model.cfg.vocab_size;
            let m = &mut self.model;
            self.sampler
                .pick(&m.ctx, &mut m.ws, vocab, &row_draws)
                .map_err(dev)?;
            let next = self.model.read_next(segs.len()).map_err(dev)?;
            for (row, (&i, seg)) in items.iter().zip(&segs).enumerate() {
                fed[i] += seg.tokens.len();
                if fed[i] == work[i].tokens.len() {
                    out[i].0 = next[row] as u32;
                    if logits {
                        out[i].1 = self.model.read_logits(row).map_err(dev)?;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Prefills `tokens` into `seq` in ONE call and returns the logits of every token (`[tokens][vocab]`),
    /// for checking each position against the CPU reference. At most `PREFILL_TOKENS` tokens.
    pub fn prefill_logits(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>, BackendError> {
        let work = [Work { seq, tokens }];
        self.table.check_work(&work, self.model.cfg.vocab_size)?;
        let Some(ws) = self.prefill.as_mut() else {
            return Err(dev("no prefill workspace"));
        };
        let s = self.table.get(seq)?;
        let segs = [PrefillSeg {
            slot: s.slot,
            pos: s.pos,
            tokens,
        }];
        let flat = self.model.prefill_all_logits(ws, &segs).map_err(dev)?;
        self.table.advance(&work);
        let v = self.model.cfg.vocab_size;
        Ok(flat.chunks(v).map(<[f32]>::to_vec).collect())
    }
}
