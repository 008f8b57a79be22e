//! CPU references of the split kernels (cuda/split.cu).
use half::bf16;

/// Every buffer's first `n` elements replaced by their sum over buffers, added in buffer order.
pub fn rank_sum(bufs: &mut [Vec<f32>], n: usize) {
    for i in 0..n {
        let s = bufs.iter().skip(1).fold(bufs[0][i], |s, b| s + b[i]);
        bufs.iter_mut().for_each(|b| b[i] = s);
    }
}

/// Global expert ids as ids of the range `[e0, e1)`, -1 outside.
pub fn moe_localize(ids: &[i32], e0: i32, e1: i32) -> Vec<i32> {
    ids.iter()
        .map(|&e| if (e0..e1).contains(&e) { e - e0 } else { -1 })
        .collect()
}

/// `out[r, c] = sum_k y[r*topk + k, c] (local id >= 0, k in order) + shared[r, c]`.
pub fn moe_rank_sum(
    y: &[f32],
    local: &[i32],
    shared: Option<&[f32]>,
    rows: usize,
    topk: usize,
    d: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; rows * d];
    for r in 0..rows {
        for c in 0..d {
            let mut s = 0f32;
            for k in 0..topk {
                let slot = r * topk + k;
                if local[slot] >= 0 {
                    s += y[slot * d + c];
                }
            }
            out[r * d + c] = shared.map_or(s, |sh| s + sh[r * d + c]);
        }
    }
    out
}

/// Columns `c0..c0 + w` of every row of `x` [rows, width].
pub fn gather_cols(x: &[bf16], width: usize, c0: usize, w: usize) -> Vec<bf16> {
    x.chunks(width)
        .flat_map(|row| row[c0..c0 + w].iter().copied())
        .collect()
}
