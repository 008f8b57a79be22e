//! Encoder rules of spec §2 beyond the golden examples: merging, tool-result order,
//! reasoning dropping, developer/latest_reminder roles, effort, prefill.

use dsv4_engine::chat::{
    encode_messages, encode_messages_with, EncodeOptions, Message, Role, ThinkingMode,
};
use serde_json::json;

const BOS: &str = "<｜begin▁of▁sentence｜>";
const EOS: &str = "<｜end▁of▁sentence｜>";

fn msgs(v: serde_json::Value) -> Vec<Message> {
    serde_json::from_value(v).unwrap_or_default()
}

#[test]
fn consecutive_user_messages_merge() {
    let m = vec![Message::user("A"), Message::user("B")];
    assert_eq!(
        encode_messages(&m, ThinkingMode::Off),
        format!("{BOS}<｜User｜>A\n\nB<｜Assistant｜></think>")
    );
}

#[test]
fn tool_results_follow_call_order_and_absorb_next_user() {
    let m = msgs(json!([
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}}
        ]},
        {"role": "tool", "tool_call_id": "b", "content": "RB"},
        {"role": "tool", "tool_call_id": "a", "content": "RA"},
        {"role": "user", "content": "thanks"}
    ]));
    let got = encode_messages(&m, ThinkingMode::Off);
    let want = format!(
        "{BOS}<｜User｜>Q<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n\
         <｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n\
         <｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n\
         </｜DSML｜tool_calls>{EOS}\
         <｜User｜><tool_result>RA</tool_result>\n\n<tool_result>RB</tool_result>\n\nthanks<｜Assistant｜></think>"
    );
    assert_eq!(got, want);
}

#[test]
fn tool_calls_without_declared_tools_drop_reasoning() {
    // Spec §2.4 "Careful": the merged tool result is the last user turn, so the assistant
    // turn before it loses its reasoning and its transition is `</think>`.
    let m = msgs(json!([
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "", "reasoning_content": "R",
         "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "X"}
    ]));
    let got = encode_messages(&m, ThinkingMode::High);
    assert!(got.starts_with(&format!(
        "{BOS}<｜User｜>Q<｜Assistant｜></think>\n\n<｜DSML｜"
    )));
    assert!(got.ends_with("<｜User｜><tool_result>X</tool_result><｜Assistant｜><think>"));
    assert!(!got.contains('R'));
}

#[test]
fn assistant_last_keeps_reasoning_and_has_no_generation_prompt() {
    let m = vec![
        Message::user("Q"),
        Message::assistant("A", Some("R".into())),
    ];
    assert_eq!(
        encode_messages(&m, ThinkingMode::High),
        format!("{BOS}<｜User｜>Q<｜Assistant｜><think>R</think>A{EOS}")
    );
    assert_eq!(
        encode_messages(&m, ThinkingMode::Off),
        format!("{BOS}<｜User｜>Q<｜Assistant｜></think>A{EOS}")
    );
}

#[test]
fn drop_thinking_off_keeps_all_reasoning() {
    let m = vec![
        Message::user("Q1"),
        Message::assistant("A1", Some("R1".into())),
        Message::user("Q2"),
    ];
    let opts = EncodeOptions {
        drop_thinking: false,
        ..EncodeOptions::new(ThinkingMode::High)
    };
    assert_eq!(
        encode_messages_with(&m, opts),
        format!("{BOS}<｜User｜>Q1<｜Assistant｜><think>R1</think>A1{EOS}<｜User｜>Q2<｜Assistant｜><think>")
    );
    let no_bos = EncodeOptions {
        add_bos: false,
        ..EncodeOptions::new(ThinkingMode::Off)
    };
    assert!(encode_messages_with(&m, no_bos).starts_with("<｜User｜>Q1"));
}

#[test]
fn developer_turns_before_last_user_are_dropped_in_thinking_mode() {
    let m = vec![Message::new(Role::Developer, "D"), Message::user("Q")];
    assert_eq!(
        encode_messages(&m, ThinkingMode::High),
        format!("{BOS}<｜User｜>Q<｜Assistant｜><think>")
    );
    // Chat mode keeps it, rendered like a user turn (no transition: a user turn follows).
    assert_eq!(
        encode_messages(&m, ThinkingMode::Off),
        format!("{BOS}<｜User｜>D<｜User｜>Q<｜Assistant｜></think>")
    );
}

#[test]
fn latest_reminder_max_effort_response_format_and_prefill() {
    let mut sys = Message::system("S");
    sys.response_format = Some(json!({"type": "object", "b": 1.5, "a": "é"}));
    let mut prefill = Message::assistant("Sure,", None);
    prefill.wo_eos = true;
    let m = vec![
        sys,
        Message::new(Role::LatestReminder, "date: today"),
        Message::user("Q"),
        prefill,
    ];
    let got = encode_messages(&m, ThinkingMode::Max);
    let want = format!(
        "{BOS}Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
         You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
         Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n\
         S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n\
         {{\"type\": \"object\", \"b\": 1.5, \"a\": \"é\"}}\
         <｜latest_reminder｜>date: today<｜User｜>Q<｜Assistant｜><think></think>Sure,"
    );
    assert_eq!(got, want);
}

#[test]
fn empty_conversation_is_just_bos() {
    assert_eq!(encode_messages(&[], ThinkingMode::High), BOS);
}
