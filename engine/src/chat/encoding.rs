//! Conversation -> prompt text, reproducing DeepSeek's April 2026 `encode_messages`
//! (spec §2). Pipeline: merge user/tool runs into user turns, order tool results by call
//! order, drop developer turns made stale by a later user turn, then render each turn and the
//! transition to the assistant.

use std::collections::HashMap;

use serde_json::Value;

use super::dsml;
use super::message::{Message, Role, ThinkingMode};
use super::pyjson;
use super::tokenizer::Tokenizer;
use super::ChatError;

pub(crate) const BOS: &str = "<｜begin▁of▁sentence｜>";
pub(crate) const EOS: &str = "<｜end▁of▁sentence｜>";
const USER: &str = "<｜User｜>";
const ASSISTANT: &str = "<｜Assistant｜>";
const LATEST_REMINDER: &str = "<｜latest_reminder｜>";
pub(crate) const THINK_START: &str = "<think>";
pub(crate) const THINK_END: &str = "</think>";
const EFFORT_MAX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";
const RESPONSE_FORMAT: &str =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/// Encoder switches beyond the thinking mode (the reference's keyword arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    pub mode: ThinkingMode,
    /// Drop reasoning of assistant turns before the last user turn (reference default: true;
    /// forced off when any message declares tools).
    pub drop_thinking: bool,
    /// Start with the BOS text (reference default: true).
    pub add_bos: bool,
}

impl EncodeOptions {
    pub fn new(mode: ThinkingMode) -> Self {
        Self {
            mode,
            drop_thinking: true,
            add_bos: true,
        }
    }
}

/// Renders `messages` to the prompt text with the reference defaults. When the last message
/// is a user/tool/developer message the text ends with the generation prompt
/// (`<｜Assistant｜><think>` or `<｜Assistant｜></think>`).
pub fn encode_messages(messages: &[Message], mode: ThinkingMode) -> String {
    encode_messages_with(messages, EncodeOptions::new(mode))
}

/// [`encode_messages`] then [`Tokenizer::encode`].
pub fn encode_to_ids(
    tokenizer: &Tokenizer,
    messages: &[Message],
    mode: ThinkingMode,
) -> Result<Vec<u32>, ChatError> {
    tokenizer.encode(&encode_messages(messages, mode))
}

/// A user turn is built from runs of user and tool messages.
enum Part<'a> {
    Text(String),
    ToolResult { call_id: &'a str, content: String },
}

/// A message after pre-merging: tool messages exist only as parts of user turns.
enum Turn<'a> {
    User(Vec<Part<'a>>),
    Other(&'a Message),
}

impl Turn<'_> {
    fn role(&self) -> Role {
        match self {
            Turn::User(_) => Role::User,
            Turn::Other(m) => m.role,
        }
    }
}

/// Encodes with explicit options.
pub fn encode_messages_with(messages: &[Message], opts: EncodeOptions) -> String {
    let thinking = opts.mode.is_thinking();
    let drop = opts.drop_thinking && !messages.iter().any(|m| !m.tools.is_empty());
    let mut turns = merge_user_runs(messages);
    sort_tool_results(&mut turns);
    if thinking && drop {
        turns = drop_stale_developer_turns(turns);
    }
    let ctx = RenderCtx {
        mode: opts.mode,
        drop,
        last_user: last_user_index(&turns),
    };
    let mut out = String::new();
    if opts.add_bos {
        out.push_str(BOS);
    }
    for (i, turn) in turns.iter().enumerate() {
        ctx.render_turn(&mut out, &turns, i, turn);
    }
    out
}

/// Pre-merge (spec §2.2 rule 1): every run of consecutive user/tool messages becomes one turn.
fn merge_user_runs(messages: &[Message]) -> Vec<Turn<'_>> {
    let mut turns: Vec<Turn<'_>> = Vec::with_capacity(messages.len());
    for msg in messages {
        let part = match msg.role {
            Role::User => Part::Text(msg.text()),
            Role::Tool => Part::ToolResult {
                call_id: msg.tool_call_id.as_deref().unwrap_or(""),
                content: msg.text(),
            },
            _ => {
                turns.push(Turn::Other(msg));
                continue;
            }
        };
        match turns.last_mut() {
            Some(Turn::User(parts)) => parts.push(part),
            _ => turns.push(Turn::User(vec![part])),
        }
    }
    turns
}

/// Within a user turn, tool results follow the call order of the latest assistant turn with
/// tool calls (ids not found sort first, as in the reference); text parts stay in place.
fn sort_tool_results(turns: &mut [Turn<'_>]) {
    let mut order: HashMap<&str, usize> = HashMap::new();
    for turn in turns.iter_mut() {
        match turn {
            Turn::Other(m) if m.role == Role::Assistant && !m.tool_calls.is_empty() => {
                order = m
                    .tool_calls
                    .iter()
                    .enumerate()
                    .filter_map(|(i, tc)| tc.id.as_deref().filter(|id| !id.is_empty()).zip(Some(i)))
                    .collect();
            }
            Turn::User(parts) => reorder_results(parts, &order),
            Turn::Other(_) => {}
        }
    }
}

fn reorder_results(parts: &mut [Part<'_>], order: &HashMap<&str, usize>) {
    let slots: Vec<usize> = (0..parts.len())
        .filter(|&i| matches!(parts[i], Part::ToolResult { .. }))
        .collect();
    if slots.len() < 2 || order.is_empty() {
        return;
    }
    let rank = |p: &Part<'_>| match p {
        Part::ToolResult { call_id, .. } => order.get(call_id).copied().unwrap_or(0),
        Part::Text(_) => 0,
    };
    let mut results: Vec<Part<'_>> = slots
        .iter()
        .map(|&i| std::mem::replace(&mut parts[i], Part::Text(String::new())))
        .collect();
    results.sort_by_key(|p| rank(p)); // stable, like Python's `sorted`
    for (slot, part) in slots.into_iter().zip(results) {
        parts[slot] = part;
    }
}

/// Index of the last user (or developer) turn.
fn last_user_index(turns: &[Turn<'_>]) -> Option<usize> {
    turns
        .iter()
        .rposition(|t| matches!(t.role(), Role::User | Role::Developer))
}

/// Thinking mode with dropping on: developer turns before the last user turn are removed.
/// (Reasoning of earlier assistant turns is dropped at render time by `RenderCtx`.)
fn drop_stale_developer_turns(turns: Vec<Turn<'_>>) -> Vec<Turn<'_>> {
    let Some(last_user) = last_user_index(&turns) else {
        return turns;
    };
    turns
        .into_iter()
        .enumerate()
        .filter(|(i, t)| *i >= last_user || t.role() != Role::Developer)
        .map(|(_, t)| t)
        .collect()
}

struct RenderCtx {
    mode: ThinkingMode,
    drop: bool,
    last_user: Option<usize>,
}

impl RenderCtx {
    fn render_turn(&self, out: &mut String, turns: &[Turn<'_>], i: usize, turn: &Turn<'_>) {
        if i == 0 && self.mode == ThinkingMode::Max {
            out.push_str(EFFORT_MAX);
        }
        match turn {
            Turn::User(parts) => render_user(out, parts),
            Turn::Other(m) => self.render_other(out, i, m),
        }
        let next_role = turns.get(i + 1).map(Turn::role);
        let ends_turn = matches!(
            next_role,
            None | Some(Role::Assistant) | Some(Role::LatestReminder)
        );
        if ends_turn && matches!(turn.role(), Role::User | Role::Developer) {
            out.push_str(ASSISTANT);
            out.push_str(if self.keeps_thinking(i, true) {
                THINK_START
            } else {
                THINK_END
            });
        }
    }

    /// Whether turn `i` is rendered in thinking form: always without dropping, otherwise only
    /// from the last user turn on (`inclusive`) or strictly after it.
    fn keeps_thinking(&self, i: usize, inclusive: bool) -> bool {
        if !self.mode.is_thinking() {
            return false;
        }
        if !self.drop {
            return true;
        }
        match self.last_user {
            None => true,
            Some(last) if inclusive => i >= last,
            Some(last) => i > last,
        }
    }

    fn render_other(&self, out: &mut String, i: usize, m: &Message) {
        match m.role {
            Role::System => {
                out.push_str(&m.text());
                push_declarations(out, m);
            }
            Role::Developer => {
                out.push_str(USER);
                out.push_str(&m.text());
                push_declarations(out, m);
            }
            Role::LatestReminder => {
                out.push_str(LATEST_REMINDER);
                out.push_str(&m.text());
            }
            Role::Assistant => self.render_assistant(out, i, m),
            // Merged into user turns by `merge_user_runs`.
            Role::User | Role::Tool => {}
        }
    }

    fn render_assistant(&self, out: &mut String, i: usize, m: &Message) {
        if self.keeps_thinking(i, false) {
            out.push_str(m.reasoning_content.as_deref().unwrap_or(""));
            out.push_str(THINK_END);
        }
        out.push_str(&m.text());
        if !m.tool_calls.is_empty() {
            out.push_str(&dsml::render_tool_calls(&m.tool_calls));
        }
        if !m.wo_eos {
            out.push_str(EOS);
        }
    }
}

fn render_user(out: &mut String, parts: &[Part<'_>]) {
    out.push_str(USER);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push_str("\n\n");
        }
        match part {
            Part::Text(text) => out.push_str(text),
            Part::ToolResult { content, .. } => {
                out.push_str("<tool_result>");
                out.push_str(content);
                out.push_str("</tool_result>");
            }
        }
    }
}

/// Tools block and response-format block of a system/developer message.
fn push_declarations(out: &mut String, m: &Message) {
    if !m.tools.is_empty() {
        out.push_str("\n\n");
        out.push_str(&dsml::render_tools(&m.tools));
    }
    if let Some(schema) = m.response_format.as_ref().filter(|v| py_truthy(v)) {
        out.push_str("\n\n");
        out.push_str(RESPONSE_FORMAT);
        out.push_str(&pyjson::dumps(schema));
    }
}

/// Python truthiness of a JSON value (the reference tests `if response_format:`).
fn py_truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}
