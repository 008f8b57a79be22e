//! Output parsing on real token streams: ids -> detokenizer -> parser (spec §3).

use std::sync::OnceLock;

use dsv4_engine::chat::{
    ChatError, Detokenizer, OutputParser, ParseEvent, ThinkingMode, Tokenizer, ToolCall,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn tok() -> Result<&'static Tokenizer, ChatError> {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    if let Some(t) = TOK.get() {
        return Ok(t);
    }
    let t = Tokenizer::bundled()?;
    Ok(TOK.get_or_init(|| t))
}

/// Reasoning, answer and tool calls collected from a stream of events.
#[derive(Debug, Default, PartialEq)]
struct Parsed {
    reasoning: String,
    answer: String,
    calls: Vec<ToolCall>,
}

impl Parsed {
    fn add(&mut self, events: Vec<ParseEvent>) {
        for e in events {
            match e {
                ParseEvent::Reasoning(s) => self.reasoning.push_str(&s),
                ParseEvent::Answer(s) => self.answer.push_str(&s),
                ParseEvent::ToolCall(c) => self.calls.push(c),
            }
        }
    }
}

/// Encodes a completion and feeds it token by token, as the engine does.
fn run_ids(completion: &str, mode: ThinkingMode) -> Result<Parsed, ChatError> {
    let t = tok()?;
    let mut d = Detokenizer::new();
    let mut p = OutputParser::new(mode, t.special_ids());
    let mut out = Parsed::default();
    for id in t.encode(completion)? {
        let text = d.push(t, id);
        out.add(p.push_token(id, &text));
    }
    let rest = d.finish();
    out.add(p.push_text(&rest));
    out.add(p.finish());
    Ok(out)
}

/// Feeds text only, cut at the given byte positions.
fn run_text(completion: &str, cuts: &[usize], mode: ThinkingMode) -> Result<Parsed, ChatError> {
    let mut p = OutputParser::new(mode, tok()?.special_ids());
    let mut out = Parsed::default();
    let mut last = 0;
    for &c in cuts.iter().chain(std::iter::once(&completion.len())) {
        out.add(p.push_text(&completion[last..c]));
        last = c;
    }
    out.add(p.finish());
    Ok(out)
}

const EOS: &str = "<｜end▁of▁sentence｜>";
const BLOCK: &str = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\
    <｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n\
    <｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n\
    </｜DSML｜invoke>\n</｜DSML｜tool_calls>";

fn weather_call() -> ToolCall {
    ToolCall {
        name: "get_weather".into(),
        arguments_json: r#"{"city": "Paris", "days": 3}"#.into(),
    }
}

#[test]
fn spec_parsing_example() -> TestResult {
    let completion =
        format!("The user asks for 17*23. 17*23 = 391.</think>17 × 23 = **391**.{EOS}");
    let got = run_ids(&completion, ThinkingMode::High)?;
    assert_eq!(got.reasoning, "The user asks for 17*23. 17*23 = 391.");
    assert_eq!(got.answer, "17 × 23 = **391**.");
    assert!(got.calls.is_empty());
    Ok(())
}

#[test]
fn tool_call_after_reasoning() -> TestResult {
    let completion = format!("I should call get_weather.</think>{BLOCK}{EOS}");
    let got = run_ids(&completion, ThinkingMode::Max)?;
    assert_eq!(got.reasoning, "I should call get_weather.");
    assert_eq!(got.answer, "");
    assert_eq!(got.calls, vec![weather_call()]);
    Ok(())
}

#[test]
fn chat_mode_text_then_parallel_calls() -> TestResult {
    let two = BLOCK.replace(
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    );
    let completion = format!("Let me check <b>that</b>.{two}{EOS}");
    let got = run_ids(&completion, ThinkingMode::Off)?;
    assert_eq!(got.reasoning, "");
    assert_eq!(got.answer, "Let me check <b>that</b>.");
    let now = ToolCall {
        name: "now".into(),
        arguments_json: "{}".into(),
    };
    assert_eq!(got.calls, vec![weather_call(), now]);
    Ok(())
}

#[test]
fn think_end_is_matched_by_id_not_text() -> TestResult {
    let t = tok()?;
    // "</think>" spelled with ordinary BPE pieces inside reasoning must stay reasoning.
    let mut ids = t.encode("I could write </")?;
    ids.extend(t.encode("think")?);
    ids.extend(t.encode("> here.")?);
    ids.push(t.special_ids().think_end);
    ids.extend(t.encode("Answer.")?);
    ids.push(t.special_ids().eos);
    let mut d = Detokenizer::new();
    let mut p = OutputParser::new(ThinkingMode::High, t.special_ids());
    let mut out = Parsed::default();
    for id in ids {
        let text = d.push(t, id);
        out.add(p.push_token(id, &text));
    }
    out.add(p.finish());
    assert_eq!(out.reasoning, "I could write </think> here.");
    assert_eq!(out.answer, "Answer.");
    Ok(())
}

#[test]
fn any_two_way_text_split_gives_the_same_result() -> TestResult {
    let completion =
        format!("Reasoning with <tags> and\n\n.</think>Answer\n\n< not a block.{BLOCK}");
    let whole = run_text(&completion, &[], ThinkingMode::High)?;
    assert_eq!(whole.reasoning, "Reasoning with <tags> and\n\n.");
    assert_eq!(whole.answer, "Answer\n\n< not a block.");
    assert_eq!(whole.calls, vec![weather_call()]);
    let cuts: Vec<usize> = (1..completion.len())
        .filter(|&i| completion.is_char_boundary(i))
        .collect();
    for &c in &cuts {
        assert_eq!(
            run_text(&completion, &[c], ThinkingMode::High)?,
            whole,
            "cut at {c}"
        );
    }
    // And one char at a time.
    assert_eq!(run_text(&completion, &cuts, ThinkingMode::High)?, whole);
    Ok(())
}

#[test]
fn held_text_is_released_promptly() -> TestResult {
    let mut p = OutputParser::new(ThinkingMode::Off, tok()?.special_ids());
    assert_eq!(p.push_text("a <"), vec![ParseEvent::Answer("a ".into())]);
    assert_eq!(p.push_text("b"), vec![ParseEvent::Answer("<b".into())]);
    assert_eq!(p.push_text("\n\n"), vec![]);
    assert_eq!(p.push_text("x"), vec![ParseEvent::Answer("\n\nx".into())]);
    Ok(())
}

#[test]
fn malformed_or_truncated_blocks_become_answer_text() -> TestResult {
    let bad = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke nom=\"x\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    let got = run_ids(&format!("Hi.{bad}{EOS}"), ThinkingMode::Off)?;
    assert_eq!(got.answer, format!("Hi.{bad}"));
    assert!(got.calls.is_empty());

    let cut = &BLOCK[..BLOCK.len() - 10];
    let got = run_ids(&format!("Hi.{cut}"), ThinkingMode::Off)?;
    assert_eq!(got.answer, format!("Hi.{cut}"));
    assert!(got.calls.is_empty());
    Ok(())
}

#[test]
fn reasoning_cut_by_length_and_state_queries() -> TestResult {
    let t = tok()?;
    let mut p = OutputParser::new(ThinkingMode::High, t.special_ids());
    assert!(p.in_reasoning());
    let ev = p.push_token(t.special_ids().think_start, "<think>");
    assert!(ev.is_empty(), "a stray <think> is ignored");
    p.push_text("still thinking");
    assert!(p.in_reasoning());
    p.push_token(t.special_ids().think_end, "</think>");
    assert!(!p.in_reasoning());
    assert_eq!(p.tool_call_count(), 0);
    Ok(())
}
