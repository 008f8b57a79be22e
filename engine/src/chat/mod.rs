//! Chat layer: prompt encoding, tokenizer, incremental detokenizer and output parser.
//!
//! Normative description: `spec/chat-encoding.md` (DeepSeek-V4 April 2026 encoder).
//! Flow for one turn: [`encode_messages`] renders the conversation to text, [`Tokenizer::encode`]
//! turns it into ids, the model generates ids, [`Detokenizer`] turns them back into complete
//! UTF-8 pieces and [`OutputParser`] splits those pieces into reasoning, answer and tool calls.

mod byte_level;
mod cases;
mod detok;
mod dsml;
mod encoding;
pub(crate) mod holdback;
mod message;
mod parser;
mod pyjson;
mod tokenizer;

pub use cases::encode_cases;
pub use detok::Detokenizer;
pub use dsml::ToolCall;
pub use encoding::{encode_messages, encode_messages_with, encode_to_ids, EncodeOptions};
pub use message::{
    Content, ContentPart, FunctionCall, Message, Role, ThinkingMode, ToolCallRecord, ToolDecl,
};
pub use parser::{OutputParser, ParseEvent};
pub use tokenizer::{SpecialIds, Tokenizer};

use std::path::PathBuf;

/// Errors of the chat layer.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The tokenizer file could not be read or parsed.
    #[error("cannot load tokenizer from {path}: {reason}")]
    TokenizerLoad { path: PathBuf, reason: String },
    /// A control token the encoder relies on is missing from the vocabulary.
    #[error("tokenizer has no token {token:?} (is this a DeepSeek-V4 tokenizer.json?)")]
    MissingSpecialToken { token: String },
    /// The tokenizer library failed to encode or decode.
    #[error("tokenizer {op} failed: {reason}")]
    Tokenizer { op: &'static str, reason: String },
    /// Input JSON (cases file, messages) did not match the expected schema.
    #[error("invalid chat JSON: {0}")]
    Json(#[from] serde_json::Error),
}
