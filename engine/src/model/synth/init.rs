//! Random values for each tensor, scaled by role so a forward pass stays numerically sane,
//! encoded into the stored bytes (BF16 / F32 / I64 / FP8 + scale / FP4 + scale).

use super::quant::{quantize_fp4, quantize_fp8};
use super::rng::{mix64, tensor_seed, SplitMix64};
use crate::model::checkpoint::{Dtype, ExpectedTensor, Role, Storage};
use rayon::prelude::*;

/// Elements per independently seeded chunk: lets generation run in parallel while the
/// values stay identical whatever the thread count.
const CHUNK: usize = 1 << 14;

/// `mean + std * z` with z approximately standard normal.
struct Dist {
    mean: f32,
    std: f32,
}

fn dist(role: Role, shape: &[usize]) -> Dist {
    let fan_in = shape.get(1).copied().unwrap_or(1).max(1) as f32;
    let d = |mean, std| Dist { mean, std };
    match role {
        Role::Embedding => d(0.0, 1.0),
        // Unit-variance inputs give unit-variance outputs.
        Role::Linear => d(0.0, 1.0 / fan_in.sqrt()),
        Role::Norm => d(1.0, 0.1),
        // mHC mixers read the whole flattened stream: keep their logits O(0.5).
        Role::HcFn => d(0.0, 0.5 / fan_in.sqrt()),
        Role::HcBase => d(0.0, 0.5),
        Role::HcScale => d(1.0, 0.1),
        Role::AttnSink => d(0.0, 0.1),
        Role::GateBias => d(0.0, 0.01),
        Role::Ape => d(0.0, 0.1),
        Role::Tid2eid => d(0.0, 0.0),
    }
}

/// `n` values drawn for tensor `name` of a model seeded with `seed`.
fn sample(seed: u64, name: &str, n: usize, dist: &Dist) -> Vec<f32> {
    let base = tensor_seed(seed, name);
    let mut out = vec![0.0f32; n];
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut rng =
                SplitMix64::new(mix64(base ^ (c as u64).wrapping_mul(0xA24B_AED4_963E_E407)));
            for v in chunk {
                *v = dist.mean + dist.std * rng.normalish();
            }
        });
    out
}

/// `[rows, k]` distinct expert ids per row in `[0, experts)`: hash routing picks k
/// different experts for a token.
fn tid2eid(seed: u64, name: &str, rows: usize, k: usize, experts: usize) -> Vec<u8> {
    let mut rng = SplitMix64::new(tensor_seed(seed, name));
    let mut ids: Vec<i64> = (0..experts as i64).collect();
    let mut out = Vec::with_capacity(rows * k * 8);
    for _ in 0..rows {
        // Partial Fisher-Yates: the first k entries become a random k-subset.
        for i in 0..k.min(experts) {
            let j = i + rng.below((experts - i) as u64) as usize;
            ids.swap(i, j);
            out.extend_from_slice(&ids[i].to_le_bytes());
        }
    }
    out
}

fn bf16_bytes(vals: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; vals.len() * 2];
    out.par_chunks_mut(2)
        .zip(vals.par_iter())
        .for_each(|(o, &v)| {
            o.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        });
    out
}

fn f32_bytes(vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The stored bytes of `t`, one buffer per entry of `t.stored()` (weight, then scale).
/// `experts` bounds tid2eid values.
pub fn tensor_data(t: &ExpectedTensor, seed: u64, experts: usize) -> Vec<Vec<u8>> {
    let n: usize = t.shape.iter().product();
    if t.role == Role::Tid2eid {
        let (rows, k) = (
            t.shape.first().copied().unwrap_or(0),
            t.shape.get(1).copied().unwrap_or(0),
        );
        return vec![tid2eid(seed, &t.name, rows, k, experts)];
    }
    let vals = sample(seed, &t.name, n, &dist(t.role, &t.shape));
    let (rows, cols) = (
        t.shape.first().copied().unwrap_or(0),
        t.shape.get(1).copied().unwrap_or(0),
    );
    match t.storage {
        Storage::Plain(Dtype::BF16) => vec![bf16_bytes(&vals)],
        Storage::Plain(_) => vec![f32_bytes(&vals)],
        Storage::Fp8 { block } => {
            let (codes, scales) = quantize_fp8(&vals, rows, cols, block);
            vec![codes, scales]
        }
        Storage::Fp4 => {
            let (packed, scales) = quantize_fp4(&vals, rows, cols);
            vec![packed, scales]
        }
    }
}
