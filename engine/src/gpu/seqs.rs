//! What the one-GPU and the split backend share: the sequence table (ids -> state slots and
//! positions, snapshots with a runner-specific state payload) and the loop that feeds a step's work
//! one token per item per decode step, picking each item's token on the device after its last one.

use super::model::StepInput;
use super::RunnerError;
use crate::backend::{check_tokens, BackendError, SeqId, SnapshotId, Work};
use crate::sampler::Draw;
use std::collections::HashMap;

pub(crate) fn dev(e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(e.to_string())
}

/// A sequence's state slot and the tokens it has consumed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seq {
    pub slot: usize,
    pub pos: usize,
}

struct Snap<S> {
    seq: SeqId,
    pos: usize,
    state: S,
}

/// Sequences and snapshots by id; `S` is what a snapshot saves of the slot's device state.
pub(crate) struct SeqTable<S> {
    seqs: HashMap<SeqId, Seq>,
    free_slots: Vec<usize>,
    snapshots: HashMap<SnapshotId, Snap<S>>,
    next_id: u64,
    pub context_limit: usize,
}

impl<S> SeqTable<S> {
    pub fn new(slots: usize, context_limit: usize) -> Self {
        SeqTable {
            seqs: HashMap::new(),
            free_slots: (0..slots).rev().collect(),
            snapshots: HashMap::new(),
            next_id: 1,
            context_limit,
        }
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A new sequence at position 0 in a free slot, after `reset(slot)` cleared the slot's state.
    pub fn create_with(
        &mut self,
        reset: impl FnOnce(usize) -> Result<(), BackendError>,
    ) -> Result<SeqId, BackendError> {
        let slot = self.free_slot()?;
        reset(slot)?;
        Ok(self.insert(slot))
    }

    /// A snapshot of `seq` holding what `save(slot)` copied of its slot's state.
    pub fn snapshot_with(
        &mut self,
        seq: SeqId,
        save: impl FnOnce(usize) -> Result<S, BackendError>,
    ) -> Result<SnapshotId, BackendError> {
        let state = save(self.get(seq)?.slot)?;
        self.save(seq, state)
    }

    /// Rewinds `seq` to `snapshot`: `load(slot, saved)` puts the saved state back, then the
    /// position follows.
    pub fn restore_with(
        &mut self,
        seq: SeqId,
        snapshot: SnapshotId,
        load: impl FnOnce(usize, &S) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let (slot, state) = self.restore_target(seq, snapshot)?;
        load(slot, state)?;
        self.rewound(seq, snapshot);
        Ok(())
    }

    /// A free slot for a new sequence (the caller resets its state, then calls [`Self::insert`]).
    fn free_slot(&self) -> Result<usize, BackendError> {
        self.free_slots
            .last()
            .copied()
            .ok_or_else(|| dev("every sequence slot is in use"))
    }

    /// Takes the slot [`Self::free_slot`] returned for a new sequence at position 0.
    fn insert(&mut self, slot: usize) -> SeqId {
        self.free_slots.retain(|&s| s != slot);
        let id = SeqId(self.fresh_id());
        self.seqs.insert(id, Seq { slot, pos: 0 });
        id
    }

    pub fn release(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            self.free_slots.push(s.slot);
        }
        self.snapshots.retain(|_, s| s.seq != seq);
    }

    pub fn get(&self, seq: SeqId) -> Result<Seq, BackendError> {
        self.seqs
            .get(&seq)
            .copied()
            .ok_or(BackendError::UnknownSequence(seq))
    }

    /// Token ids within the vocabulary, no sequence twice, and room in every context.
    pub fn check_work(&self, work: &[Work<'_>], vocab: usize) -> Result<(), BackendError> {
        check_tokens(work, vocab)?;
        for w in work {
            let have = self.get(w.seq)?.pos;
            if have + w.tokens.len() > self.context_limit {
                return Err(BackendError::ContextFull {
                    have,
                    new: w.tokens.len(),
                    limit: self.context_limit,
                });
            }
        }
        Ok(())
    }

    /// Records that every item's tokens were consumed.
    pub fn advance(&mut self, work: &[Work<'_>]) {
        for w in work {
            if let Some(s) = self.seqs.get_mut(&w.seq) {
                s.pos += w.tokens.len();
            }
        }
    }

    /// Keeps `state` (the slot's saved device state) as a snapshot of `seq` at its position.
    fn save(&mut self, seq: SeqId, state: S) -> Result<SnapshotId, BackendError> {
        let pos = self.get(seq)?.pos;
        let id = SnapshotId(self.fresh_id());
        self.snapshots.insert(id, Snap { seq, pos, state });
        Ok(id)
    }

    /// The slot and saved state to rewind `seq` to `snapshot`, after checking they belong together;
    /// [`Self::rewound`] then sets the position.
    fn restore_target(
        &self,
        seq: SeqId,
        snapshot: SnapshotId,
    ) -> Result<(usize, &S), BackendError> {
        let snap = self
            .snapshots
            .get(&snapshot)
            .ok_or(BackendError::UnknownSnapshot(snapshot))?;
        if snap.seq != seq {
            return Err(BackendError::ForeignSnapshot { seq, snapshot });
        }
        let s = self.get(seq)?;
        if snap.pos > s.pos {
            return Err(BackendError::StaleSnapshot { seq, snapshot });
        }
        Ok((s.slot, &snap.state))
    }

    /// Sets `seq`'s position to the snapshot's, once its state was restored.
    fn rewound(&mut self, seq: SeqId, snapshot: SnapshotId) {
        let pos = self.snapshots.get(&snapshot).map(|s| s.pos);
        if let (Some(pos), Some(s)) = (pos, self.seqs.get_mut(&seq)) {
            s.pos = pos;
        }
    }

    pub fn release_snapshot(&mut self, snapshot: SnapshotId) {
        self.snapshots.remove(&snapshot);
    }
}

/// The logits of a feed's items (see [`feed_steps`]).
pub(crate) fn logits_only(fed: Vec<(u32, Vec<f32>)>) -> Vec<Vec<f32>> {
    fed.into_iter().map(|(_, l)| l).collect()
}

/// The picked tokens of a feed's items.
pub(crate) fn tokens_only(fed: Vec<(u32, Vec<f32>)>) -> Vec<u32> {
    fed.into_iter().map(|(t, _)| t).collect()
}

/// One decode step as the feeding loop needs it from a runner.
pub(crate) trait StepRunner {
    /// Uploads the step's inputs and runs it (graph replay or eager).
    fn run(&mut self, input: &StepInput<'_>) -> Result<(), RunnerError>;
    /// Replaces the step's greedy ids of rows whose draw samples (see `DeviceSampler::pick`).
    fn pick(&mut self, draws: &[Draw]) -> Result<(), RunnerError>;
    /// The step's chosen ids (the step's one sync).
    fn read_next(&mut self, rows: usize) -> Result<Vec<i32>, RunnerError>;
    fn read_logits(&self, row: usize) -> Result<Vec<f32>, RunnerError>;
}

/// Checks that `forward_pick` got one draw per work item.
pub(crate) fn check_draws(work: &[Work<'_>], draws: &[Draw]) -> Result<(), BackendError> {
    if draws.len() == work.len() {
        return Ok(());
    }
    Err(dev(format!(
        "{} draws for {} work items",
        draws.len(),
        work.len()
    )))
}

/// Feeds every item's tokens (checked by the caller), one token per item per step; after each
/// item's last token records the token its draw picks (greedy without `draws`) and, with `logits`,
/// its logits. Positions are advanced by the caller ([`SeqTable::advance`]).
pub(crate) fn feed_steps<S>(
    runner: &mut impl StepRunner,
    table: &SeqTable<S>,
    work: &[Work<'_>],
    draws: Option<&[Draw]>,
    logits: bool,
) -> Result<Vec<(u32, Vec<f32>)>, BackendError> {
    let mut out = vec![(0u32, Vec::new()); work.len()];
    let steps = work.iter().map(|w| w.tokens.len()).max().unwrap_or(0);
    let (mut toks, mut slots, mut poss, mut items) = (vec![], vec![], vec![], vec![]);
    let mut row_draws = Vec::new();
    for t in 0..steps {
        toks.clear();
        slots.clear();
        poss.clear();
        items.clear();
        row_draws.clear();
        for (i, w) in work.iter().enumerate().filter(|(_, w)| t < w.tokens.len()) {
            let seq = table.get(w.seq)?;
            toks.push(w.tokens[t] as i32);
            slots.push(seq.slot as i32);
            poss.push((seq.pos + t) as i32);
            items.push(i);
            row_draws.push(match draws {
                Some(d) if t + 1 == w.tokens.len() => d[i],
                _ => Draw::GREEDY,
            });
        }
        let input = StepInput {
            tokens: &toks,
            slots: &slots,
            positions: &poss,
        };
        runner.run(&input).map_err(dev)?;
        runner.pick(&row_draws).map_err(dev)?;
        let next = runner.read_next(toks.len()).map_err(dev)?;
        for (row, &i) in items.iter().enumerate() {
            if t + 1 == work[i].tokens.len() {
                out[i].0 = next[row] as u32;
                if logits {
                    out[i].1 = runner.read_logits(row).map_err(dev)?;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(t: &mut SeqTable<&'static str>) -> SeqId {
        t.create_with(|_| Ok(())).expect("seq")
    }

    fn feed(t: &mut SeqTable<&'static str>, seq: SeqId, n: usize) {
        let toks = vec![1u32; n];
        t.advance(&[Work { seq, tokens: &toks }]);
    }

    #[test]
    fn slots_are_reused_and_positions_advance() {
        let mut t = SeqTable::new(2, 10);
        let (a, b) = (fresh(&mut t), fresh(&mut t));
        assert_ne!(t.get(a).expect("a").slot, t.get(b).expect("b").slot);
        assert!(t.create_with(|_| Ok(())).is_err(), "two slots, both taken");
        feed(&mut t, a, 3);
        assert_eq!(t.get(a).expect("a").pos, 3);
        let slot_a = t.get(a).expect("a").slot;
        t.release(a);
        assert!(matches!(t.get(a), Err(BackendError::UnknownSequence(_))));
        let mut reset = None;
        t.create_with(|slot| {
            reset = Some(slot);
            Ok(())
        })
        .expect("freed slot");
        assert_eq!(reset, Some(slot_a));
    }

    #[test]
    fn a_failed_reset_keeps_the_slot_free() {
        let mut t: SeqTable<&str> = SeqTable::new(1, 10);
        assert!(t.create_with(|_| Err(dev("reset failed"))).is_err());
        assert!(t.create_with(|_| Ok(())).is_ok());
    }

    #[test]
    fn work_is_checked_against_vocab_and_context() {
        let mut t = SeqTable::new(1, 4);
        let a = fresh(&mut t);
        let ok = [0u32, 1, 2, 3];
        assert!(t
            .check_work(
                &[Work {
                    seq: a,
                    tokens: &ok
                }],
                8
            )
            .is_ok());
        let long = [0u32; 5];
        assert!(matches!(
            t.check_work(
                &[Work {
                    seq: a,
                    tokens: &long
                }],
                8
            ),
            Err(BackendError::ContextFull { .. })
        ));
        assert!(t
            .check_work(
                &[Work {
                    seq: a,
                    tokens: &[9]
                }],
                8
            )
            .is_err());
    }

    #[test]
    fn snapshots_rewind_only_their_own_sequence_backwards() {
        let mut t = SeqTable::new(2, 100);
        let (a, b) = (fresh(&mut t), fresh(&mut t));
        feed(&mut t, a, 2);
        let snap = t.snapshot_with(a, |_| Ok("state at 2")).expect("save");
        feed(&mut t, a, 2);
        let slot_a = t.get(a).expect("a").slot;
        let mut loaded = None;
        t.restore_with(a, snap, |slot, st| {
            loaded = Some((slot, *st));
            Ok(())
        })
        .expect("restore");
        assert_eq!(loaded, Some((slot_a, "state at 2")));
        assert_eq!(t.get(a).expect("a").pos, 2);
        let ok = |_: usize, _: &&str| Ok(());
        assert!(matches!(
            t.restore_with(b, snap, ok),
            Err(BackendError::ForeignSnapshot { .. })
        ));
        feed(&mut t, a, 2);
        let later = t.snapshot_with(a, |_| Ok("later")).expect("save");
        t.restore_with(a, snap, ok).expect("restore");
        assert!(matches!(
            t.restore_with(a, later, ok),
            Err(BackendError::StaleSnapshot { .. })
        ));
        t.release_snapshot(snap);
        assert!(matches!(
            t.restore_with(a, snap, ok),
            Err(BackendError::UnknownSnapshot(_))
        ));
        t.release(a);
        assert!(matches!(
            t.restore_with(a, later, ok),
            Err(BackendError::UnknownSnapshot(_))
        ));
    }

    #[test]
    fn draws_must_match_work() {
        let toks = [1u32];
        let w = [Work {
            seq: SeqId(1),
            tokens: &toks,
        }];
        assert!(check_draws(&w, &[Draw::GREEDY]).is_ok());
        assert!(check_draws(&w, &[]).is_err());
    }
}
