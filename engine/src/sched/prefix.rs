//! Prefix reuse for follow-up turns. A conversation keeps its sequence (the decode state after
//! its last turn) and snapshots taken near where each prompt ended. A new prompt is rarely an
//! exact extension of the cached tokens (in thinking mode earlier reasoning is dropped when the
//! conversation is re-encoded), so we reuse the longest common prefix: continue in place when
//! the cache is a prefix of the prompt, else rewind to the latest snapshot inside the common
//! prefix.

use crate::backend::{SeqId, SnapshotId};

/// At most this many snapshots are kept per conversation (the oldest go first).
pub const MAX_SNAPSHOTS: usize = 8;

/// The cached state of one idle conversation.
#[derive(Debug, Clone)]
pub struct ConversationCache {
    pub seq: SeqId,
    /// The tokens the sequence has consumed, in order.
    pub tokens: Vec<u32>,
    /// `(position, snapshot)` in increasing position order.
    pub snapshots: Vec<(usize, SnapshotId)>,
}

/// How to bring a cached sequence to the start of a new prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReusePlan {
    /// Rewind to this snapshot first (`None`: continue from the current state).
    pub restore: Option<SnapshotId>,
    /// Prompt tokens already in the state after the rewind; prefill starts here.
    pub reuse_len: usize,
    /// Snapshots that become invalid (beyond the rewind point) and must be released.
    pub release: Vec<SnapshotId>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl ConversationCache {
    pub fn new(seq: SeqId) -> Self {
        ConversationCache {
            seq,
            tokens: Vec::new(),
            snapshots: Vec::new(),
        }
    }

    /// Plans the reuse of this cache for `prompt`. At least one prompt token is always left to
    /// prefill, because the next token is sampled from the logits of the last one.
    pub fn plan(&self, prompt: &[u32]) -> ReusePlan {
        let limit = common_prefix(&self.tokens, prompt).min(prompt.len().saturating_sub(1));
        if limit == self.tokens.len() {
            return ReusePlan {
                restore: None,
                reuse_len: limit,
                release: Vec::new(),
            };
        }
        let best = self.snapshots.iter().rev().find(|(pos, _)| *pos <= limit);
        let (reuse_len, restore) = match best {
            Some(&(pos, id)) => (pos, Some(id)),
            None => (0, None),
        };
        let release = self
            .snapshots
            .iter()
            .filter(|(pos, _)| *pos > reuse_len)
            .map(|&(_, id)| id)
            .collect();
        ReusePlan {
            restore,
            reuse_len,
            release,
        }
    }

    /// Applies a plan's bookkeeping (the caller performs the backend rewind). Returns `false`
    /// when nothing is reusable and the sequence must be reset to empty instead.
    pub fn apply(&mut self, plan: &ReusePlan) -> bool {
        let in_place = plan.restore.is_none() && plan.reuse_len == self.tokens.len();
        self.snapshots.retain(|(_, id)| !plan.release.contains(id));
        self.tokens.truncate(plan.reuse_len);
        plan.restore.is_some() || in_place
    }

    /// Records a snapshot at the current end of the cached tokens, dropping the oldest beyond
    /// [`MAX_SNAPSHOTS`]; returns snapshots to release.
    pub fn add_snapshot(&mut self, id: SnapshotId) -> Vec<SnapshotId> {
        let pos = self.tokens.len();
        self.snapshots.push((pos, id));
        let excess = self.snapshots.len().saturating_sub(MAX_SNAPSHOTS);
        self.snapshots.drain(..excess).map(|(_, id)| id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(tokens: &[u32], snaps: &[usize]) -> ConversationCache {
        ConversationCache {
            seq: SeqId(1),
            tokens: tokens.to_vec(),
            snapshots: snaps
                .iter()
                .map(|&p| (p, SnapshotId(100 + p as u64)))
                .collect(),
        }
    }

    #[test]
    fn extension_continues_in_place() {
        let c = cache(&[1, 2, 3, 4], &[2, 4]);
        let plan = c.plan(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            plan,
            ReusePlan {
                restore: None,
                reuse_len: 4,
                release: vec![]
            }
        );
    }

    #[test]
    fn divergence_rewinds_to_latest_snapshot_inside_the_prefix() {
        // Cached: prompt + reasoning; new prompt drops the reasoning after position 5.
        let c = cache(&[1, 2, 3, 4, 5, 9, 9, 9], &[3, 5, 8]);
        let plan = c.plan(&[1, 2, 3, 4, 5, 7, 8]);
        assert_eq!(plan.restore, Some(SnapshotId(105)));
        assert_eq!(plan.reuse_len, 5);
        assert_eq!(plan.release, vec![SnapshotId(108)]);
    }

    #[test]
    fn identical_prompt_leaves_one_token_to_prefill() {
        let c = cache(&[1, 2, 3, 4], &[2, 4]);
        let plan = c.plan(&[1, 2, 3, 4]);
        assert_eq!(plan.reuse_len, 2);
        assert_eq!(plan.restore, Some(SnapshotId(102)));
    }

    #[test]
    fn nothing_shared_means_a_fresh_start() {
        let mut c = cache(&[1, 2, 3], &[3]);
        let plan = c.plan(&[7, 8]);
        assert_eq!(plan.reuse_len, 0);
        assert!(!c.apply(&plan));
        assert!(c.tokens.is_empty() && c.snapshots.is_empty());
    }

    #[test]
    fn snapshots_are_capped() {
        let mut c = cache(&[], &[]);
        let mut released = Vec::new();
        for i in 0..(MAX_SNAPSHOTS as u64 + 3) {
            c.tokens.push(i as u32);
            released.extend(c.add_snapshot(SnapshotId(i)));
        }
        assert_eq!(released, vec![SnapshotId(0), SnapshotId(1), SnapshotId(2)]);
        assert_eq!(c.snapshots.len(), MAX_SNAPSHOTS);
    }
}
