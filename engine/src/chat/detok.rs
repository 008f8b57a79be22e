//! Incremental detokenizer: token ids in, complete UTF-8 text out.
//!
//! Byte-level BPE tokens can end in the middle of a multi-byte character (CJK, emoji), so
//! each token's raw bytes are appended to a buffer and only the longest valid UTF-8 prefix is
//! released. Invalid bytes become U+FFFD exactly where `String::from_utf8_lossy` would put
//! them, so the concatenated output equals decoding all ids at once.

use super::tokenizer::Tokenizer;

/// Per-sequence detokenizer state. The tokenizer is passed to [`Detokenizer::push`] so that
/// one shared tokenizer can serve many sequences.
#[derive(Debug, Default, Clone)]
pub struct Detokenizer {
    pending: Vec<u8>,
}

impl Detokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token and returns the text it completes (often empty mid-character).
    /// Tokens flagged special (BOS, EOS, pad) produce no text; non-special control tokens
    /// such as `</think>` are returned as their text for the output parser to interpret.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        if tokenizer.is_special(id) {
            return String::new();
        }
        self.pending.extend_from_slice(tokenizer.token_bytes(id));
        self.take_complete()
    }

    /// Releases whatever is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Bytes held back because they do not yet form a complete character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid]));
                    match e.error_len() {
                        // A bad sequence in the middle: replace it and go on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid + bad;
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}
