//! Memory estimate for a checkpoint: weights plus the per-sequence caches of spec §3, scaled by
//! the checkpoint's own config so small test models get small numbers.

use super::CacheShape;

/// Bytes of a bf16 value; the official cache layout stores bf16.
const BF16: u64 = 2;
/// Bytes of an f32 value (compressor state).
const F32: u64 = 4;

/// Compressed-cache bytes added per token of context, over all layers (6880 for the real model):
/// ratio 4 (CSA) keeps a main and an indexer entry per 4 tokens, other ratios one main entry
/// per `ratio` tokens, ratio 0 nothing beyond its fixed window.
pub fn cache_bytes_per_token(shape: &CacheShape) -> f64 {
    let head = shape.head_dim as f64;
    let index = shape.index_head_dim as f64;
    shape
        .compress_ratios
        .iter()
        .map(|&ratio| match ratio {
            0 => 0.0,
            4 => (head + index) * BF16 as f64 / 4.0,
            m => head * BF16 as f64 / m as f64,
        })
        .sum()
}

/// Bytes every sequence needs whatever its length: one sliding-window ring buffer per layer
/// plus the compressors' f32 state (about 18 MB for the real model).
pub fn fixed_bytes_per_sequence(shape: &CacheShape) -> u64 {
    let head = shape.head_dim as u64;
    let index = shape.index_head_dim as u64;
    let windows = shape.compress_ratios.len() as u64 * shape.sliding_window as u64 * head * BF16;
    let state: u64 = shape
        .compress_ratios
        .iter()
        .map(|&ratio| match ratio {
            0 => 0,
            // kv and score state, 8 rows of 2·d each, for the attention and the indexer compressor.
            4 => 2 * 8 * (2 * head) * F32 + 2 * 8 * (2 * index) * F32,
            m => 2 * m as u64 * head * F32,
        })
        .sum();
    windows + state
}

/// Weights plus the caches of one sequence of `context` tokens.
pub fn memory_needed(weights_bytes: u64, shape: &CacheShape, context: usize) -> u64 {
    let per_token = cache_bytes_per_token(shape) * context as f64;
    weights_bytes + per_token.ceil() as u64 + fixed_bytes_per_sequence(shape)
}

/// Whether a model fits the GPUs the engine reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// No GPU is known (CPU backend, or no model loaded on CUDA yet).
    NoGpuInfo {
        needed: u64,
    },
    Fits {
        needed: u64,
        available: u64,
    },
    TooBig {
        needed: u64,
        available: u64,
    },
}

pub fn fit(needed: u64, gpu_total_bytes: &[u64]) -> Fit {
    if gpu_total_bytes.is_empty() {
        return Fit::NoGpuInfo { needed };
    }
    let available: u64 = gpu_total_bytes.iter().sum();
    if needed <= available {
        Fit::Fits { needed, available }
    } else {
        Fit::TooBig { needed, available }
    }
}

/// "1.5 GB"-style sizes (decimal units, like disk sizes on most systems).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real DeepSeek-V4-Flash layout (spec §1): 0,0, then 4/128 alternating, 4, MTP 0.
    fn real_shape() -> CacheShape {
        let mut ratios = vec![0, 0];
        ratios.extend((2..42).map(|i| if i % 2 == 0 { 4 } else { 128 }));
        ratios.extend([4, 0]);
        CacheShape {
            head_dim: 512,
            index_head_dim: 128,
            sliding_window: 128,
            compress_ratios: ratios,
        }
    }

    #[test]
    fn real_model_matches_the_spec_figures() {
        let shape = real_shape();
        assert_eq!(shape.compress_ratios.len(), 44);
        assert_eq!(cache_bytes_per_token(&shape), 6880.0);
        assert_eq!(fixed_bytes_per_sequence(&shape), 5_767_168 + 12_206_080);
    }

    #[test]
    fn fit_compares_against_the_sum_of_gpus() {
        assert_eq!(fit(10, &[]), Fit::NoGpuInfo { needed: 10 });
        assert!(matches!(fit(10, &[6, 6]), Fit::Fits { available: 12, .. }));
        assert!(matches!(fit(13, &[6, 6]), Fit::TooBig { .. }));
    }

    #[test]
    fn memory_grows_with_context() {
        let shape = real_shape();
        let short = memory_needed(1000, &shape, 1000);
        let long = memory_needed(1000, &shape, 2000);
        assert_eq!(long - short, 6_880_000);
    }

    #[test]
    fn sizes_read_naturally() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1_500_000), "1.5 MB");
        assert_eq!(human_bytes(160_000_000_000), "160.0 GB");
    }
}
