//! Token sampling on the CPU (the reference for any GPU sampler) and stop-string detection.
//!
//! `sample` is greedy at temperature 0; otherwise it draws from softmax(logits / T) after
//! top-k, top-p (nucleus) and min-p filtering, with a seeded PRNG so that a seed reproduces a
//! run exactly.

mod rng;
mod select;
mod stop;

pub use rng::Rng;
pub use stop::{StopChecker, StopOutcome};

use serde::{Deserialize, Serialize};

use select::{argmax, candidates, Filters};

/// Sampling settings of one request. Defaults follow the model card (spec §4):
/// temperature 1.0, top-p 1.0, no top-k, no min-p.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 = off.
    pub top_k: u32,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; 1.0 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 = off.
    pub min_p: f32,
    /// Fixed seed for reproducible runs; `None` seeds from the clock.
    pub seed: Option<u64>,
    /// Output budget in tokens (reasoning included).
    pub max_tokens: u32,
    /// Generation stops before the first occurrence of any of these in the output text.
    pub stop_strings: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            // Thinking mode spends much of the budget on reasoning (spec §4): be generous.
            max_tokens: 32_768,
            stop_strings: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Whether sampling is deterministic argmax (temperature 0, or NaN, or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0 || self.top_k == 1
    }
}

/// A sampler for one sequence: parameters plus its own random stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(Rng::time_seed);
        Self {
            params,
            seed,
            rng: Rng::from_seed(seed),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (the clock seed when none was given), to reproduce a run later.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A fresh stop-string checker for this request's stop strings.
    pub fn stop_checker(&self) -> StopChecker {
        StopChecker::new(&self.params.stop_strings)
    }

    /// Picks the next token id from one row of logits (length = vocabulary size).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let filters = Filters {
            temperature: self.params.temperature,
            top_k: self.params.top_k as usize,
            top_p: self.params.top_p,
            min_p: self.params.min_p.clamp(0.0, 1.0),
        };
        let kept = candidates(logits, &filters);
        let total: f64 = kept.iter().map(|c| f64::from(c.1)).sum();
        if kept.is_empty() || total.is_nan() || total <= 0.0 {
            return argmax(logits);
        }
        let mut r = self.rng.next_f64() * total;
        for &(id, w) in &kept {
            r -= f64::from(w);
            if r < 0.0 {
                return id;
            }
        }
        // Rounding left a sliver of mass: the last candidate owns it.
        kept.last().map_or_else(|| argmax(logits), |c| c.0)
    }
}

#[cfg(test)]
mod tests;
