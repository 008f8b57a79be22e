//! Rotary position embedding on the trailing `rope_dim` channels, interleaved pairs
//! (spec §2.0): base 10000 without YaRN on window-only blocks, the compressed base with YaRN
//! elsewhere. No attention-magnitude factor is applied.

use crate::model::{AttentionKind, ModelConfig, Yarn};

/// Per-pair frequencies for one block.
#[derive(Debug, Clone)]
pub struct Rope {
    /// `f_i`, one per channel pair, rounded to f32 as the official code keeps them.
    freqs: Vec<f32>,
}

impl Rope {
    /// The table of block `layer` (window-only blocks: plain base; compressed blocks: YaRN).
    pub fn for_layer(cfg: &ModelConfig, layer: usize) -> Self {
        let dim = cfg.qk_rope_head_dim;
        match cfg.attention_kind(layer) {
            AttentionKind::Window => Rope::new(dim, cfg.rope_theta, None),
            _ => Rope::new(dim, cfg.compress_rope_theta, cfg.yarn),
        }
    }

    pub fn new(dim: usize, base: f64, yarn: Option<Yarn>) -> Self {
        let half = dim / 2;
        let mut freqs: Vec<f64> = (0..half)
            .map(|i| base.powf(-((2 * i) as f64) / dim as f64))
            .collect();
        if let Some(y) = yarn.filter(|y| y.original_max_position > 0) {
            let (lo, hi) = yarn_range(dim, base, &y);
            for (i, f) in freqs.iter_mut().enumerate() {
                let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                *f = *f * (1.0 - ramp) + *f / y.factor * ramp;
            }
        }
        Rope {
            freqs: freqs.into_iter().map(|f| f as f32).collect(),
        }
    }

    pub fn dim(&self) -> usize {
        self.freqs.len() * 2
    }

    /// Rotates the last `dim()` channels of `v` to position `pos` (`inverse` rotates back).
    pub fn apply(&self, v: &mut [f32], pos: usize, inverse: bool) {
        let start = v.len() - self.dim();
        let sign = if inverse { -1.0 } else { 1.0 };
        for (i, &f) in self.freqs.iter().enumerate() {
            let theta = pos as f64 * f64::from(f);
            let (sin, cos) = ((sign * theta).sin() as f32, theta.cos() as f32);
            let (a, b) = (v[start + 2 * i], v[start + 2 * i + 1]);
            v[start + 2 * i] = a * cos - b * sin;
            v[start + 2 * i + 1] = a * sin + b * cos;
        }
    }
}

/// The YaRN correction range `[lo, hi]` over pair indices.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn flash_yarn() -> Yarn {
        Yarn {
            factor: 16.0,
            original_max_position: 65536,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }

    #[test]
    fn reference_frequencies_of_the_spec() {
        let plain = Rope::new(64, 10000.0, None);
        assert!((plain.freqs[8] - 0.1).abs() < 1e-7);
        let yarn = Rope::new(64, 160000.0, Some(flash_yarn()));
        let want = [
            (1, 0.68766),
            (15, 3.63554e-3),
            (16, 2.265625e-3),
            (25, 5.37231e-6),
        ];
        for (i, f) in want {
            assert!(
                ((yarn.freqs[i] - f) / f).abs() < 1e-4,
                "f_{i} = {}",
                yarn.freqs[i]
            );
        }
        assert_eq!(yarn_range(64, 160000.0, &flash_yarn()), (15.0, 25.0));
    }

    #[test]
    fn inverse_undoes_rotation() {
        let rope = Rope::new(8, 10000.0, None);
        let orig: Vec<f32> = (0..12).map(|i| i as f32 * 0.3 - 1.0).collect();
        let mut v = orig.clone();
        rope.apply(&mut v, 77, false);
        assert!(v[..4] == orig[..4] && v != orig);
        rope.apply(&mut v, 77, true);
        for (a, b) in v.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}
