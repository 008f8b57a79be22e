//! CPU references of the kernels (f32 math, f64 accumulation where the order should not matter).
use half::bf16;

use super::formats::{e2m1_to_f32, e4m3_to_f32, f32_to_e4m3, ue8m0};

/// y[b, n] = sum_k x[b, k] * e4m3(w[n, k]) * S[n/128, k/128]; `w` [n, k], `s` [ceil(n/128), ceil(k/128)].
pub fn fp8_gemv(x: &[bf16], w: &[u8], s: &[u8], b: usize, n: usize, k: usize) -> Vec<f32> {
    fp8_gemv_terms(x, w, s, (b, n, k), |t| t)
}

/// sum_k |x[b, k] * W[n, k]| of [`fp8_gemv`]: the scale of its f32 accumulation error (the tests' bounds).
pub fn fp8_gemv_abs(x: &[bf16], w: &[u8], s: &[u8], b: usize, n: usize, k: usize) -> Vec<f32> {
    fp8_gemv_terms(x, w, s, (b, n, k), f64::abs)
}

/// sum_k term(x[b, k] * W[n, k]) in f64, rounded to f32 once.
fn fp8_gemv_terms(
    x: &[bf16],
    w: &[u8],
    s: &[u8],
    (b, n, k): (usize, usize, usize),
    term: impl Fn(f64) -> f64,
) -> Vec<f32> {
    let kb = k.div_ceil(128);
    let mut y = vec![0f32; b * n];
    for r in 0..n {
        let wrow: Vec<f32> = (0..k)
            .map(|j| e4m3_to_f32(w[r * k + j]) * ue8m0(s[(r / 128) * kb + j / 128]))
            .collect();
        for bi in 0..b {
            let xr = &x[bi * k..(bi + 1) * k];
            let acc: f64 = xr
                .iter()
                .zip(&wrow)
                .map(|(a, w)| term(f64::from(a.to_f32()) * f64::from(*w)))
                .sum();
            y[bi * n + r] = acc as f32;
        }
    }
    y
}

/// Routed experts: y[i, n] = sum_j x[r(i), j] * fp4(w[e, n, j]) * S[e, n, j/32] for slot i = b*topk + t,
/// e = ids[i], r(i) = i if `x_per_slot` else b. Slots with an id outside [0, experts) are left 0.
#[allow(clippy::too_many_arguments)]
pub fn fp4_expert(
    x: &[bf16],
    w: &[u8],
    s: &[u8],
    ids: &[i32],
    topk: usize,
    experts: usize,
    n: usize,
    k: usize,
    x_per_slot: bool,
) -> Vec<f32> {
    let shape = (topk, experts, n, k, x_per_slot);
    per_slot(x, ids, shape, |row, j| {
        let byte = w[(row + j) / 2];
        let nib = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
        e2m1_to_f32(nib) * ue8m0(s[row / 32 + j / 32])
    })
}

/// Routed experts with bf16 weights: y[i, n] = sum_j x[r(i), j] * w[e, n, j] for slot i = b*topk + t,
/// e = ids[i], r(i) = i if `x_per_slot` else b; `w` [experts, n, k]. Slots with an id outside
/// [0, experts) are left 0.
#[allow(clippy::too_many_arguments)]
pub fn bf16_expert(
    x: &[bf16],
    w: &[bf16],
    ids: &[i32],
    topk: usize,
    experts: usize,
    n: usize,
    k: usize,
    x_per_slot: bool,
) -> Vec<f32> {
    let shape = (topk, experts, n, k, x_per_slot);
    per_slot(x, ids, shape, |row, j| w[row + j].to_f32())
}

/// The routed-expert loop both references share: for every slot with a valid expert e and every output
/// row r, sum_j x[r(i), j] * weight(element offset of (e, r, 0), j) in f64. `shape` = (topk, experts, n,
/// k, x_per_slot).
fn per_slot(
    x: &[bf16],
    ids: &[i32],
    (topk, experts, n, k, x_per_slot): (usize, usize, usize, usize, bool),
    weight: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    let mut y = vec![0f32; ids.len() * n];
    for (i, &id) in ids.iter().enumerate() {
        let Ok(e) = usize::try_from(id) else { continue };
        if e >= experts {
            continue;
        }
        let xr = if x_per_slot { i } else { i / topk };
        let xrow = &x[xr * k..(xr + 1) * k];
        for r in 0..n {
            let row = (e * n + r) * k;
            let acc: f64 = xrow
                .iter()
                .enumerate()
                .map(|(j, xv)| f64::from(xv.to_f32()) * f64::from(weight(row, j)))
                .sum();
            y[i * n + r] = acc as f32;
        }
    }
    y
}

/// RMSNorm with f32 weight over rows of width `d`.
pub fn rmsnorm(x: &[bf16], w: &[f32], d: usize, eps: f32) -> Vec<bf16> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let ss: f32 = row.iter().map(|v| v.to_f32() * v.to_f32()).sum();
        let inv = 1.0 / (ss / d as f32 + eps).sqrt();
        y.extend(
            row.iter()
                .zip(w)
                .map(|(v, wv)| bf16::from_f32(wv * (v.to_f32() * inv))),
        );
    }
    y
}

/// Result of [`act_quant`].
pub struct ActQuant {
    pub q: Vec<u8>,
    pub scales: Vec<f32>,
    /// bf16(e4m3(q) * s): the fake-quant output.
    pub deq: Vec<bf16>,
}

/// Per-`block` FP8 quantisation with UE8M0 scale 2^ceil(log2(max(amax, 1e-4) / 448)).
pub fn act_quant(x: &[bf16], block: usize) -> ActQuant {
    let mut out = ActQuant {
        q: Vec::new(),
        scales: Vec::new(),
        deq: Vec::new(),
    };
    for blk in x.chunks(block) {
        let amax = blk
            .iter()
            .fold(0f32, |m, v| m.max(v.to_f32().abs()))
            .max(1e-4);
        let r = amax / 448.0;
        let bits = r.to_bits();
        let e = (bits >> 23) & 0xff;
        let s = f32::from_bits((e + u32::from(bits & 0x7f_ffff != 0)) << 23);
        out.scales.push(s);
        for v in blk {
            let c = f32_to_e4m3((v.to_f32() / s).clamp(-448.0, 448.0));
            out.q.push(c);
            out.deq.push(bf16::from_f32(e4m3_to_f32(c) * s));
        }
    }
    out
}
