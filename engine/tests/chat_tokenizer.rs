//! The bundled tokenizer: control-token ids, no implicit BOS, and the per-id byte table
//! that the detokenizer relies on.

use std::path::PathBuf;
use std::sync::OnceLock;

use dsv4_engine::chat::{ChatError, SpecialIds, Tokenizer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn tok() -> Result<&'static Tokenizer, ChatError> {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    if let Some(t) = TOK.get() {
        return Ok(t);
    }
    let t = Tokenizer::bundled()?;
    Ok(TOK.get_or_init(|| t))
}

#[test]
fn special_ids_and_vocab_size_match_the_spec() -> TestResult {
    let t = tok()?;
    let want = SpecialIds {
        bos: 0,
        eos: 1,
        user: 128803,
        assistant: 128804,
        think_start: 128821,
        think_end: 128822,
        dsml: 128825,
    };
    assert_eq!(t.special_ids(), want);
    assert_eq!(t.vocab_size(), 129_280);
    assert!(t.is_special(0) && t.is_special(1) && t.is_special(2));
    assert!(!t.is_special(128822) && !t.is_special(19923));
    Ok(())
}

#[test]
fn encode_matches_spec_token_examples() -> TestResult {
    let t = tok()?;
    assert_eq!(
        t.encode("\n\n<｜DSML｜tool_calls>")?,
        [271, 30, 128825, 72461, 4941, 12548, 32]
    );
    assert_eq!(
        t.encode("</｜DSML｜tool_calls>")?,
        [1718, 128825, 72461, 4941, 12548, 32]
    );
    // ASCII bars are plain text, and no BOS is ever added.
    assert_eq!(t.encode("<|User|>")?, [30, 94, 6756, 94, 32]);
    assert_eq!(t.encode("Hello")?.first(), Some(&19923));
    Ok(())
}

#[test]
fn token_bytes_agree_with_decode_for_every_id() -> TestResult {
    let t = tok()?;
    for id in 0..t.vocab_size() as u32 {
        let lossy = String::from_utf8_lossy(t.token_bytes(id)).into_owned();
        assert_eq!(lossy, t.decode(&[id])?, "id {id}");
    }
    assert!(t.token_bytes(u32::MAX).is_empty());
    Ok(())
}

#[test]
fn load_errors_are_typed() {
    let missing = Tokenizer::from_file("/nonexistent/tokenizer.json");
    assert!(matches!(missing, Err(ChatError::TokenizerLoad { .. })));
    let tiny = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
        "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
        "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{"a":0},"merges":[]}}"#;
    let r = Tokenizer::from_json_bytes(tiny.as_bytes(), std::path::Path::new("tiny"));
    assert!(
        matches!(r, Err(ChatError::MissingSpecialToken { .. })),
        "{r:?}"
    );
}

#[test]
fn asset_file_loads_like_the_bundled_copy() -> TestResult {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets/tokenizer/tokenizer.json");
    let t = Tokenizer::from_file(path)?;
    assert_eq!(t.special_ids(), tok()?.special_ids());
    Ok(())
}
