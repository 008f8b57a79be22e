//! One sampling decision as data: the filters plus the uniform number it consumes. The host
//! picks with [`pick`]; a backend that samples on the device receives the same [`Draw`] and must
//! return the same token.

use super::select::{argmax, candidates, Filters};

/// The inputs of one token choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// <= 0, NaN or so small that its inverse overflows: greedy.
    pub temperature: f32,
    /// 0 = off; 1 = greedy.
    pub top_k: u32,
    /// >= 1 = off.
    pub top_p: f32,
    /// In [0, 1]; 0 = off.
    pub min_p: f32,
    /// Uniform in [0, 1): where the draw lands in the surviving mass.
    pub uniform: f64,
}

impl Draw {
    /// Deterministic argmax.
    pub const GREEDY: Draw = Draw {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        uniform: 0.0,
    };

    /// Also when `1 / temperature` overflows: the weights would all be 0 or NaN.
    pub fn is_greedy(&self) -> bool {
        let t = self.temperature;
        t.is_nan() || t <= 0.0 || !(1.0 / t).is_finite() || self.top_k == 1
    }
}

/// The token `draw` selects from one row of logits (length = vocabulary size).
///
/// Greedy draws take the argmax. Otherwise the survivors of top-k, then top-p (relative to the
/// top-k mass), then min-p are walked in id order, subtracting each weight from
/// `uniform * total`; the first to take it below zero is chosen. Degenerate rows (no finite logit,
/// nothing surviving) fall back to the argmax.
pub fn pick(logits: &[f32], draw: &Draw) -> u32 {
    if draw.is_greedy() {
        return argmax(logits);
    }
    let filters = Filters {
        temperature: draw.temperature,
        top_k: draw.top_k as usize,
        top_p: draw.top_p,
        min_p: draw.min_p.clamp(0.0, 1.0),
    };
    let mut kept = candidates(logits, &filters);
    kept.retain(|c| c.1 > 0.0);
    kept.sort_unstable_by_key(|c| c.0);
    let total: f64 = kept.iter().map(|c| f64::from(c.1)).sum();
    if kept.is_empty() || total.is_nan() || total <= 0.0 {
        return argmax(logits);
    }
    let mut r = draw.uniform * total;
    for &(id, w) in &kept {
        r -= f64::from(w);
        if r < 0.0 {
            return id;
        }
    }
    // Rounding left a sliver of mass: the last survivor owns it.
    kept.last().map_or_else(|| argmax(logits), |c| c.0)
}
