//! A stand-in engine thread that speaks the real command/event protocol with canned replies.
//!
//! The app runs on it until the real `dsv4_engine::handle` is linked, and the interaction tests
//! use it to drive the UI without a model: it answers `LoadModel` with progress then `Ready`,
//! `Submit` with streamed reasoning and answer deltas, `Progress` and `Finished`, and `Cancel`
//! with `Finished { Cancelled }`. It can be told to fail loads or turns.

use crate::engine_link::Waker;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use dsv4_engine::api::{
    ChatMessage, Command, DeltaKind, EngineSettings, Event, FinishReason, GpuStatus, ModelInfo,
    ModelSource, ThinkingMode, TurnId, TurnStats,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct FakeEngineOptions {
    /// Pause between streamed pieces (also how long a `Cancel` may wait to be noticed).
    pub token_delay: Duration,
    pub load_steps: usize,
    pub load_step_delay: Duration,
    /// `LoadModel` answers `Fatal { message }` instead of `Ready`.
    pub fail_load: Option<String>,
    /// `Submit` answers `TurnFailed { message }`.
    pub fail_turns: Option<String>,
    /// How many times the canned answer is repeated (longer replies for stop tests).
    pub answer_repeats: usize,
    /// GPUs reported in `ModelInfo` (none: the fake runs "on the CPU").
    pub gpus: Vec<GpuStatus>,
}

impl Default for FakeEngineOptions {
    fn default() -> Self {
        FakeEngineOptions {
            token_delay: Duration::from_millis(40),
            load_steps: 5,
            load_step_delay: Duration::from_millis(60),
            fail_load: None,
            fail_turns: None,
            answer_repeats: 1,
            gpus: Vec::new(),
        }
    }
}

/// Why the fake's loop should stop.
struct Shutdown;

struct FakeEngine {
    options: FakeEngineOptions,
    settings: EngineSettings,
    commands: Receiver<Command>,
    events: Sender<Event>,
    waker: Waker,
    /// Commands that arrived while a turn was streaming, handled after it.
    backlog: VecDeque<Command>,
}

/// Starts the fake engine thread; it ends on `Shutdown` or when the command sender is dropped.
pub fn spawn(
    options: FakeEngineOptions,
    settings: EngineSettings,
    waker: Waker,
) -> std::io::Result<(
    Sender<Command>,
    Receiver<Event>,
    std::thread::JoinHandle<()>,
)> {
    let (command_tx, command_rx) = crossbeam_channel::unbounded();
    let (event_tx, event_rx) = crossbeam_channel::unbounded();
    let mut engine = FakeEngine {
        options,
        settings,
        commands: command_rx,
        events: event_tx,
        waker,
        backlog: VecDeque::new(),
    };
    let thread = std::thread::Builder::new()
        .name("dsv4-fake-engine".into())
        .spawn(move || engine.run())?;
    Ok((command_tx, event_rx, thread))
}

impl FakeEngine {
    fn run(&mut self) {
        loop {
            let command = match self.backlog.pop_front() {
                Some(command) => command,
                None => match self.commands.recv() {
                    Ok(command) => command,
                    Err(_) => return,
                },
            };
            if self.handle(command).is_err() {
                return;
            }
        }
    }

    fn emit(&self, event: Event) -> Result<(), Shutdown> {
        self.events.send(event).map_err(|_| Shutdown)?;
        (self.waker)();
        Ok(())
    }

    fn handle(&mut self, command: Command) -> Result<(), Shutdown> {
        match command {
            Command::LoadModel(source) => self.load(source),
            Command::Submit {
                turn,
                messages,
                thinking,
                ..
            } => self.stream_turn(turn, &messages, thinking),
            // A cancel for a turn that is not running is a no-op, as in the real engine.
            Command::Cancel(_) => Ok(()),
            Command::UpdateSettings(new) => {
                let needs_reload =
                    !crate::state::validate::changes_needing_reload(&self.settings, &new)
                        .is_empty();
                self.settings = new;
                self.emit(Event::SettingsApplied { needs_reload })
            }
            Command::Shutdown => Err(Shutdown),
        }
    }

    fn load(&mut self, source: ModelSource) -> Result<(), Shutdown> {
        let steps = self.options.load_steps.max(1);
        for step in 0..steps {
            let left = self.options.load_step_delay * u32::try_from(steps - step).unwrap_or(1);
            self.emit(Event::LoadProgress {
                fraction: step as f32 / steps as f32,
                message: format!("Loading weights ({}/{steps})", step + 1),
                eta: Some(left),
            })?;
            self.pause(self.options.load_step_delay)?;
        }
        if let Some(message) = self.options.fail_load.clone() {
            return self.emit(Event::Fatal { message });
        }
        let info = self.model_info(source);
        self.emit(Event::Ready(info))
    }

    fn model_info(&self, source: ModelSource) -> ModelInfo {
        // Only the demo is labelled as noise; for a folder the backend name says "fake".
        let is_demo = source == ModelSource::Demo;
        let name = match &source {
            ModelSource::Demo => "Demo model".to_string(),
            ModelSource::Dir(dir) => dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| dir.display().to_string()),
        };
        ModelInfo {
            name,
            source,
            is_demo,
            backend: "fake engine (canned replies)".into(),
            numerics: self.settings.numerics,
            layers: 4,
            vocab_size: 1024,
            context_limit: self.settings.max_context,
            gpus: self.options.gpus.clone(),
        }
    }

    /// Sleeps, but keeps non-cancel commands for later and stops on shutdown.
    fn pause(&mut self, delay: Duration) -> Result<Option<TurnId>, Shutdown> {
        match self.commands.recv_timeout(delay) {
            Ok(Command::Cancel(turn)) => Ok(Some(turn)),
            Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => Err(Shutdown),
            Ok(other) => {
                self.backlog.push_back(other);
                Ok(None)
            }
            Err(RecvTimeoutError::Timeout) => Ok(None),
        }
    }

    fn stream_turn(
        &mut self,
        turn: TurnId,
        messages: &[ChatMessage],
        thinking: ThinkingMode,
    ) -> Result<(), Shutdown> {
        if let Some(message) = self.options.fail_turns.clone() {
            return self.emit(Event::TurnFailed { turn, message });
        }
        let prompt_tokens: usize = messages
            .iter()
            .map(|m| m.content.split_whitespace().count() + 4)
            .sum();
        let mut stats = TurnStats {
            prompt_tokens,
            context_used: prompt_tokens,
            context_limit: self.settings.max_context,
            ..TurnStats::default()
        };
        let started = Instant::now();
        let last_user = messages
            .iter()
            .rev()
            .find(|m| m.role == dsv4_engine::api::Role::User);
        let question = last_user.map(|m| m.content.as_str()).unwrap_or("");
        for (kind, piece) in canned_pieces(question, thinking, self.options.answer_repeats) {
            if self.pause(self.options.token_delay)? == Some(turn) {
                return self.emit(Event::Finished {
                    turn,
                    reason: FinishReason::Cancelled,
                    stats,
                });
            }
            self.emit(Event::Delta {
                turn,
                kind,
                text: piece,
            })?;
            update_stats(&mut stats, started);
            self.emit(Event::Progress {
                turn,
                stats: stats.clone(),
            })?;
        }
        self.emit(Event::Finished {
            turn,
            reason: FinishReason::EndOfSentence,
            stats,
        })
    }
}

fn update_stats(stats: &mut TurnStats, started: Instant) {
    if stats.generated_tokens == 0 {
        stats.time_to_first_token = started.elapsed();
        let prefill_secs = stats.time_to_first_token.as_secs_f64().max(1e-6);
        stats.prefill_tok_s = stats.prompt_tokens as f64 / prefill_secs;
    }
    stats.generated_tokens += 1;
    stats.context_used += 1;
    let decode_secs = (started.elapsed() - stats.time_to_first_token).as_secs_f64();
    if stats.generated_tokens > 1 && decode_secs > 0.0 {
        stats.decode_tok_s = (stats.generated_tokens - 1) as f64 / decode_secs;
    }
}

/// The canned reply, split into word-sized pieces like a detokenizer would stream them.
fn canned_pieces(
    question: &str,
    thinking: ThinkingMode,
    repeats: usize,
) -> Vec<(DeltaKind, String)> {
    let topic: String = question
        .split_whitespace()
        .take(8)
        .collect::<Vec<_>>()
        .join(" ");
    let mut pieces = Vec::new();
    if thinking != ThinkingMode::Off {
        let reasoning = format!("The user wrote \"{topic}\". This is the fake engine, so I will answer with a fixed demo reply.");
        pieces.extend(split_words(&reasoning).map(|w| (DeltaKind::Reasoning, w)));
    }
    let answer = format!(
        "This is a **demo reply** from the fake engine (no model is linked yet) to: *{topic}*\n\n\
         - replies stream in piece by piece\n- they are rendered as Markdown\n\n\
         ```rust\nfn main() {{\n    println!(\"hello\");\n}}\n```\n"
    );
    for _ in 0..repeats.max(1) {
        pieces.extend(split_words(&answer).map(|w| (DeltaKind::Answer, w)));
    }
    pieces
}

/// Splits text into pieces that each keep their trailing whitespace, so joining restores it.
fn split_words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split_inclusive(char::is_whitespace)
        .map(str::to_string)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "fake_engine_tests.rs"]
mod tests;
