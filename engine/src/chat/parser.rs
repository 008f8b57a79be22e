//! Streaming output parser (spec §3.4): reasoning vs answer, and DSML tool-call blocks.
//!
//! The engine feeds every generated token as `(id, text)` with [`OutputParser::push_token`]:
//! `</think>` is one id (128822) and is matched by id, so reasoning that merely mentions the
//! string is not cut. The tool-call opener spans 6-7 tokens, so it is matched on text: answer
//! text that could be the start of `\n\n<｜DSML｜tool_calls>` is held back until it is
//! disambiguated. A text-only stream can use [`OutputParser::push_text`], which also matches
//! `</think>` on text. Malformed model output never fails: an unparsable block is shown as
//! answer text.

use super::dsml::{self, ToolCall, BLOCK_CLOSE, BLOCK_OPEN};
use super::encoding::THINK_END;
use super::holdback::partial_suffix_len;
use super::message::ThinkingMode;
use super::tokenizer::SpecialIds;

/// A piece of parsed output, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseEvent {
    Reasoning(String),
    Answer(String),
    ToolCall(ToolCall),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Reasoning,
    Answer,
    /// Inside a tool-call block; `held` has the raw text from the `\n\n` before the opener.
    ToolBlock,
}

/// The `"\n\n"` the model writes before a block belongs to the markup, not to the answer.
const BLOCK_LEAD: &str = "\n\n";

/// Parser state for one generated reply.
#[derive(Debug, Clone)]
pub struct OutputParser {
    ids: SpecialIds,
    phase: Phase,
    /// Text received but not yet emitted (possible marker prefix, or a tool block).
    held: String,
    tool_calls: usize,
}

impl OutputParser {
    /// `mode` must be the one the prompt was encoded with: thinking modes start in reasoning
    /// because the prompt ends with `<think>`.
    pub fn new(mode: ThinkingMode, ids: SpecialIds) -> Self {
        let phase = if mode.is_thinking() {
            Phase::Reasoning
        } else {
            Phase::Answer
        };
        Self {
            ids,
            phase,
            held: String::new(),
            tool_calls: 0,
        }
    }

    /// True while the model is still reasoning (a length stop here means no answer yet).
    pub fn in_reasoning(&self) -> bool {
        self.phase == Phase::Reasoning
    }

    /// Number of tool calls parsed so far (finish reason "tool_calls" when > 0).
    pub fn tool_call_count(&self) -> usize {
        self.tool_calls
    }

    /// Feeds one generated token and the text the detokenizer released for it.
    pub fn push_token(&mut self, id: u32, text: &str) -> Vec<ParseEvent> {
        let mut events = Vec::new();
        let ids = self.ids;
        if id == ids.think_end {
            if self.phase == Phase::Reasoning {
                self.flush_held(&mut events);
                self.phase = Phase::Answer;
            }
            // A `</think>` after the reasoning is a control token out of place: not shown.
        } else if id == ids.think_start || id == ids.eos || id == ids.bos {
            // `<think>` belongs to the prompt (a stray one is ignored); EOS/BOS carry no text.
        } else {
            self.feed(text, false, &mut events);
        }
        events
    }

    /// Feeds text with no token ids: `</think>` is then recognised as text.
    pub fn push_text(&mut self, text: &str) -> Vec<ParseEvent> {
        let mut events = Vec::new();
        self.feed(text, true, &mut events);
        events
    }

    /// End of generation: releases held text. An unterminated tool block is shown as text.
    pub fn finish(&mut self) -> Vec<ParseEvent> {
        let mut events = Vec::new();
        self.flush_held(&mut events);
        events
    }

    fn flush_held(&mut self, events: &mut Vec<ParseEvent>) {
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Reasoning => push_reasoning(events, held),
            Phase::Answer => push_answer(events, held),
            Phase::ToolBlock => {
                push_answer(events, held);
                self.phase = Phase::Answer;
            }
        }
    }

    fn feed(&mut self, text: &str, think_end_as_text: bool, events: &mut Vec<ParseEvent>) {
        self.held.push_str(text);
        loop {
            let progressed = match self.phase {
                Phase::Reasoning if think_end_as_text => self.scan_reasoning(events),
                Phase::Reasoning => {
                    let held = std::mem::take(&mut self.held);
                    push_reasoning(events, held);
                    false
                }
                Phase::Answer => self.scan_answer(events),
                Phase::ToolBlock => self.scan_block(events),
            };
            if !progressed {
                break;
            }
        }
    }

    /// Text mode reasoning: split at a textual `</think>`. Returns true on a phase change.
    fn scan_reasoning(&mut self, events: &mut Vec<ParseEvent>) -> bool {
        if let Some(pos) = self.held.find(THINK_END) {
            let rest = self.held.split_off(pos);
            push_reasoning(events, std::mem::take(&mut self.held));
            self.held = rest[THINK_END.len()..].to_string();
            self.phase = Phase::Answer;
            return true;
        }
        let keep = partial_suffix_len(&self.held, &[THINK_END]);
        let tail = self.held.split_off(self.held.len() - keep);
        push_reasoning(events, std::mem::replace(&mut self.held, tail));
        false
    }

    /// Answer: emit text up to a possible block opener; enter the block when it is complete.
    fn scan_answer(&mut self, events: &mut Vec<ParseEvent>) -> bool {
        if let Some(pos) = self.held.find(BLOCK_OPEN) {
            let start = if self.held[..pos].ends_with(BLOCK_LEAD) {
                pos - BLOCK_LEAD.len()
            } else {
                pos
            };
            let block = self.held.split_off(start);
            push_answer(events, std::mem::replace(&mut self.held, block));
            self.phase = Phase::ToolBlock;
            return true;
        }
        let lead_open = format!("{BLOCK_LEAD}{BLOCK_OPEN}");
        let keep = partial_suffix_len(&self.held, &[&lead_open, BLOCK_OPEN]);
        let tail = self.held.split_off(self.held.len() - keep);
        push_answer(events, std::mem::replace(&mut self.held, tail));
        false
    }

    /// Tool block: wait for the closer, then parse. Returns true when the block ended.
    fn scan_block(&mut self, events: &mut Vec<ParseEvent>) -> bool {
        let Some(open_at) = self.held.find(BLOCK_OPEN) else {
            return false; // unreachable by construction; wait for more text
        };
        let body_at = open_at + BLOCK_OPEN.len();
        let Some(close_rel) = self.held[body_at..].find(BLOCK_CLOSE) else {
            return false;
        };
        let end = body_at + close_rel + BLOCK_CLOSE.len();
        let rest = self.held.split_off(end);
        let raw = std::mem::replace(&mut self.held, rest);
        match dsml::parse_block(&raw[body_at..body_at + close_rel]) {
            Some(calls) => {
                self.tool_calls += calls.len();
                events.extend(calls.into_iter().map(ParseEvent::ToolCall));
            }
            None => push_answer(events, raw),
        }
        self.phase = Phase::Answer;
        true
    }
}

fn push_reasoning(events: &mut Vec<ParseEvent>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(ParseEvent::Reasoning(prev)) = events.last_mut() {
        prev.push_str(&text);
    } else {
        events.push(ParseEvent::Reasoning(text));
    }
}

fn push_answer(events: &mut Vec<ParseEvent>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(ParseEvent::Answer(prev)) = events.last_mut() {
        prev.push_str(&text);
    } else {
        events.push(ParseEvent::Answer(text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Rng;

    const IDS: SpecialIds = SpecialIds {
        bos: 0,
        eos: 1,
        user: 128803,
        assistant: 128804,
        think_start: 128821,
        think_end: 128822,
        dsml: 128825,
    };

    const FRAGMENTS: &[&str] = &[
        "<｜DSML｜",
        "tool_calls>",
        "</｜DSML｜tool_calls>",
        "invoke name=\"f\">",
        "parameter name=\"k\" string=\"true\">",
        "parameter name=\"n\" string=\"false\">",
        "</｜DSML｜parameter>",
        "</｜DSML｜invoke>",
        "\n",
        "\n\n",
        "<",
        "</",
        "\"",
        ">",
        "x",
        "é日",
        "</think>",
        "{",
    ];

    /// Random markup soup, split at random char boundaries: the parser must never panic, and
    /// without a parsed tool call the answer must be the input, byte for byte.
    #[test]
    fn random_markup_never_panics_and_loses_nothing() {
        let mut rng = Rng::from_seed(99);
        let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
        for _ in 0..3000 {
            let len = 1 + pick(12);
            let text: String = (0..len).map(|_| FRAGMENTS[pick(FRAGMENTS.len())]).collect();
            let bounds: Vec<usize> = (1..text.len())
                .filter(|&i| text.is_char_boundary(i) && pick(3) == 0)
                .collect();
            let mut p = OutputParser::new(ThinkingMode::Off, IDS);
            let mut events = Vec::new();
            let mut last = 0;
            for &b in bounds.iter().chain(std::iter::once(&text.len())) {
                events.extend(p.push_text(&text[last..b]));
                last = b;
            }
            events.extend(p.finish());
            let mut answer = String::new();
            let mut calls = 0;
            for e in events {
                match e {
                    ParseEvent::Answer(s) => answer.push_str(&s),
                    ParseEvent::ToolCall(_) => calls += 1,
                    ParseEvent::Reasoning(s) => panic!("reasoning in chat mode: {s:?}"),
                }
            }
            if calls == 0 {
                assert_eq!(answer, text);
            }
        }
    }
}
