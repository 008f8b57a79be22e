//! Batch encoding of test cases (backs `dsv4 encode`): the examples-file schema in,
//! `[{"name","rendered","ids"}]` out.

use serde::{Deserialize, Serialize};

use super::encoding::encode_messages;
use super::message::{Message, ThinkingMode};
use super::tokenizer::Tokenizer;
use super::ChatError;

/// One input case. `thinking` is `false`, `true`, `"high"` or `"max"` as in
/// `chat-encoding-examples.json`; other fields (`rendered`, `ids`, `note`) are ignored.
#[derive(Deserialize)]
struct CaseIn {
    name: String,
    messages: Vec<Message>,
    thinking: ThinkingMode,
    /// Also accepted, OpenAI style: `"max"` upgrades a thinking case to [`ThinkingMode::Max`].
    #[serde(default)]
    reasoning_effort: Option<String>,
}

#[derive(Serialize)]
struct CaseOut {
    name: String,
    rendered: String,
    ids: Vec<u32>,
}

impl CaseIn {
    fn mode(&self) -> ThinkingMode {
        match (self.thinking, self.reasoning_effort.as_deref()) {
            (ThinkingMode::High, Some("max")) => ThinkingMode::Max,
            (mode, _) => mode,
        }
    }
}

/// Encodes every case of a JSON list and returns the results as pretty JSON.
pub fn encode_cases(cases_json: &str, tok: &Tokenizer) -> Result<String, ChatError> {
    let cases: Vec<CaseIn> = serde_json::from_str(cases_json)?;
    let mut out = Vec::with_capacity(cases.len());
    for case in cases {
        let rendered = encode_messages(&case.messages, case.mode());
        let ids = tok.encode(&rendered)?;
        out.push(CaseOut {
            name: case.name,
            rendered,
            ids,
        });
    }
    Ok(serde_json::to_string_pretty(&out)?)
}
