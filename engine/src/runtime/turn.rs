//! One turn in flight: its prompt, prefill progress, sampler, detokenizer, output parser, stop
//! strings and timing.

use crate::api::{DeltaKind, Event, FinishReason, ThinkingMode, TurnId, TurnStats};
use crate::backend::{SeqId, SnapshotId};
use crate::chat::{Detokenizer, OutputParser, ParseEvent, Tokenizer};
use crate::sampler::{Draw, Sampler, StopChecker};
use std::time::{Duration, Instant};

/// Tokens before the end of the prompt where an extra snapshot is taken: re-encoding a
/// conversation in thinking mode changes the generation-prompt tail, so the snapshot at the
/// very end is often not inside the next prompt's common prefix.
pub const TAIL_SNAPSHOT: usize = 1;

pub struct Turn {
    pub id: TurnId,
    pub conversation: u64,
    pub seq: SeqId,
    /// Whether `seq` belongs to the conversation's cache (else it is released at the end).
    pub owns_cache: bool,
    pub prompt: Vec<u32>,
    /// Prompt tokens already in the sequence state.
    pub fed: usize,
    /// Prompt tokens that came from the conversation cache.
    pub reused: usize,
    /// Tokens in the sequence state (reused + fed prompt + fed generated), for the cache.
    pub state_tokens: Vec<u32>,
    pub snapshots: Vec<(usize, SnapshotId)>,
    pub generated: Vec<u32>,
    /// Sampled but not yet fed to the model.
    pub pending: Option<u32>,
    sampler: Sampler,
    stop: StopChecker,
    detok: Detokenizer,
    parser: OutputParser,
    max_tokens: usize,
    pub cancelled: bool,
    timing: Timing,
}

struct Timing {
    submitted: Instant,
    prefill_started: Option<Instant>,
    prefill_done: Option<Instant>,
    first_token: Option<Instant>,
    last_progress: Instant,
}

/// What feeding one sampled token led to.
pub enum TokenOutcome {
    Continue,
    Finished(FinishReason),
}

impl Turn {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: TurnId,
        conversation: u64,
        seq: SeqId,
        prompt: Vec<u32>,
        sampler: Sampler,
        thinking: ThinkingMode,
        tokenizer: &Tokenizer,
        max_tokens: usize,
    ) -> Self {
        let stop = sampler.stop_checker();
        let now = Instant::now();
        Turn {
            id,
            conversation,
            seq,
            owns_cache: false,
            prompt,
            fed: 0,
            reused: 0,
            state_tokens: Vec::new(),
            snapshots: Vec::new(),
            generated: Vec::new(),
            pending: None,
            sampler,
            stop,
            detok: Detokenizer::new(),
            parser: OutputParser::new(thinking, tokenizer.special_ids()),
            max_tokens,
            cancelled: false,
            timing: Timing {
                submitted: now,
                prefill_started: None,
                prefill_done: None,
                first_token: None,
                last_progress: now,
            },
        }
    }

    pub fn prefilling(&self) -> bool {
        self.fed < self.prompt.len()
    }

    /// The next prefill chunk, at most `budget` tokens, ending at the tail-snapshot point when
    /// that lies ahead so a snapshot can be taken there.
    pub fn next_chunk(&mut self, budget: usize) -> &[u32] {
        self.timing.prefill_started.get_or_insert_with(Instant::now);
        let tail = self.prompt.len().saturating_sub(TAIL_SNAPSHOT);
        let mut end = (self.fed + budget).min(self.prompt.len());
        if self.fed < tail && end > tail {
            end = tail;
        }
        &self.prompt[self.fed..end]
    }

    /// Records that `n` prompt tokens were fed; returns whether a snapshot is due here.
    pub fn prompt_fed(&mut self, n: usize) -> bool {
        let start = self.fed;
        self.fed += n;
        self.state_tokens
            .extend_from_slice(&self.prompt[start..self.fed]);
        if !self.prefilling() {
            self.timing.prefill_done = Some(Instant::now());
        }
        self.fed == self.prompt.len() || self.fed == self.prompt.len().saturating_sub(TAIL_SNAPSHOT)
    }

    /// The pending token was fed to the model.
    pub fn pending_fed(&mut self) {
        if let Some(t) = self.pending.take() {
            self.state_tokens.push(t);
        }
    }

    /// The draw for the token after feeding `fed_now` more tokens: the sampler's next one when
    /// a token will be chosen then (a decode step, or the prompt's last chunk), else greedy (the
    /// result is ignored and the random stream is left untouched).
    pub fn draw_after(&mut self, fed_now: usize) -> Draw {
        if self.pending.is_some() || self.fed + fed_now >= self.prompt.len() {
            self.sampler.draw()
        } else {
            Draw::GREEDY
        }
    }

    /// Handles a newly sampled token: streams its text as events, checks the stop conditions.
    /// Stop strings apply to the answer only (reasoning is never cut).
    pub fn accept(
        &mut self,
        tok: u32,
        tokenizer: &Tokenizer,
        eos: u32,
        out: &mut Vec<Event>,
    ) -> TokenOutcome {
        self.timing.first_token.get_or_insert_with(Instant::now);
        self.generated.push(tok);
        if tok == eos {
            return TokenOutcome::Finished(FinishReason::EndOfSentence);
        }
        let text = self.detok.push(tokenizer, tok);
        let events = self.parser.push_token(tok, &text);
        if self.emit(events, out) {
            return TokenOutcome::Finished(FinishReason::StopString);
        }
        if self.generated.len() >= self.max_tokens {
            return TokenOutcome::Finished(FinishReason::MaxTokens);
        }
        self.pending = Some(tok);
        TokenOutcome::Continue
    }

    /// Flushes held-back text at the end of the turn (unless a stop string ended it).
    pub fn flush(&mut self, reason: FinishReason, out: &mut Vec<Event>) {
        if reason == FinishReason::StopString {
            return;
        }
        let rest = self.detok.finish();
        let mut events = self.parser.push_text(&rest);
        events.extend(self.parser.finish());
        self.emit(events, out);
        let tail = self.stop.finish();
        if !tail.is_empty() {
            out.push(Event::Delta {
                turn: self.id,
                kind: DeltaKind::Answer,
                text: tail,
            });
        }
    }

    /// Turns parser events into engine events; answer text goes through the stop strings.
    /// Returns whether a stop string was hit.
    fn emit(&mut self, events: Vec<ParseEvent>, out: &mut Vec<Event>) -> bool {
        for e in events {
            let event = match e {
                ParseEvent::Reasoning(text) => Event::Delta {
                    turn: self.id,
                    kind: DeltaKind::Reasoning,
                    text,
                },
                ParseEvent::Answer(text) => {
                    let outcome = self.stop.push(&text);
                    if !outcome.emit.is_empty() {
                        out.push(Event::Delta {
                            turn: self.id,
                            kind: DeltaKind::Answer,
                            text: outcome.emit,
                        });
                    }
                    if outcome.stopped {
                        return true;
                    }
                    continue;
                }
                ParseEvent::ToolCall(call) => Event::ToolCall {
                    turn: self.id,
                    name: call.name,
                    arguments_json: call.arguments_json,
                },
            };
            out.push(event);
        }
        false
    }

    /// A live progress event when the last one is older than `every`.
    pub fn progress_due(&mut self, every: Duration, context_limit: usize) -> Option<Event> {
        if self.prefilling() || self.timing.last_progress.elapsed() < every {
            return None;
        }
        self.timing.last_progress = Instant::now();
        Some(Event::Progress {
            turn: self.id,
            stats: self.stats(context_limit),
        })
    }

    pub fn stats(&self, context_limit: usize) -> TurnStats {
        let t = &self.timing;
        let prefilled = self.prompt.len() - self.reused;
        let prefill_secs = match (t.prefill_started, t.prefill_done) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let decode_secs = t
            .first_token
            .map(|f| f.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        let decoded = self.generated.len().saturating_sub(1);
        TurnStats {
            prompt_tokens: self.prompt.len(),
            cached_prompt_tokens: self.reused,
            generated_tokens: self.generated.len(),
            time_to_first_token: t
                .first_token
                .map(|f| f.duration_since(t.submitted))
                .unwrap_or_default(),
            prefill_tok_s: rate(prefilled, prefill_secs),
            decode_tok_s: rate(decoded, decode_secs),
            context_used: self.state_tokens.len() + usize::from(self.pending.is_some()),
            context_limit,
        }
    }
}

fn rate(tokens: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        tokens as f64 / secs
    } else {
        0.0
    }
}
