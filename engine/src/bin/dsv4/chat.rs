//! `dsv4 chat` and `dsv4 generate`: the terminal front end over the same engine thread the app
//! uses, streaming replies with the reasoning dimmed.

use dsv4_engine::api::{
    ChatMessage, Command, DeltaKind, EngineSettings, Event, ModelSource, Numerics, Role,
    SamplingParams, ThinkingMode, TurnStats,
};
use dsv4_engine::handle::{spawn, EngineHandle};
use std::io::{BufRead, Write};
use std::sync::Arc;

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

pub struct ChatOptions {
    pub model: Option<std::path::PathBuf>,
    pub numerics: Numerics,
    pub sampling: SamplingParams,
    pub thinking: ThinkingMode,
    pub system: Option<String>,
}

fn start(opts: &ChatOptions) -> anyhow::Result<EngineHandle> {
    let settings = EngineSettings {
        numerics: opts.numerics,
        ..EngineSettings::default()
    };
    let h = spawn(settings, Arc::new(|| {}))?;
    let source = match &opts.model {
        Some(dir) => ModelSource::Dir(dir.clone()),
        None => ModelSource::Demo,
    };
    h.send(Command::LoadModel(source));
    loop {
        match h.events.recv()? {
            Event::LoadProgress { message, .. } => eprintln!("{DIM}{message}{RESET}"),
            Event::Ready(info) => {
                eprintln!(
                    "{DIM}{} · {} · {} layers{RESET}",
                    info.name, info.backend, info.layers
                );
                if info.is_demo {
                    eprintln!("Note: the demo model has random weights; its replies are noise.");
                }
                return Ok(h);
            }
            Event::Fatal { message } => anyhow::bail!(message),
            _ => {}
        }
    }
}

/// Streams one turn to stdout; returns the answer, the reasoning and the statistics.
fn run_turn(
    h: &EngineHandle,
    id: u64,
    messages: Vec<ChatMessage>,
    opts: &ChatOptions,
) -> anyhow::Result<(String, String, TurnStats)> {
    h.send(Command::Submit {
        turn: id,
        conversation: 1,
        messages,
        sampling: opts.sampling.clone(),
        thinking: opts.thinking,
    });
    let (mut answer, mut reasoning) = (String::new(), String::new());
    let mut out = std::io::stdout();
    loop {
        match h.events.recv()? {
            Event::Delta {
                kind: DeltaKind::Reasoning,
                text,
                ..
            } => {
                write!(out, "{DIM}{text}{RESET}")?;
                reasoning.push_str(&text);
            }
            Event::Delta {
                kind: DeltaKind::Answer,
                text,
                ..
            } => {
                if answer.is_empty() && !reasoning.is_empty() {
                    writeln!(out)?;
                }
                write!(out, "{text}")?;
                answer.push_str(&text);
            }
            Event::ToolCall {
                name,
                arguments_json,
                ..
            } => writeln!(out, "\n[tool call] {name}({arguments_json})")?,
            Event::Finished { reason, stats, .. } => {
                writeln!(out)?;
                eprintln!(
                    "{DIM}[{reason:?}] {} prompt tokens ({} cached), {} generated · TTFT {:.0} ms · prefill {:.1} tok/s · decode {:.1} tok/s{RESET}",
                    stats.prompt_tokens,
                    stats.cached_prompt_tokens,
                    stats.generated_tokens,
                    stats.time_to_first_token.as_secs_f64() * 1000.0,
                    stats.prefill_tok_s,
                    stats.decode_tok_s
                );
                return Ok((answer, reasoning, stats));
            }
            Event::TurnFailed { message, .. } | Event::Fatal { message } => anyhow::bail!(message),
            _ => {}
        }
        out.flush()?;
    }
}

fn base_messages(opts: &ChatOptions) -> Vec<ChatMessage> {
    opts.system
        .iter()
        .map(|s| ChatMessage {
            role: Role::System,
            content: s.clone(),
            reasoning: None,
        })
        .collect()
}

/// One prompt, one reply.
pub fn generate(opts: &ChatOptions, prompt: &str) -> anyhow::Result<()> {
    let h = start(opts)?;
    let mut messages = base_messages(opts);
    messages.push(ChatMessage {
        role: Role::User,
        content: prompt.into(),
        reasoning: None,
    });
    run_turn(&h, 1, messages, opts)?;
    Ok(())
}

/// An interactive conversation on stdin; `/reset` starts over, an empty line or EOF quits.
pub fn chat(opts: &ChatOptions) -> anyhow::Result<()> {
    let h = start(opts)?;
    let mut messages = base_messages(opts);
    let stdin = std::io::stdin();
    let mut turn = 0;
    loop {
        eprint!("\n> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        if line.trim() == "/reset" {
            messages = base_messages(opts);
            continue;
        }
        messages.push(ChatMessage {
            role: Role::User,
            content: line.trim_end().into(),
            reasoning: None,
        });
        turn += 1;
        let (answer, reasoning, _) = run_turn(&h, turn, messages.clone(), opts)?;
        let reasoning = (!reasoning.is_empty()).then_some(reasoning);
        messages.push(ChatMessage {
            role: Role::Assistant,
            content: answer,
            reasoning,
        });
    }
}
