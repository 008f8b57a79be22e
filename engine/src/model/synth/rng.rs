//! A tiny deterministic PRNG (SplitMix64) and a cheap approximately-normal sampler.
//!
//! Synthetic weights only need to be reproducible and roughly bell-shaped, not
//! statistically perfect, so a sum of uniforms beats pulling in a crate.

/// SplitMix64: one add and a 64-bit finaliser per output; every seed gives a full-period
/// stream.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

/// The SplitMix64 finaliser, also used to derive independent seeds.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Seed for the tensor `name` of a model with seed `seed` (FNV-1a of the name, mixed), so
/// each tensor's values are independent of the order tensors are generated in.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(h ^ mix64(seed))
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// Uniform in `[0, n)` (`n > 0`); the modulo bias is irrelevant for test weights.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Approximately standard normal: the sum of four 16-bit uniforms (Irwin-Hall),
    /// centred and scaled to unit variance. Bounded by +-3.46, which keeps weights tame.
    pub fn normalish(&mut self) -> f32 {
        let r = self.next_u64();
        let sum: u64 = (0..4).map(|k| (r >> (16 * k)) & 0xFFFF).sum();
        // Mean 4 * 32767.5; variance 4 * (65536^2 - 1) / 12.
        const MEAN: f64 = 131_070.0;
        const STD: f64 = 37_837.2;
        ((sum as f64 - MEAN) / STD) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_deterministic_and_roughly_standard_normal() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let xs: Vec<f32> = (0..100_000).map(|_| a.normalish()).collect();
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.02, "{mean}");
        assert!((var - 1.0).abs() < 0.03, "{var}");
        assert_ne!(tensor_seed(1, "a"), tensor_seed(1, "b"));
        assert_ne!(tensor_seed(1, "a"), tensor_seed(2, "a"));
    }
}
