//! The model-execution interface the engine thread drives: sequences live inside the backend
//! (host memory for the CPU reference, device memory for CUDA) and are named by ids, so the
//! scheduler never touches tensors.

mod cpu;

pub use cpu::CpuBackend;

use crate::api::GpuStatus;
use crate::model::ModelConfig;
use crate::sampler::{pick, Draw};

/// A sequence (one conversation's decode state) inside a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// A saved point of a sequence, to rewind to for prefix reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotId(pub u64);

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("unknown sequence {0:?}")]
    UnknownSequence(SeqId),
    #[error("unknown snapshot {0:?}")]
    UnknownSnapshot(SnapshotId),
    #[error("snapshot {snapshot:?} does not belong to sequence {seq:?}")]
    ForeignSnapshot { seq: SeqId, snapshot: SnapshotId },
    #[error("snapshot {snapshot:?} is ahead of sequence {seq:?} (it was rewound past it)")]
    StaleSnapshot { seq: SeqId, snapshot: SnapshotId },
    #[error("sequence {0:?} appears twice in one step")]
    DuplicateSequence(SeqId),
    #[error("token id {token} is outside the vocabulary ({vocab})")]
    BadToken { token: u32, vocab: usize },
    #[error("context full: {have} + {new} tokens exceed the limit of {limit}")]
    ContextFull {
        have: usize,
        new: usize,
        limit: usize,
    },
    #[error("device error: {0}")]
    Device(String),
}

/// One sequence's part of a forward step: the new tokens it feeds.
#[derive(Debug, Clone, Copy)]
pub struct Work<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
}

/// What runs the model. Implemented by the CPU reference and the CUDA runner.
pub trait Backend: Send {
    /// A short description ("CPU reference (official numerics)", "CUDA on 2 x H200", ...).
    fn describe(&self) -> String;
    fn config(&self) -> &ModelConfig;
    /// Longest sequence this backend accepts.
    fn context_limit(&self) -> usize;
    fn create_seq(&mut self) -> Result<SeqId, BackendError>;
    fn release_seq(&mut self, seq: SeqId);
    /// Tokens consumed so far by the sequence.
    fn seq_len(&self, seq: SeqId) -> Result<usize, BackendError>;
    /// Feeds each item's tokens (prefill chunks and single decode tokens may be mixed) and
    /// returns the logits `[vocab]` after each item's last token.
    fn forward(&mut self, work: &[Work<'_>]) -> Result<Vec<Vec<f32>>, BackendError>;
    /// Like [`Backend::forward`], but returns the token each item's draw picks from its logits
    /// ([`crate::sampler::pick`]). Items still mid-prompt pass [`Draw::GREEDY`] and ignore the
    /// result. Backends that sample on the device override this to copy back ids, not logits.
    fn forward_pick(
        &mut self,
        work: &[Work<'_>],
        draws: &[Draw],
    ) -> Result<Vec<u32>, BackendError> {
        let logits = self.forward(work)?;
        Ok(logits.iter().zip(draws).map(|(l, d)| pick(l, d)).collect())
    }
    /// Saves the sequence's current point.
    fn snapshot(&mut self, seq: SeqId) -> Result<SnapshotId, BackendError>;
    /// Rewinds the sequence to a snapshot taken on it earlier (its tokens up to that point
    /// must be unchanged, which the caller guarantees).
    fn restore(&mut self, seq: SeqId, snapshot: SnapshotId) -> Result<(), BackendError>;
    fn release_snapshot(&mut self, snapshot: SnapshotId);
    /// The GPUs in use, if any.
    fn gpu_status(&self) -> Vec<GpuStatus> {
        Vec::new()
    }
}

/// Checks every token id against the vocabulary, and that no sequence appears twice, before
/// any state changes.
pub fn check_tokens(work: &[Work<'_>], vocab: usize) -> Result<(), BackendError> {
    let mut seen = std::collections::HashSet::new();
    if let Some(w) = work.iter().find(|w| !seen.insert(w.seq)) {
        return Err(BackendError::DuplicateSequence(w.seq));
    }
    match work
        .iter()
        .flat_map(|w| w.tokens.iter())
        .find(|&&t| t as usize >= vocab)
    {
        Some(&token) => Err(BackendError::BadToken { token, vocab }),
        None => Ok(()),
    }
}
