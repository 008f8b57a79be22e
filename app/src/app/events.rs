//! Engine events applied to the app's state; drained once per frame, never waited for.

use super::transient::{Banner, EngineStatus};
use super::ChatApp;
use crate::state::conversations::{ReplyStats, StoredMessage};
use dsv4_engine::api::{DeltaKind, Event, FinishReason, TurnId, TurnStats};

/// Upper bound per frame so a flood of deltas cannot stall drawing; the rest waits a frame.
const MAX_EVENTS_PER_FRAME: usize = 10_000;

/// A streaming reply is saved this often, so a crash or kill loses at most this much of it.
const PARTIAL_SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl ChatApp {
    pub(crate) fn drain_engine_events(&mut self) {
        for _ in 0..MAX_EVENTS_PER_FRAME {
            let Some(event) = self.link.try_recv() else {
                break;
            };
            self.on_event(event);
        }
        if self.link.is_disconnected() && self.engine.status != EngineStatus::Failed(gone()) {
            self.engine.status = EngineStatus::Failed(gone());
            self.end_active_turn(Some("The engine stopped.".into()), None);
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::LoadProgress {
                fraction,
                message,
                eta,
            } => {
                self.engine.status = EngineStatus::Loading {
                    fraction,
                    message,
                    eta,
                }
            }
            Event::Ready(info) => {
                self.engine.status = EngineStatus::Ready;
                self.engine.model = Some(info);
                self.engine.pending_reload.clear();
            }
            Event::Delta { turn, kind, text } => self.append_delta(turn, kind, &text),
            Event::ToolCall {
                turn,
                name,
                arguments_json,
            } => {
                let text = format!("\n\n```json\n// tool call: {name}\n{arguments_json}\n```\n");
                self.append_delta(turn, DeltaKind::Answer, &text);
            }
            Event::Progress { turn, stats } => {
                let mut save = None;
                if let Some(active) = self.engine.active.as_mut().filter(|a| a.turn == turn) {
                    active.live = Some(stats);
                    if active.last_partial_save.elapsed() >= PARTIAL_SAVE_EVERY {
                        active.last_partial_save = std::time::Instant::now();
                        save = Some(active.conversation);
                    }
                }
                if let Some(id) = save {
                    self.mark_dirty(id);
                }
            }
            Event::Finished {
                turn,
                reason,
                stats,
            } => self.finish_turn(turn, reason, &stats),
            Event::TurnFailed { turn, message } => self.fail_turn(turn, message),
            Event::Devices { gpus, note } => {
                self.engine.detected_gpus = gpus;
                self.engine.gpu_note = note;
            }
            Event::SettingsApplied { needs_reload } => {
                if needs_reload && self.engine.pending_reload.is_empty() {
                    self.engine.pending_reload.push("engine settings");
                }
            }
            Event::Fatal { message } => {
                self.view
                    .push_banner(Banner::error(format!("Engine error: {message}")));
                self.engine.status = EngineStatus::Failed(message.clone());
                self.end_active_turn(Some(format!("Failed: {message}")), None);
            }
        }
    }

    /// The message being streamed into, if `turn` is the running one.
    fn reply_of(&mut self, turn: TurnId) -> Option<&mut StoredMessage> {
        let active = self.engine.active.as_ref().filter(|a| a.turn == turn)?;
        self.store.get_mut(active.conversation)?.messages.last_mut()
    }

    fn append_delta(&mut self, turn: TurnId, kind: DeltaKind, text: &str) {
        let Some(reply) = self.reply_of(turn) else {
            return;
        };
        match kind {
            DeltaKind::Answer => reply.content.push_str(text),
            DeltaKind::Reasoning => reply
                .reasoning
                .get_or_insert_with(String::new)
                .push_str(text),
        }
    }

    fn finish_turn(&mut self, turn: TurnId, reason: FinishReason, stats: &TurnStats) {
        if self.engine.active.as_ref().is_none_or(|a| a.turn != turn) {
            return;
        }
        let note = match reason {
            FinishReason::EndOfSentence | FinishReason::StopString => None,
            FinishReason::MaxTokens => Some("Stopped at the reply length limit.".to_string()),
            FinishReason::ContextFull => Some("Stopped: the context is full.".to_string()),
            FinishReason::Cancelled => Some("Stopped.".to_string()),
        };
        self.end_active_turn(note, Some(ReplyStats::from(stats)));
    }

    fn fail_turn(&mut self, turn: TurnId, message: String) {
        if self.engine.active.as_ref().is_none_or(|a| a.turn != turn) {
            return;
        }
        self.view
            .push_banner(Banner::error(format!("The reply failed: {message}")));
        self.end_active_turn(Some(format!("Failed: {message}")), None);
    }

    /// Closes the running reply (if any) with a note and stats, and queues its save.
    pub(crate) fn end_active_turn(&mut self, note: Option<String>, stats: Option<ReplyStats>) {
        let Some(active) = self.engine.active.take() else {
            return;
        };
        if let Some(conversation) = self.store.get_mut(active.conversation) {
            if let Some(reply) = conversation.messages.last_mut() {
                reply.note = note;
                reply.stats = stats;
            }
            conversation.updated_unix = crate::state::now_unix();
            self.mark_dirty(active.conversation);
        }
    }
}

fn gone() -> String {
    "The engine thread has stopped.".to_string()
}
