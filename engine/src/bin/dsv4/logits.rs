//! `dsv4 logits`: teacher-forced logits of the CPU reference, for checking against another
//! implementation.

use anyhow::Context;
use dsv4_engine::api::Numerics;
use dsv4_engine::reference::{BatchItem, ForwardOptions, Model};
use std::path::Path;

#[derive(serde::Deserialize)]
struct TokensFile {
    prompt_ids: Vec<u32>,
    #[serde(default)]
    decode_fed_ids: Vec<u32>,
}

pub fn run(model_dir: &Path, tokens: &Path, out: &Path, numerics: Numerics) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(tokens).with_context(|| format!("reading {}", tokens.display()))?;
    let t: TokensFile =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", tokens.display()))?;
    anyhow::ensure!(
        !t.prompt_ids.is_empty(),
        "{}: prompt_ids is empty",
        tokens.display()
    );
    let model = Model::load(model_dir, numerics)?;
    let vocab = model.cfg.vocab_size;
    if let Some(bad) = t
        .prompt_ids
        .iter()
        .chain(&t.decode_fed_ids)
        .find(|&&id| id as usize >= vocab)
    {
        anyhow::bail!(
            "{}: token id {bad} is outside the vocabulary ({vocab})",
            tokens.display()
        );
    }
    let mut state = model.new_state();
    let mut rows = Vec::with_capacity((1 + t.decode_fed_ids.len()) * vocab);
    let mut feed = |ids: &[u32]| {
        let mut batch = [BatchItem {
            state: &mut state,
            tokens: ids,
        }];
        let logits = model
            .forward(&mut batch, ForwardOptions::default())
            .remove(0)
            .logits;
        rows.extend(logits);
    };
    feed(&t.prompt_ids);
    for &id in &t.decode_fed_ids {
        feed(&[id]);
    }
    let n = 1 + t.decode_fed_ids.len();
    crate::npy::write_f32(out, &[n, vocab], &rows)?;
    eprintln!("wrote {} ({n} x {vocab})", out.display());
    Ok(())
}
