//! Behaviour tests of `Sampler` (the filter internals are tested in `select`).

use super::{Rng, Sampler, SamplingParams};

const VOCAB: usize = 129_280;

/// Pseudo-random logits shaped like a model's: a few strong tokens over a wide tail.
fn fake_logits(seed: u64) -> Vec<f32> {
    let mut r = Rng::from_seed(seed);
    (0..VOCAB)
        .map(|_| {
            let u = r.next_f64() as f32;
            if u > 0.9995 {
                8.0 + 4.0 * u
            } else {
                4.0 * u - 2.0
            }
        })
        .collect()
}

fn params(temperature: f32, top_k: u32, top_p: f32, min_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn defaults_follow_the_model_card() -> Result<(), serde_json::Error> {
    let d = SamplingParams::default();
    assert_eq!(
        (d.temperature, d.top_p, d.top_k, d.min_p),
        (1.0, 1.0, 0, 0.0)
    );
    let partial: SamplingParams = serde_json::from_str(r#"{"temperature": 0.6, "seed": 5}"#)?;
    assert_eq!(partial.temperature, 0.6);
    assert_eq!(partial.seed, Some(5));
    assert_eq!(partial.top_p, 1.0);
    Ok(())
}

#[test]
fn greedy_is_argmax() {
    for seed in 0..5 {
        let logits = fake_logits(seed);
        let mut s = Sampler::new(params(0.0, 0, 1.0, 0.0, seed));
        assert_eq!(s.sample(&logits), argmax(&logits));
    }
}

#[test]
fn top_k_one_and_tiny_top_p_are_greedy() {
    for seed in 0..5 {
        let logits = fake_logits(seed);
        let want = argmax(&logits);
        let mut k1 = Sampler::new(params(1.0, 1, 1.0, 0.0, seed));
        let mut p0 = Sampler::new(params(1.0, 0, 1e-6, 0.0, seed));
        let mut p0k = Sampler::new(params(1.0, 50, 1e-6, 0.0, seed));
        for _ in 0..20 {
            assert_eq!(k1.sample(&logits), want);
            assert_eq!(p0.sample(&logits), want);
            assert_eq!(p0k.sample(&logits), want);
        }
    }
}

#[test]
fn same_seed_same_tokens() {
    let rows: Vec<Vec<f32>> = (0..4).map(fake_logits).collect();
    let run = |seed| {
        let mut s = Sampler::new(params(1.0, 40, 0.95, 0.0, seed));
        (0..50)
            .map(|i| s.sample(&rows[i % rows.len()]))
            .collect::<Vec<u32>>()
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12));
    let unseeded = Sampler::new(SamplingParams::default());
    let replay = Sampler::new(params(1.0, 0, 1.0, 0.0, unseeded.seed()));
    assert_eq!(unseeded.seed(), replay.seed());
}

#[test]
fn min_p_drops_unlikely_tokens() {
    // p ~ [0.50, 0.30, 0.18, 0.02]; min-p 0.3 keeps p >= 0.15 (ids 0, 1, 2).
    let logits = [0.5f32.ln(), 0.3f32.ln(), 0.18f32.ln(), 0.02f32.ln()];
    let mut s = Sampler::new(params(1.0, 0, 1.0, 0.3, 3));
    let mut seen = [0usize; 4];
    for _ in 0..5000 {
        seen[s.sample(&logits) as usize] += 1;
    }
    assert_eq!(seen[3], 0);
    assert!(seen[2] > 0);
}

#[test]
fn frequencies_match_probabilities() {
    // Two tokens with p = 0.75 / 0.25 (others effectively impossible).
    let mut logits = vec![-1e9f32; 1000];
    logits[17] = 0.75f32.ln();
    logits[400] = 0.25f32.ln();
    let mut s = Sampler::new(params(1.0, 0, 1.0, 0.0, 2024));
    let n = 40_000;
    let hits = (0..n).filter(|_| s.sample(&logits) == 17).count();
    let freq = hits as f64 / n as f64;
    // 4 sigma of a binomial(n, 0.75) is ~0.009.
    assert!((freq - 0.75).abs() < 0.01, "freq {freq}");
}

#[test]
fn temperature_sharpens() {
    let logits = [1.0f32, 0.0];
    let count = |t: f32| {
        let mut s = Sampler::new(params(t, 0, 1.0, 0.0, 9));
        (0..20_000).filter(|_| s.sample(&logits) == 0).count()
    };
    // p0 = 0.73 at T = 1, 0.88 at T = 0.5.
    assert!(count(0.5) > count(1.0) + 2000);
}

#[test]
fn full_vocab_with_all_filters_stays_in_the_nucleus() {
    let logits = fake_logits(77);
    let mut s = Sampler::new(params(0.8, 64, 0.9, 0.05, 1));
    let mut sorted: Vec<u32> = (0..VOCAB as u32).collect();
    sorted.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    let top64: std::collections::HashSet<u32> = sorted[..64].iter().copied().collect();
    for _ in 0..200 {
        assert!(top64.contains(&s.sample(&logits)));
    }
}

#[test]
fn degenerate_logits_do_not_panic() {
    let mut s = Sampler::new(params(1.0, 5, 0.5, 0.5, 1));
    // NaN never wins; all -inf falls back to the first non-NaN index.
    assert_eq!(s.sample(&[f32::NAN, f32::NEG_INFINITY]), 1);
    assert_eq!(s.sample(&[f32::NEG_INFINITY; 3]), 0);
    assert_eq!(s.sample(&[f32::NEG_INFINITY, 2.0, f32::NAN]), 1);
    assert_eq!(s.sample(&[]), 0);
    let mut wild = Sampler::new(params(1.0, 0, 2.0, 7.0, 1));
    assert_eq!(wild.sample(&[0.0, 5.0, 1.0]), 1);
}
