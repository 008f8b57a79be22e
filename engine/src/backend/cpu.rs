//! The CPU reference model behind the [`Backend`] interface.

use super::{check_tokens, Backend, BackendError, SeqId, SnapshotId, Work};
use crate::model::ModelConfig;
use crate::reference::{BatchItem, ForwardOptions, Model, SeqSnapshot, SeqState};
use std::collections::HashMap;

pub struct CpuBackend {
    model: Model,
    context_limit: usize,
    seqs: HashMap<SeqId, SeqState>,
    snapshots: HashMap<SnapshotId, (SeqId, SeqSnapshot)>,
    next_id: u64,
}

impl CpuBackend {
    pub fn new(model: Model, context_limit: usize) -> Self {
        let limit = context_limit.min(model.cfg.max_position_embeddings);
        CpuBackend {
            model,
            context_limit: limit,
            seqs: HashMap::new(),
            snapshots: HashMap::new(),
            next_id: 1,
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        format!("CPU reference ({:?} numerics)", self.model.numerics).to_lowercase()
    }

    fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }

    fn context_limit(&self) -> usize {
        self.context_limit
    }

    fn create_seq(&mut self) -> Result<SeqId, BackendError> {
        let id = SeqId(self.fresh_id());
        self.seqs.insert(id, self.model.new_state());
        Ok(id)
    }

    fn release_seq(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
        self.snapshots.retain(|_, (owner, _)| *owner != seq);
    }

    fn seq_len(&self, seq: SeqId) -> Result<usize, BackendError> {
        self.seqs
            .get(&seq)
            .map(|s| s.pos)
            .ok_or(BackendError::UnknownSequence(seq))
    }

    fn forward(&mut self, work: &[Work<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        check_tokens(work, self.model.cfg.vocab_size)?;
        for w in work {
            let have = self.seq_len(w.seq)?;
            if have + w.tokens.len() > self.context_limit {
                return Err(BackendError::ContextFull {
                    have,
                    new: w.tokens.len(),
                    limit: self.context_limit,
                });
            }
        }
        // Take the states out so the batch can borrow them mutably all at once.
        let mut states: Vec<(SeqId, SeqState)> = work
            .iter()
            .filter_map(|w| self.seqs.remove(&w.seq).map(|s| (w.seq, s)))
            .collect();
        let mut items: Vec<BatchItem<'_>> = states
            .iter_mut()
            .zip(work)
            .map(|((_, state), w)| BatchItem {
                state,
                tokens: w.tokens,
            })
            .collect();
        let out = self.model.forward(&mut items, ForwardOptions::default());
        drop(items);
        self.seqs.extend(states);
        Ok(out.into_iter().map(|o| o.logits).collect())
    }

    fn snapshot(&mut self, seq: SeqId) -> Result<SnapshotId, BackendError> {
        let snap = self
            .seqs
            .get(&seq)
            .ok_or(BackendError::UnknownSequence(seq))?
            .snapshot();
        let id = SnapshotId(self.fresh_id());
        self.snapshots.insert(id, (seq, snap));
        Ok(id)
    }

    fn restore(&mut self, seq: SeqId, snapshot: SnapshotId) -> Result<(), BackendError> {
        let (owner, snap) = self
            .snapshots
            .get(&snapshot)
            .ok_or(BackendError::UnknownSnapshot(snapshot))?;
        if *owner != seq {
            return Err(BackendError::ForeignSnapshot { seq, snapshot });
        }
        let state = self
            .seqs
            .get_mut(&seq)
            .ok_or(BackendError::UnknownSequence(seq))?;
        if snap.pos > state.pos {
            return Err(BackendError::StaleSnapshot { seq, snapshot });
        }
        state.restore(snap);
        Ok(())
    }

    fn release_snapshot(&mut self, snapshot: SnapshotId) {
        self.snapshots.remove(&snapshot);
    }
}
