//! DSML tool-call markup (spec §3.3): rendering for prompts and parsing of model output.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::message::{ToolCallRecord, ToolDecl};
use super::pyjson;

/// Opens a tool-call block in model output (after `"\n\n"`).
pub(crate) const BLOCK_OPEN: &str = "<｜DSML｜tool_calls>";
/// Closes a tool-call block.
pub(crate) const BLOCK_CLOSE: &str = "</｜DSML｜tool_calls>";
const INVOKE_OPEN: &str = "<｜DSML｜invoke name=\"";
const INVOKE_CLOSE: &str = "</｜DSML｜invoke>";
const PARAM_OPEN: &str = "<｜DSML｜parameter name=\"";
const PARAM_CLOSE: &str = "</｜DSML｜parameter>";

/// The fixed `## Tools` explanation, up to and including `### Available Tool Schemas\n\n`.
const TOOLS_PREAMBLE: &str = include_str!("tools_preamble.txt");
const TOOLS_EPILOGUE: &str =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

/// A tool call parsed from model output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub name: String,
    /// OpenAI-style `arguments`: a JSON object text, parameters in the order the model wrote them.
    pub arguments_json: String,
}

/// The tools declaration appended (after `"\n\n"`) to a system or developer message:
/// the preamble, then one Python-`json.dumps` line per tool's `function` object.
pub(crate) fn render_tools(tools: &[ToolDecl]) -> String {
    let schemas: Vec<String> = tools.iter().map(|t| pyjson::dumps(&t.function)).collect();
    format!("{TOOLS_PREAMBLE}{}{TOOLS_EPILOGUE}", schemas.join("\n"))
}

/// `"\n\n<｜DSML｜tool_calls>\n{invoke}\n...\n</｜DSML｜tool_calls>"` for an assistant turn.
pub(crate) fn render_tool_calls(calls: &[ToolCallRecord]) -> String {
    let invokes: Vec<String> = calls.iter().map(render_invoke).collect();
    format!("\n\n{BLOCK_OPEN}\n{}\n{BLOCK_CLOSE}", invokes.join("\n"))
}

fn render_invoke(call: &ToolCallRecord) -> String {
    let params: Vec<String> = call_parameters(&call.function.arguments)
        .into_iter()
        .map(|(key, value)| match value {
            Value::String(s) => render_param(&key, true, &s),
            other => render_param(&key, false, &pyjson::dumps(&other)),
        })
        .collect();
    format!(
        "{INVOKE_OPEN}{}\">\n{}\n{INVOKE_CLOSE}",
        call.function.name,
        params.join("\n")
    )
}

fn render_param(key: &str, is_string: bool, value: &str) -> String {
    format!("{PARAM_OPEN}{key}\" string=\"{is_string}\">{value}{PARAM_CLOSE}")
}

/// The parameters of a history call. `arguments` should be a JSON-object string; like the
/// reference, anything else becomes one parameter named `arguments` holding the raw value.
/// A missing (null) `arguments` means a call with no parameters.
fn call_parameters(arguments: &Value) -> Vec<(String, Value)> {
    match arguments {
        Value::Null => Vec::new(),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map.into_iter().collect(),
            _ => vec![("arguments".to_string(), arguments.clone())],
        },
        other => vec![("arguments".to_string(), other.clone())],
    }
}

/// Parses the inside of a tool-call block (text between [`BLOCK_OPEN`] and [`BLOCK_CLOSE`]).
/// Whitespace between tags is tolerated; anything else unexpected gives `None` so that the
/// caller can show the block as plain text instead.
pub(crate) fn parse_block(body: &str) -> Option<Vec<ToolCall>> {
    let mut rest = body;
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (call, after) = parse_invoke(rest)?;
        calls.push(call);
        rest = after;
    }
    (!calls.is_empty()).then_some(calls)
}

/// One `<｜DSML｜invoke name="...">...</｜DSML｜invoke>`; returns the call and the rest.
fn parse_invoke(text: &str) -> Option<(ToolCall, &str)> {
    let rest = text.strip_prefix(INVOKE_OPEN)?;
    let (name, mut rest) = rest.split_once("\">")?;
    let mut fields: Vec<(String, String)> = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(INVOKE_CLOSE) {
            rest = after;
            break;
        }
        let (key, json, after) = parse_param(rest)?;
        if fields.iter().any(|(k, _)| *k == key) {
            return None; // the reference rejects duplicate parameters too
        }
        fields.push((key, json));
        rest = after;
    }
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}: {v}", pyjson::dumps_str(k)))
        .collect();
    let call = ToolCall {
        name: name.to_string(),
        arguments_json: format!("{{{}}}", body.join(", ")),
    };
    Some((call, rest))
}

/// One parameter; returns (key, value as JSON text, rest).
fn parse_param(text: &str) -> Option<(String, String, &str)> {
    let rest = text.strip_prefix(PARAM_OPEN)?;
    let (key, rest) = rest.split_once("\" string=\"")?;
    let (flag, rest) = rest.split_once("\">")?;
    let (value, rest) = rest.split_once(PARAM_CLOSE)?;
    let json = match flag {
        "true" => pyjson::dumps_str(value),
        // Verbatim like the reference, but a value that is not valid JSON is kept as a
        // string rather than producing broken `arguments`.
        "false" if serde_json::from_str::<Value>(value).is_ok() => value.to_string(),
        "false" => pyjson::dumps_str(value),
        _ => return None,
    };
    Some((key.to_string(), json, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::message::FunctionCall;

    fn record(name: &str, args: Value) -> ToolCallRecord {
        ToolCallRecord {
            id: None,
            kind: "function".into(),
            function: FunctionCall {
                name: name.into(),
                arguments: args,
            },
        }
    }

    #[test]
    fn render_then_parse_round_trips() {
        let args =
            r#"{"city": "Paris\n\"x\" <b>", "days": 3, "opts": {"a": [1, 2.5]}, "ok": true}"#;
        let block = render_tool_calls(&[record("get", Value::String(args.into()))]);
        let body = block
            .strip_prefix(&format!("\n\n{BLOCK_OPEN}"))
            .and_then(|b| b.strip_suffix(BLOCK_CLOSE));
        let calls = body.and_then(parse_block);
        let want = ToolCall {
            name: "get".into(),
            arguments_json: args.into(),
        };
        assert_eq!(calls, Some(vec![want]));
    }

    #[test]
    fn empty_and_odd_arguments() {
        let empty = render_tool_calls(&[record("now", Value::String("{}".into()))]);
        assert!(empty.contains("<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>"));
        let bad = render_tool_calls(&[record("f", Value::String("not json".into()))]);
        assert!(bad.contains("name=\"arguments\" string=\"true\">not json<"));
        let dict = render_tool_calls(&[record("f", serde_json::json!({"a": 1}))]);
        assert!(dict.contains("name=\"arguments\" string=\"false\">{\"a\": 1}<"));
    }

    #[test]
    fn malformed_blocks_are_rejected() {
        assert_eq!(parse_block(""), None);
        assert_eq!(parse_block("<｜DSML｜invoke name=\"f\">\n"), None);
        let bad_flag = "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">1</｜DSML｜parameter>\n</｜DSML｜invoke>";
        assert_eq!(parse_block(bad_flag), None);
        let dup = "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>";
        assert_eq!(parse_block(dup), None);
    }

    #[test]
    fn invalid_non_string_value_becomes_string() {
        let body = "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"false\">12 apples</｜DSML｜parameter>\n</｜DSML｜invoke>\n";
        let calls = parse_block(body).unwrap_or_default();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments_json, r#"{"n": "12 apples"}"#);
    }
}
