//! Collectives between ranks, step-synchronous: one call carries every rank's buffer, the way
//! a single host thread drives all GPUs with NCCL (`ncclGroupStart`, one `ncclAllReduce` per
//! rank on that rank's stream, `ncclGroupEnd`). The CPU simulation sums in place of NCCL.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    #[error("collective over {world} ranks called with {got} buffers")]
    WrongRankCount { world: usize, got: usize },
    #[error("collective buffers differ in length: rank 0 has {first}, rank {rank} has {len}")]
    LengthMismatch {
        first: usize,
        rank: usize,
        len: usize,
    },
    #[error("send from rank {from} to rank {to}: ranks must be below {world}")]
    BadRank {
        from: usize,
        to: usize,
        world: usize,
    },
    #[error("collective failed: {0}")]
    Backend(String),
}

/// The communication a split model needs. `Buf` is a host slice for the simulation and a
/// device buffer for a GPU implementation.
pub trait Collective {
    type Buf: ?Sized;
    fn world(&self) -> usize;
    /// Sums `bufs[r]` over all ranks `r`, leaving the sum in every buffer.
    fn all_reduce_sum(&self, bufs: &mut [&mut Self::Buf]) -> Result<(), CollectiveError>;
    /// Copies `src` (on rank `from`) into `dst` (on rank `to`): the pipeline hand-off.
    fn send(
        &self,
        from: usize,
        to: usize,
        src: &Self::Buf,
        dst: &mut Self::Buf,
    ) -> Result<(), CollectiveError>;
}

/// Traffic counters of a collective (payload bytes per rank, not wire bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub all_reduces: u64,
    pub all_reduce_bytes: u64,
    pub sends: u64,
    pub send_bytes: u64,
}

/// Ranks simulated in one process: an all-reduce is a sum in rank order (deterministic).
#[derive(Debug, Default)]
pub struct InProcessSum {
    world: usize,
    all_reduces: AtomicU64,
    all_reduce_bytes: AtomicU64,
    sends: AtomicU64,
    send_bytes: AtomicU64,
}

impl InProcessSum {
    pub fn new(world: usize) -> Self {
        InProcessSum {
            world,
            ..Default::default()
        }
    }

    pub fn traffic(&self) -> Traffic {
        Traffic {
            all_reduces: self.all_reduces.load(Ordering::Relaxed),
            all_reduce_bytes: self.all_reduce_bytes.load(Ordering::Relaxed),
            sends: self.sends.load(Ordering::Relaxed),
            send_bytes: self.send_bytes.load(Ordering::Relaxed),
        }
    }
}

impl Collective for InProcessSum {
    type Buf = [f32];

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&self, bufs: &mut [&mut [f32]]) -> Result<(), CollectiveError> {
        if bufs.len() != self.world {
            return Err(CollectiveError::WrongRankCount {
                world: self.world,
                got: bufs.len(),
            });
        }
        let Some((first, rest)) = bufs.split_first_mut() else {
            return Ok(());
        };
        if let Some((i, b)) = rest
            .iter()
            .enumerate()
            .find(|(_, b)| b.len() != first.len())
        {
            return Err(CollectiveError::LengthMismatch {
                first: first.len(),
                rank: i + 1,
                len: b.len(),
            });
        }
        for b in rest.iter() {
            first.iter_mut().zip(b.iter()).for_each(|(s, v)| *s += v);
        }
        for b in rest.iter_mut() {
            b.copy_from_slice(first);
        }
        self.all_reduces.fetch_add(1, Ordering::Relaxed);
        self.all_reduce_bytes
            .fetch_add(4 * first.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn send(
        &self,
        from: usize,
        to: usize,
        src: &[f32],
        dst: &mut [f32],
    ) -> Result<(), CollectiveError> {
        if from >= self.world || to >= self.world {
            return Err(CollectiveError::BadRank {
                from,
                to,
                world: self.world,
            });
        }
        if src.len() != dst.len() {
            return Err(CollectiveError::LengthMismatch {
                first: src.len(),
                rank: to,
                len: dst.len(),
            });
        }
        dst.copy_from_slice(src);
        self.sends.fetch_add(1, Ordering::Relaxed);
        self.send_bytes
            .fetch_add(4 * src.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}
