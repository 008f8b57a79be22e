//! Driving the engine thread from tests: a small model with the real vocabulary, a handle,
//! and helpers that collect a turn's events.

use dsv4_engine::api::{
    ChatMessage, Command, EngineSettings, Event, ModelSource, Role, SamplingParams, ThinkingMode,
};
use dsv4_engine::handle::{spawn, EngineHandle};
use dsv4_engine::model::synth::{write_checkpoint, SynthSpec};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A small random model with the real tokenizer's vocabulary, written once per test process.
pub fn small_real_vocab_model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("dsv4-engine-test-model-{}", std::process::id()));
        let mut spec = SynthSpec::tiny_default().with_vocab(129_280);
        spec.hidden_size = 128;
        spec.num_hidden_layers = 3;
        spec.compress_ratios = vec![0, 4, 8, 0];
        spec.num_hash_layers = 1;
        spec.sliding_window = 8;
        spec.index_topk = 2;
        spec.seed = 5;
        write_checkpoint(&dir, &spec).expect("write test model");
        dir
    })
    .clone()
}

/// An engine with the small model loaded.
pub fn engine_with(settings: EngineSettings) -> EngineHandle {
    let h = spawn(settings, Arc::new(|| {})).expect("spawn engine");
    h.send(Command::LoadModel(ModelSource::Dir(
        small_real_vocab_model(),
    )));
    loop {
        match next_event(&h) {
            Event::Ready(_) => return h,
            Event::Fatal { message } => panic!("load failed: {message}"),
            _ => {}
        }
    }
}

pub fn next_event(h: &EngineHandle) -> Event {
    h.events
        .recv_timeout(Duration::from_secs(120))
        .expect("engine event within 120 s")
}

pub fn user(text: &str) -> ChatMessage {
    ChatMessage {
        role: Role::User,
        content: text.into(),
        reasoning: None,
    }
}

pub fn greedy(max_tokens: u32) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    }
}

pub fn submit(
    h: &EngineHandle,
    turn: u64,
    conversation: u64,
    messages: Vec<ChatMessage>,
    sampling: SamplingParams,
) {
    h.send(Command::Submit {
        turn,
        conversation,
        messages,
        sampling,
        thinking: ThinkingMode::Off,
    });
}

/// What one turn produced.
#[derive(Debug, Default, Clone)]
pub struct TurnResult {
    pub answer: String,
    pub reasoning: String,
    pub finished: Option<(dsv4_engine::api::FinishReason, dsv4_engine::api::TurnStats)>,
    pub failed: Option<String>,
    pub progress_events: usize,
}

/// Collects events until every listed turn has finished or failed.
pub fn collect(h: &EngineHandle, turns: &[u64]) -> std::collections::HashMap<u64, TurnResult> {
    let mut out: std::collections::HashMap<u64, TurnResult> =
        turns.iter().map(|&t| (t, TurnResult::default())).collect();
    let done = |o: &std::collections::HashMap<u64, TurnResult>| {
        o.values()
            .all(|r| r.finished.is_some() || r.failed.is_some())
    };
    while !done(&out) {
        match next_event(h) {
            Event::Delta { turn, kind, text } => {
                let r = out.entry(turn).or_default();
                match kind {
                    dsv4_engine::api::DeltaKind::Answer => r.answer.push_str(&text),
                    dsv4_engine::api::DeltaKind::Reasoning => r.reasoning.push_str(&text),
                }
            }
            Event::Finished {
                turn,
                reason,
                stats,
            } => out.entry(turn).or_default().finished = Some((reason, stats)),
            Event::TurnFailed { turn, message } => {
                out.entry(turn).or_default().failed = Some(message)
            }
            Event::Progress { turn, .. } => out.entry(turn).or_default().progress_events += 1,
            Event::Fatal { message } => panic!("fatal: {message}"),
            _ => {}
        }
    }
    out
}
