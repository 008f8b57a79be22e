//! What the one-GPU and the split backend's [`Backend`](crate::backend::Backend) impls share: the layer states
//! of a sequence slot (reset, saved, restored on one GPU's layers or every rank's) and the methods that only
//! route to the sequence table and the backend's `feed`.

use super::attention::{AttnSnapshot, AttnState};
use super::seqs::dev;
use crate::backend::BackendError;
use dsv4_kernels::cudarc::driver::CudaStream;
use std::sync::Arc;

/// The attention states a runner holds, as a backend resets, saves and restores one slot of them.
pub(crate) trait SlotStates {
    /// What a snapshot of one slot keeps.
    type Saved;
    fn reset_slot(&mut self, slot: usize) -> Result<(), BackendError>;
    fn save_slot(&self, slot: usize) -> Result<Self::Saved, BackendError>;
    fn restore_slot(&mut self, slot: usize, saved: &Self::Saved) -> Result<(), BackendError>;
}

/// Layer states on one GPU's stream (the one-GPU model, or one rank of a split).
pub(crate) struct Layers<'a> {
    pub stream: &'a Arc<CudaStream>,
    pub states: &'a mut [AttnState],
}

impl SlotStates for Layers<'_> {
    type Saved = Vec<AttnSnapshot>;

    fn reset_slot(&mut self, slot: usize) -> Result<(), BackendError> {
        for st in self.states.iter_mut() {
            st.reset_slot(self.stream, slot).map_err(dev)?;
        }
        Ok(())
    }

    fn save_slot(&self, slot: usize) -> Result<Self::Saved, BackendError> {
        self.states
            .iter()
            .map(|st| st.snapshot(self.stream, slot))
            .collect::<Result<Vec<_>, _>>()
            .map_err(dev)
    }

    fn restore_slot(&mut self, slot: usize, saved: &Self::Saved) -> Result<(), BackendError> {
        for (st, ls) in self.states.iter_mut().zip(saved) {
            st.restore(self.stream, slot, ls).map_err(dev)?;
        }
        Ok(())
    }
}

/// The [`Backend`](crate::backend::Backend) methods a GPU backend only routes: to `self.table` (a
/// `SeqTable`), to `self.model` (its `cfg` and [`SlotStates`] through `self.slots()`), and to `self.feed`.
macro_rules! routed_backend_methods {
    () => {
        fn config(&self) -> &ModelConfig {
            &self.model.cfg
        }

        fn context_limit(&self) -> usize {
            self.table.context_limit
        }

        fn create_seq(&mut self) -> Result<SeqId, BackendError> {
            let mut states = slots_of(&mut self.model);
            self.table.create_with(|slot| states.reset_slot(slot))
        }

        fn release_seq(&mut self, seq: SeqId) {
            self.table.release(seq);
        }

        fn seq_len(&self, seq: SeqId) -> Result<usize, BackendError> {
            Ok(self.table.get(seq)?.pos)
        }

        fn forward(&mut self, work: &[Work<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
            Ok(logits_only(self.feed(work, None, true)?))
        }

        fn forward_pick(
            &mut self,
            work: &[Work<'_>],
            draws: &[Draw],
        ) -> Result<Vec<u32>, BackendError> {
            check_draws(work, draws)?;
            Ok(tokens_only(self.feed(work, Some(draws), false)?))
        }

        fn snapshot(&mut self, seq: SeqId) -> Result<SnapshotId, BackendError> {
            let states = slots_of(&mut self.model);
            self.table.snapshot_with(seq, |slot| states.save_slot(slot))
        }

        fn restore(&mut self, seq: SeqId, snapshot: SnapshotId) -> Result<(), BackendError> {
            let mut states = slots_of(&mut self.model);
            self.table.restore_with(seq, snapshot, |slot, saved| {
                states.restore_slot(slot, saved)
            })
        }

        fn release_snapshot(&mut self, snapshot: SnapshotId) {
            self.table.release_snapshot(snapshot);
        }
    };
}
pub(crate) use routed_backend_methods;

/// Every rank's layers of a split, in rank order.
impl<T: SlotStates> SlotStates for Vec<T> {
    type Saved = Vec<T::Saved>;

    fn reset_slot(&mut self, slot: usize) -> Result<(), BackendError> {
        self.iter_mut().try_for_each(|r| r.reset_slot(slot))
    }

    fn save_slot(&self, slot: usize) -> Result<Self::Saved, BackendError> {
        self.iter().map(|r| r.save_slot(slot)).collect()
    }

    fn restore_slot(&mut self, slot: usize, saved: &Self::Saved) -> Result<(), BackendError> {
        for (r, s) in self.iter_mut().zip(saved) {
            r.restore_slot(slot, s)?;
        }
        Ok(())
    }
}
