//! Incremental detokenization: pieces are complete UTF-8 and add up to the full decode.

use std::sync::OnceLock;

use dsv4_engine::chat::{ChatError, Detokenizer, Tokenizer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn tok() -> Result<&'static Tokenizer, ChatError> {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    if let Some(t) = TOK.get() {
        return Ok(t);
    }
    let t = Tokenizer::bundled()?;
    Ok(TOK.get_or_init(|| t))
}

const TEXT: &str = "Café déjà vu — naïve façade. 日本語のテキストと中文字符。\
    Emoji: 🎉🚀👩‍👩‍👧‍👦 🇫🇷; math ∑∫√ π≈3.14; Ελληνικά, русский, עברית, 한국어.";

fn stream(t: &Tokenizer, ids: &[u32]) -> (Vec<String>, String) {
    let mut d = Detokenizer::new();
    let pieces: Vec<String> = ids.iter().map(|&id| d.push(t, id)).collect();
    (pieces, d.finish())
}

#[test]
fn one_token_at_a_time_equals_full_decode() -> TestResult {
    let t = tok()?;
    let ids = t.encode(TEXT)?;
    let (pieces, tail) = stream(t, &ids);
    assert_eq!(tail, "");
    assert_eq!(pieces.concat(), t.decode(&ids)?);
    assert_eq!(pieces.concat(), TEXT);
    // The test is only meaningful if some token really ends inside a character.
    let split = ids
        .iter()
        .any(|&id| std::str::from_utf8(t.token_bytes(id)).is_err());
    assert!(split, "no token split a multi-byte character");
    assert!(pieces.iter().any(String::is_empty));
    Ok(())
}

#[test]
fn every_prefix_flushes_to_its_lossy_decode() -> TestResult {
    let t = tok()?;
    let ids = t.encode(TEXT)?;
    for k in 0..=ids.len() {
        let (pieces, tail) = stream(t, &ids[..k]);
        let bytes: Vec<u8> = ids[..k]
            .iter()
            .flat_map(|&id| t.token_bytes(id).to_vec())
            .collect();
        assert_eq!(
            pieces.concat() + &tail,
            String::from_utf8_lossy(&bytes),
            "prefix {k}"
        );
    }
    Ok(())
}

/// The id of the single-byte token for `b` (byte-level BPE has all 256).
fn byte_token(t: &Tokenizer, b: u8) -> Option<u32> {
    (0..t.vocab_size() as u32).find(|&id| t.token_bytes(id) == [b])
}

#[test]
fn characters_split_at_every_byte_boundary() -> TestResult {
    let t = tok()?;
    let mut table = [0u32; 256];
    for b in 0..=255u8 {
        table[usize::from(b)] = byte_token(t, b).ok_or(format!("no token for byte {b}"))?;
    }
    // One token per byte: every multi-byte char is split at every internal boundary.
    let ids: Vec<u32> = TEXT.bytes().map(|b| table[usize::from(b)]).collect();
    let (pieces, tail) = stream(t, &ids);
    assert_eq!(tail, "");
    assert_eq!(pieces.concat(), TEXT);
    // A piece is emitted exactly when a character completes.
    let chars: Vec<String> = TEXT.chars().map(String::from).collect();
    let nonempty: Vec<&String> = pieces.iter().filter(|p| !p.is_empty()).collect();
    assert_eq!(nonempty.len(), chars.len());
    // Invalid bytes are replaced where the lossy decoder replaces them, not held forever.
    let bad = [
        table[0xE4],
        table[b'a' as usize],
        table[0xFF],
        table[0xF0],
        table[0x9F],
    ];
    let (pieces, tail) = stream(t, &bad);
    assert_eq!(pieces.concat(), "\u{FFFD}a\u{FFFD}");
    assert_eq!(tail, "\u{FFFD}");
    Ok(())
}

#[test]
fn special_tokens_are_not_text_but_control_tokens_are() -> TestResult {
    let t = tok()?;
    let ids = t.special_ids();
    let mut d = Detokenizer::new();
    assert_eq!(d.push(t, ids.bos), "");
    assert_eq!(d.push(t, ids.think_end), "</think>");
    assert_eq!(d.push(t, ids.eos), "");
    assert_eq!(d.pending_len(), 0);
    Ok(())
}
