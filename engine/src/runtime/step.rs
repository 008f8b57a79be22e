//! One scheduling step: every decoding turn feeds its pending token, prefilling turns feed
//! chunks within the step's prefill budget (so a long prompt never stalls running turns), the
//! backend runs them all as one batch and picks each turn's next token from its draw (on the
//! device where the backend can).

use super::turn::{TokenOutcome, Turn};
use super::Runtime;
use crate::api::{Event, FinishReason};
use crate::backend::Work;
use crate::sampler::Draw;
use std::time::Duration;

/// Live statistics are sent at least this often while decoding.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

impl Runtime {
    pub(super) fn step(&mut self) {
        self.admit();
        self.drop_cancelled();
        if self.active.is_empty() || self.loaded.is_none() {
            return;
        }
        let chunks = self.plan_chunks();
        let draws: Vec<Draw> = self
            .active
            .iter_mut()
            .zip(&chunks)
            .filter(|(_, c)| !c.is_empty())
            .map(|(t, c)| t.draw_after(c.len()))
            .collect();
        let result = {
            let work: Vec<Work<'_>> = self
                .active
                .iter()
                .zip(&chunks)
                .filter(|(_, c)| !c.is_empty())
                .map(|(t, c)| Work {
                    seq: t.seq,
                    tokens: c.as_slice(),
                })
                .collect();
            match self.loaded.as_mut() {
                Some(l) => l.backend.forward_pick(&work, &draws),
                None => return,
            }
        };
        match result {
            Ok(picks) => self.after_forward(&chunks, picks),
            Err(e) => self.fail_all(&format!("the model failed: {e}")),
        }
    }

    fn drop_cancelled(&mut self) {
        let (cancelled, keep): (Vec<Turn>, Vec<Turn>) =
            self.active.drain(..).partition(|t| t.cancelled);
        self.active = keep;
        for t in cancelled {
            self.finish(t, FinishReason::Cancelled);
        }
    }

    /// The tokens each active turn feeds this step (empty: it waits for prefill budget).
    fn plan_chunks(&mut self) -> Vec<Vec<u32>> {
        let mut budget = self.settings.prefill_chunk.max(1);
        self.active
            .iter_mut()
            .map(|t| {
                if let Some(tok) = t.pending {
                    vec![tok]
                } else if t.prefilling() && budget > 0 {
                    let chunk = t.next_chunk(budget).to_vec();
                    budget -= chunk.len();
                    chunk
                } else {
                    Vec::new()
                }
            })
            .collect()
    }

    fn after_forward(&mut self, chunks: &[Vec<u32>], picks: Vec<u32>) {
        let mut picks = picks.into_iter();
        let mut events = Vec::new();
        let mut done = Vec::new();
        let Some(loaded) = self.loaded.as_mut() else {
            return;
        };
        let eos = loaded.backend.config().eos_token_id;
        let limit = loaded.backend.context_limit();
        for (i, (t, chunk)) in self.active.iter_mut().zip(chunks).enumerate() {
            if chunk.is_empty() {
                continue;
            }
            let Some(tok) = picks.next() else { break };
            if t.pending.is_some() {
                t.pending_fed();
            } else if t.prompt_fed(chunk.len()) {
                if let Ok(snap) = loaded.backend.snapshot(t.seq) {
                    t.snapshots.push((t.state_tokens.len(), snap));
                }
            }
            if t.prefilling() {
                continue;
            }
            match t.accept(tok, &loaded.tokenizer, eos, &mut events) {
                TokenOutcome::Finished(reason) => done.push((i, reason)),
                TokenOutcome::Continue if t.state_tokens.len() + 1 >= limit => {
                    done.push((i, FinishReason::ContextFull))
                }
                TokenOutcome::Continue => {}
            }
            events.extend(t.progress_due(PROGRESS_EVERY, limit));
        }
        events.into_iter().for_each(|e| self.emit(e));
        for (i, reason) in done.into_iter().rev() {
            let t = self.active.remove(i);
            self.finish(t, reason);
        }
    }

    /// Ends a turn: flushes its text, sends `Finished`, keeps its state for the conversation.
    pub(super) fn finish(&mut self, mut t: Turn, reason: FinishReason) {
        let mut events = Vec::new();
        t.flush(reason, &mut events);
        let limit = self
            .loaded
            .as_ref()
            .map(|l| l.backend.context_limit())
            .unwrap_or(0);
        events.push(Event::Finished {
            turn: t.id,
            reason,
            stats: t.stats(limit),
        });
        events.into_iter().for_each(|e| self.emit(e));
        self.retire_sequence(&t);
    }

    fn fail_all(&mut self, message: &str) {
        let turns: Vec<Turn> = self.active.drain(..).collect();
        for t in turns {
            self.emit(Event::TurnFailed {
                turn: t.id,
                message: message.to_string(),
            });
            if let Some(l) = self.loaded.as_mut() {
                l.backend.release_seq(t.seq);
            }
        }
    }
}
