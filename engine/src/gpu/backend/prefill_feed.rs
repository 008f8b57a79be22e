//! Steps with prefill chunks: the one-GPU runner's batched prefill behind the shared feeding loop
//! ([`feed_chunks`]: calls of at most [`PREFILL_TOKENS`](super::PREFILL_TOKENS) rows, decode items riding
//! along as one-token chunks).

use super::{GpuBackend, OneGpuSteps};
use crate::backend::{BackendError, SeqId, Work};
use crate::gpu::prefill::feed::{feed_chunks, ChunkRunner};
use crate::gpu::prefill::PrefillSeg;
use crate::gpu::seqs::dev;
use crate::gpu::RunnerError;
use crate::sampler::Draw;

impl ChunkRunner for OneGpuSteps<'_> {
    fn max_tokens(&self) -> usize {
        self.prefill.as_ref().map_or(0, |ws| ws.max_tokens)
    }

    fn prefill(&mut self, segs: &[PrefillSeg<'_>]) -> Result<(), RunnerError> {
        let ws = self
            .prefill
            .as_deref_mut()
            .ok_or_else(|| RunnerError::Unsupported("no prefill workspace".into()))?;
        self.model.prefill(ws, segs)
    }
}

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
        let mut steps = OneGpuSteps {
            model: &mut self.model,
            graphs: &self.graphs,
            sampler: &mut self.sampler,
            prefill: self.prefill.as_mut(),
        };
        if steps.prefill.is_none() {
            return Err(dev("no prefill workspace"));
        }
        feed_chunks(&mut steps, &self.table, work, draws, logits)
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
