//! Per-sequence decode state of the split model: one reference state per rank (a GPU keeps
//! its caches on its device), with snapshots for prefix reuse and rewinds.

use crate::reference::state::LayerState;
use crate::reference::{SeqSnapshot, SeqState};

/// A sequence's decode state: one reference state per rank (its layers only).
#[derive(Debug, Clone)]
pub struct SplitState {
    pub pos: usize,
    pub ranks: Vec<SeqState>,
}

/// Every rank's state as it was after `pos` tokens; valid to restore while the sequence
/// still holds the same first `pos` tokens.
#[derive(Debug, Clone)]
pub struct SplitSnapshot {
    pub pos: usize,
    ranks: Vec<SeqSnapshot>,
}

impl SplitState {
    pub fn snapshot(&self) -> SplitSnapshot {
        SplitSnapshot {
            pos: self.pos,
            ranks: self.ranks.iter().map(SeqState::snapshot).collect(),
        }
    }

    /// Rewinds every rank to a snapshot taken earlier on this same sequence.
    pub fn restore(&mut self, s: &SplitSnapshot) {
        self.pos = s.pos;
        for (r, snap) in self.ranks.iter_mut().zip(&s.ranks) {
            r.restore(snap);
        }
    }

    /// Bytes of every rank's caches.
    pub fn rank_bytes(&self) -> Vec<usize> {
        self.ranks.iter().map(SeqState::bytes).collect()
    }
}

/// The MTP block's window state for one sequence, on every rank that holds (a share of) MTP.
#[derive(Debug, Clone)]
pub struct SplitMtpState {
    pub pos: usize,
    /// `None` on ranks without MTP (layer mode: all but the last).
    pub ranks: Vec<Option<LayerState>>,
}
