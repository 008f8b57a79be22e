//! Plain f32 building blocks: matrix products, norms and activations.

use rayon::prelude::*;

/// Dot product with eight independent accumulators so the compiler vectorises it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (xa, xb) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for i in 0..8 {
            acc[i] += xa[i] * xb[i];
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    acc.iter().sum::<f32>() + tail
}

/// `y[t, o] = Σ_i x[t, i] · w[o, i]` (PyTorch `Linear` convention, `w` is `[out, in]`).
pub fn matmul_t(x: &[f32], w: &[f32], inp: usize, out: usize) -> Vec<f32> {
    let rows = x.len() / inp;
    let mut y = vec![0.0f32; rows * out];
    if rows >= 4 {
        y.par_chunks_mut(out)
            .zip(x.par_chunks(inp))
            .for_each(|(yr, xr)| {
                for (o, v) in yr.iter_mut().enumerate() {
                    *v = dot(xr, &w[o * inp..(o + 1) * inp]);
                }
            });
    } else {
        // Few rows (decode): split the output features across threads instead.
        for (yr, xr) in y.chunks_mut(out).zip(x.chunks(inp)) {
            yr.par_chunks_mut(256).enumerate().for_each(|(blk, ys)| {
                for (j, v) in ys.iter_mut().enumerate() {
                    let o = blk * 256 + j;
                    *v = dot(xr, &w[o * inp..(o + 1) * inp]);
                }
            });
        }
    }
    y
}

/// Root-mean-square normalisation of each row of width `weight.len()`, times the weight.
pub fn rmsnorm_rows(x: &mut [f32], weight: &[f32], eps: f32) {
    let width = weight.len();
    for row in x.chunks_mut(width) {
        let inv = rms_inv(row, eps);
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * inv * w;
        }
    }
}

/// Weightless RMS normalisation of each chunk of `width` values.
pub fn rms_scale_chunks(x: &mut [f32], width: usize, eps: f32) {
    for row in x.chunks_mut(width) {
        let inv = rms_inv(row, eps);
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

/// `(mean(x²) + eps)^(-1/2)`, accumulated in f64 so long rows stay accurate.
pub fn rms_inv(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    (1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt()) as f32
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `ln(1 + e^x)`, returning `x` above 20 as PyTorch does.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Indices of the `k` largest values (ties broken by lower index), in descending order.
pub fn top_k_indices(values: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    let k = k.min(values.len());
    let cmp = |a: &usize, b: &usize| values[*b].total_cmp(&values[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_naive_for_odd_shapes() {
        for (rows, inp, out) in [(1, 13, 517), (3, 9, 5), (7, 33, 300)] {
            let x: Vec<f32> = (0..rows * inp)
                .map(|i| ((i * 7 % 11) as f32) - 5.0)
                .collect();
            let w: Vec<f32> = (0..out * inp)
                .map(|i| ((i * 3 % 13) as f32) * 0.1)
                .collect();
            let y = matmul_t(&x, &w, inp, out);
            for t in 0..rows {
                for o in 0..out {
                    let want: f32 = (0..inp).map(|i| x[t * inp + i] * w[o * inp + i]).sum();
                    assert!((y[t * out + o] - want).abs() < 1e-3, "{rows}x{inp}x{out}");
                }
            }
        }
    }

    #[test]
    fn top_k_picks_largest() {
        let v = [0.5, 3.0, -1.0, 3.0, 2.0];
        assert_eq!(top_k_indices(&v, 3), vec![1, 3, 4]);
        assert_eq!(top_k_indices(&v, 9).len(), 5);
    }
}
