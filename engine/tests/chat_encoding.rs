//! Golden test: every case of `tests/data/chat-encoding-examples.json` (copied from the spec)
//! must render to the same text and the same ids as DeepSeek's reference encoder.

use std::path::PathBuf;

use dsv4_engine::chat::{encode_cases, encode_messages, Message, ThinkingMode, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<Message>,
    thinking: ThinkingMode,
    rendered: String,
    ids: Vec<u32>,
}

fn examples_text() -> Result<String, std::io::Error> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/chat-encoding-examples.json");
    std::fs::read_to_string(path)
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn examples_render_and_tokenize_exactly() -> TestResult {
    let text = examples_text()?;
    let cases: Vec<Case> = serde_json::from_str(&text)?;
    assert_eq!(cases.len(), 7);
    let tok = Tokenizer::bundled()?;
    for case in &cases {
        let rendered = encode_messages(&case.messages, case.thinking);
        assert_eq!(rendered, case.rendered, "rendered text of {}", case.name);
        let ids = tok.encode(&rendered)?;
        assert_eq!(ids, case.ids, "ids of {}", case.name);
        assert_eq!(
            tok.decode(&ids)?,
            case.rendered,
            "round trip of {}",
            case.name
        );
    }
    Ok(())
}

#[test]
fn encode_cases_reproduces_the_examples() -> TestResult {
    let text = examples_text()?;
    let tok = Tokenizer::bundled()?;
    let out: serde_json::Value = serde_json::from_str(&encode_cases(&text, &tok)?)?;
    let want: serde_json::Value = serde_json::from_str(&text)?;
    let (Some(out), Some(want)) = (out.as_array(), want.as_array()) else {
        return Err("expected JSON arrays".into());
    };
    assert_eq!(out.len(), want.len());
    for (o, w) in out.iter().zip(want) {
        for key in ["name", "rendered", "ids"] {
            assert_eq!(o[key], w[key], "{key} of {}", w["name"]);
        }
    }
    Ok(())
}
