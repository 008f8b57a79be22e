//! Chat message types, in the OpenAI wire shape the reference encoder takes (spec §2, §3.3).
//!
//! Serde matches `chat-encoding-examples.json`: `role`, `content` (string or list of parts),
//! `reasoning_content` (alias `reasoning`, vLLM's name), `tool_calls`, `tool_call_id`,
//! `tools`, `response_format`, `wo_eos`. Unknown fields are ignored.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Who speaks. `Developer` and `LatestReminder` are internal DeepSeek roles (spec §2.2 rule 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
    Developer,
    LatestReminder,
}

/// Message content: a plain string, or OpenAI-style parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a list content (`{"type":"text","text":...}`; other types are not rendered).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl Content {
    /// The text the encoder inserts: list parts are joined with `"\n\n"` and non-text parts
    /// become `[Unsupported {type}]`, as the reference does for tool results.
    pub fn to_text(&self) -> String {
        match self {
            Content::Text(s) => s.clone(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match (&p.text, p.kind.as_str()) {
                    (Some(t), "text") => t.clone(),
                    (None, "text") => String::new(),
                    (_, other) => format!("[Unsupported {other}]"),
                })
                .collect::<Vec<_>>()
                .join("\n\n"),
        }
    }
}

/// An assistant tool call in history (OpenAI shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

/// Name and arguments of a call. `arguments` should be the JSON *string* (spec §3.3);
/// anything else is rendered as one parameter named `arguments`, like the reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

/// A tool declaration (`{"type":"function","function":{name, description, parameters}}`).
/// `function` stays a JSON value so that its keys keep their order when printed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDecl {
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: Value,
}

fn function_kind() -> String {
    "function".to_string()
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    #[serde(default, alias = "reasoning", skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tool_calls: Vec<ToolCallRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tools: Vec<ToolDecl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// Omit the trailing EOS of an assistant message (prefill / continuation).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wo_eos: bool,
}

/// OpenAI clients send `"tool_calls": null`; treat it like an absent field.
fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

impl Message {
    /// A message with only a role and text content.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(Content::Text(content.into())),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            tools: Vec::new(),
            response_format: None,
            wo_eos: false,
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant turn for history; `reasoning` is dropped by the encoder where spec §2.4 says.
    pub fn assistant(content: impl Into<String>, reasoning: Option<String>) -> Self {
        Self {
            reasoning_content: reasoning,
            ..Self::new(Role::Assistant, content)
        }
    }

    /// A tool result answering the call with id `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            ..Self::new(Role::Tool, content)
        }
    }

    /// Content as the encoder inserts it; absent or null content is the empty string.
    pub fn text(&self) -> String {
        self.content
            .as_ref()
            .map(Content::to_text)
            .unwrap_or_default()
    }
}

/// Thinking setting of a turn (spec §2.5, §2.6, April 2026 encoder).
///
/// `Off` is `thinking_mode="chat"`; `High` is thinking with no effort text (identical to
/// effort `"high"` or `None`); `Max` also inserts the effort paragraph after BOS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThinkingMode {
    Off,
    #[default]
    High,
    Max,
}

impl ThinkingMode {
    /// Whether the model starts its reply inside reasoning.
    pub fn is_thinking(self) -> bool {
        !matches!(self, ThinkingMode::Off)
    }

    fn as_str(self) -> &'static str {
        match self {
            ThinkingMode::Off => "off",
            ThinkingMode::High => "high",
            ThinkingMode::Max => "max",
        }
    }
}

/// Accepts the examples file's `thinking` field: `false`/`true`, or an effort string.
#[derive(Deserialize)]
#[serde(untagged)]
enum ThinkingRepr {
    Flag(bool),
    Name(String),
}

impl<'de> Deserialize<'de> for ThinkingMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match ThinkingRepr::deserialize(d)? {
            ThinkingRepr::Flag(false) => Ok(ThinkingMode::Off),
            ThinkingRepr::Flag(true) => Ok(ThinkingMode::High),
            ThinkingRepr::Name(name) => match name.to_ascii_lowercase().as_str() {
                "off" | "chat" | "none" => Ok(ThinkingMode::Off),
                "high" | "on" | "thinking" => Ok(ThinkingMode::High),
                "max" => Ok(ThinkingMode::Max),
                other => Err(serde::de::Error::custom(format!(
                    "unknown thinking mode {other:?} (expected false, true, \"high\" or \"max\")"
                ))),
            },
        }
    }
}

impl Serialize for ThinkingMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinking_mode_forms() {
        let parse = |s: &str| serde_json::from_str::<ThinkingMode>(s).ok();
        assert_eq!(parse("false"), Some(ThinkingMode::Off));
        assert_eq!(parse("true"), Some(ThinkingMode::High));
        assert_eq!(parse("\"high\""), Some(ThinkingMode::High));
        assert_eq!(parse("\"max\""), Some(ThinkingMode::Max));
        assert_eq!(parse("\"low\""), None);
        let back = serde_json::to_string(&ThinkingMode::Max).ok();
        assert_eq!(back.as_deref(), Some("\"max\""));
    }

    #[test]
    fn message_schema() -> Result<(), serde_json::Error> {
        let m: Message = serde_json::from_str(
            r#"{"role":"assistant","content":null,"reasoning":"r","tool_calls":null}"#,
        )?;
        assert_eq!(m.reasoning_content.as_deref(), Some("r"));
        assert!(m.tool_calls.is_empty());
        assert_eq!(m.text(), "");
        let t: Message = serde_json::from_str(
            r#"{"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"a"},{"type":"image"}]}"#,
        )?;
        assert_eq!(t.text(), "a\n\n[Unsupported image]");
        Ok(())
    }
}
