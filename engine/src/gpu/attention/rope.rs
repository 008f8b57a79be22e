//! Per-layer RoPE frequencies for the device (spec §2.0), the same values as `reference::rope::Rope`:
//! plain base on window-only blocks, the compressed base with YaRN elsewhere, computed in f64 and
//! rounded to f32. (The reference keeps its table private; the formula is short, and a test checks that
//! rotations with both tables agree.)
use crate::model::{AttentionKind, ModelConfig, Yarn};

/// The `rope_dim / 2` pair frequencies of block `layer`.
pub fn rope_freqs(cfg: &ModelConfig, layer: usize) -> Vec<f32> {
    let dim = cfg.qk_rope_head_dim;
    let (base, yarn) = match cfg.attention_kind(layer) {
        AttentionKind::Window => (cfg.rope_theta, None),
        _ => (cfg.compress_rope_theta, cfg.yarn),
    };
    let mut freqs: Vec<f64> = (0..dim / 2)
        .map(|i| base.powf(-((2 * i) as f64) / dim as f64))
        .collect();
    if let Some(y) = yarn.filter(|y| y.original_max_position > 0) {
        let (lo, hi) = yarn_range(dim, base, &y);
        for (i, f) in freqs.iter_mut().enumerate() {
            let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
            *f = *f * (1.0 - ramp) + *f / y.factor * ramp;
        }
    }
    freqs.into_iter().map(|f| f as f32).collect()
}

fn yarn_range(dim: usize, base: f64, y: &Yarn) -> (f64, f64) {
    let corr = |rot: f64| {
        dim as f64 * (y.original_max_position as f64 / (rot * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let lo = corr(y.beta_fast).floor().max(0.0);
    let hi = corr(y.beta_slow).ceil().min(dim as f64 - 1.0);
    let hi = if lo == hi { hi + 0.001 } else { hi };
    (lo, hi)
}
