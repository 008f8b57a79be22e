//! Token sampling on the CPU (the reference for any GPU sampler) and stop-string detection.
//!
//! `sample` is greedy at temperature 0; otherwise it draws from softmax(logits / T) after
//! top-k, top-p (nucleus) and min-p filtering, with a seeded PRNG so that a seed reproduces a
//! run exactly.

mod draw;
mod rng;
mod select;
mod stop;

pub use draw::{pick, Draw};
pub use rng::Rng;
pub use stop::{StopChecker, StopOutcome};

use serde::{Deserialize, Serialize};

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

    /// The next decision: this request's filters and, unless greedy, one number from its stream.
    pub fn draw(&mut self) -> Draw {
        let p = &self.params;
        let mut d = Draw {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p.clamp(0.0, 1.0),
            uniform: 0.0,
        };
        if !d.is_greedy() {
            d.uniform = self.rng.next_f64();
        }
        d
    }

    /// Picks the next token id from one row of logits (length = vocabulary size).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let draw = self.draw();
        pick(logits, &draw)
    }
}

#[cfg(test)]
mod tests;
