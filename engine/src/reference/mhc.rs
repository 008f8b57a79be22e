//! Manifold-constrained hyper-connections (spec §2.3): `n` residual streams per token, collapsed
//! before each sub-block (HCPre), re-expanded after it (HCPost), and collapsed once at the end
//! (HCHead).

use super::ops::{dot, rms_inv, sigmoid};
use super::weights::HcParams;

/// Per-token mixing coefficients produced by HCPre.
#[derive(Debug, Clone)]
pub struct HcMix {
    /// `[n]` per token: weight of the sub-block output added to each stream.
    pub post: Vec<f32>,
    /// `[n, n]` per token: `comb[i][k]` mixes source stream `i` into destination stream `k`.
    pub comb: Vec<f32>,
}

/// The mixer logits `μ = (fn · x) · rms(x)^-1` of one token's flattened streams.
fn mixer_logits(hc: &HcParams, x: &[f32], eps: f32) -> Vec<f32> {
    let inv = rms_inv(x, eps);
    hc.func
        .chunks(x.len())
        .map(|row| dot(row, x) * inv)
        .collect()
}

/// Weighted sum of the `n` streams of one token (un-normalised streams).
fn collapse(x: &[f32], weights: &[f32], out: &mut [f32]) {
    let d = out.len();
    out.iter_mut().for_each(|v| *v = 0.0);
    for (j, &wj) in weights.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(&x[j * d..(j + 1) * d]) {
            *o += wj * v;
        }
    }
}

/// HCPre over `rows` tokens of streams `[rows, n, d]`: returns the collapsed input `[rows, d]`
/// and the post/comb mix for HCPost.
pub fn hc_pre(
    hc: &HcParams,
    streams: &[f32],
    n: usize,
    d: usize,
    norm_eps: f32,
    hc_eps: f32,
    sinkhorn_iters: usize,
) -> (Vec<f32>, Vec<HcMix>) {
    let rows = streams.len() / (n * d);
    let mut collapsed = vec![0.0f32; rows * d];
    let mut mixes = Vec::with_capacity(rows);
    for (x, out) in streams.chunks(n * d).zip(collapsed.chunks_mut(d)) {
        let mu = mixer_logits(hc, x, norm_eps);
        let pre: Vec<f32> = (0..n)
            .map(|j| sigmoid(mu[j] * hc.scale[0] + hc.base[j]) + hc_eps)
            .collect();
        let post = (0..n)
            .map(|j| 2.0 * sigmoid(mu[n + j] * hc.scale[1] + hc.base[n + j]))
            .collect();
        let logits: Vec<f32> = (0..n * n)
            .map(|ik| mu[2 * n + ik] * hc.scale[2] + hc.base[2 * n + ik])
            .collect();
        let comb = sinkhorn(&logits, n, hc_eps, sinkhorn_iters);
        collapse(x, &pre, out);
        mixes.push(HcMix { post, comb });
    }
    (collapsed, mixes)
}

/// Sinkhorn normalisation of an `n x n` logit matrix: row softmax (+eps), column normalise,
/// then `iters - 1` (row, column) normalisation pairs, all with `+eps` in the denominators.
pub fn sinkhorn(logits: &[f32], n: usize, eps: f32, iters: usize) -> Vec<f32> {
    let mut p = vec![0.0f32; n * n];
    for i in 0..n {
        let row = &logits[i * n..(i + 1) * n];
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let sum: f32 = row.iter().map(|&v| (v - m).exp()).sum();
        for k in 0..n {
            p[i * n + k] = (row[k] - m).exp() / sum + eps;
        }
    }
    normalize_columns(&mut p, n, eps);
    for _ in 1..iters {
        normalize_rows(&mut p, n, eps);
        normalize_columns(&mut p, n, eps);
    }
    p
}

fn normalize_rows(p: &mut [f32], n: usize, eps: f32) {
    for row in p.chunks_mut(n) {
        let s: f32 = row.iter().sum::<f32>() + eps;
        row.iter_mut().for_each(|v| *v /= s);
    }
}

fn normalize_columns(p: &mut [f32], n: usize, eps: f32) {
    for k in 0..n {
        let s: f32 = (0..n).map(|i| p[i * n + k]).sum::<f32>() + eps;
        (0..n).for_each(|i| p[i * n + k] /= s);
    }
}

/// HCPost: new stream `k = post_k · f + Σ_i comb[i,k] · X_i`, in place on `streams`.
pub fn hc_post(f: &[f32], streams: &mut [f32], mixes: &[HcMix], n: usize, d: usize) {
    let mut old = vec![0.0f32; n * d];
    for ((x, fr), mix) in streams.chunks_mut(n * d).zip(f.chunks(d)).zip(mixes) {
        old.copy_from_slice(x);
        for k in 0..n {
            let dst = &mut x[k * d..(k + 1) * d];
            for (c, v) in dst.iter_mut().enumerate() {
                let mut acc = mix.post[k] * fr[c];
                for i in 0..n {
                    acc += mix.comb[i * n + k] * old[i * d + c];
                }
                *v = acc;
            }
        }
    }
}

/// HCHead: the final collapse of `[rows, n, d]` streams to `[rows, d]` (no Sinkhorn, no post).
pub fn hc_head(
    hc: &HcParams,
    streams: &[f32],
    n: usize,
    d: usize,
    norm_eps: f32,
    hc_eps: f32,
) -> Vec<f32> {
    let rows = streams.len() / (n * d);
    let mut out = vec![0.0f32; rows * d];
    for (x, o) in streams.chunks(n * d).zip(out.chunks_mut(d)) {
        let mu = mixer_logits(hc, x, norm_eps);
        let pre: Vec<f32> = (0..n)
            .map(|j| sigmoid(mu[j] * hc.scale[0] + hc.base[j]) + hc_eps)
            .collect();
        collapse(x, &pre, o);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinkhorn_is_nearly_doubly_stochastic() {
        let logits: Vec<f32> = (0..16).map(|i| ((i * 5 % 7) as f32) * 0.7 - 2.0).collect();
        let p = sinkhorn(&logits, 4, 1e-6, 20);
        for k in 0..4 {
            let col: f32 = (0..4).map(|i| p[i * 4 + k]).sum();
            assert!((col - 1.0).abs() < 1e-4, "column {k} sums to {col}");
        }
        for i in 0..4 {
            let row: f32 = p[i * 4..i * 4 + 4].iter().sum();
            assert!((row - 1.0).abs() < 1e-2, "row {i} sums to {row}");
        }
    }
}
