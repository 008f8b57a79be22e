//! mHC references (cuda/mhc.cu): HCPost on bf16 streams and HCPre / HCHead with the RMSNorm after them.
use half::bf16;

/// Residual streams per token.
const N: usize = 4;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// HCPost in place on `x` bf16 `[rows, 4, d]`: X'_k = bf16(post_k f + sum_i comb[i, k] X_i), with `mix`
/// f32 `[rows, 24]` (post[4], comb[16] row-major) and `f` the sub-block output `[rows, d]` (f32 values of
/// bf16 numbers).
pub fn hc_post(x: &mut [bf16], mix: &[f32], f: &[f32], d: usize) {
    for ((xr, mo), fr) in x.chunks_mut(N * d).zip(mix.chunks(24)).zip(f.chunks(d)) {
        for c in 0..d {
            let old: Vec<f32> = (0..N).map(|i| xr[i * d + c].to_f32()).collect();
            for k in 0..N {
                let acc = mo[k] * fr[c] + (0..N).map(|i| mo[4 + i * 4 + k] * old[i]).sum::<f32>();
                xr[k * d + c] = bf16::from_f32(acc);
            }
        }
    }
}

/// The mixer parameters of [`hc_pre`]: `func` f32 `[m, 4d]`, `base` `[m]`, `scale` `[3]` (head: `[1]`);
/// m = 24 for a block mixer, 4 for the HC head.
pub struct HcRef<'a> {
    pub func: &'a [f32],
    pub base: &'a [f32],
    pub scale: &'a [f32],
    pub norm_w: &'a [f32],
    pub eps: f32,
    pub hc_eps: f32,
    pub iters: usize,
}

/// Output of [`hc_pre`]: `y` the normalised collapse (f32, before its bf16 store) `[rows, d]`, `mix`
/// `[rows, 20]` post[4] then comb[16] (block mixers only).
pub struct HcOut {
    pub y: Vec<f32>,
    pub mix: Vec<f32>,
}

/// HCPre (or HCHead, `func.len() == 4 * 4d`) of `x` bf16 `[rows, 4, d]` then RMSNorm with `norm_w`.
pub fn hc_pre(p: &HcRef<'_>, x: &[bf16], d: usize) -> HcOut {
    let m = p.func.len() / (N * d);
    let mut out = HcOut {
        y: Vec::new(),
        mix: Vec::new(),
    };
    for xr in x.chunks(N * d) {
        let xf: Vec<f32> = xr.iter().map(|v| v.to_f32()).collect();
        let ss: f32 = xf.iter().map(|v| v * v).sum();
        let rho = 1.0 / (ss / (N * d) as f32 + p.eps).sqrt();
        let mu: Vec<f32> = p
            .func
            .chunks(N * d)
            .map(|row| row.iter().zip(&xf).map(|(a, b)| a * b).sum::<f32>() * rho)
            .collect();
        if m > N {
            out.mix
                .extend((0..N).map(|j| 2.0 * sigmoid(mu[N + j] * p.scale[1] + p.base[N + j])));
            let l: Vec<f32> = (0..16)
                .map(|i| mu[8 + i] * p.scale[2] + p.base[8 + i])
                .collect();
            out.mix.extend(sinkhorn(&l, p.hc_eps, p.iters));
        }
        let pre: Vec<f32> = (0..N)
            .map(|j| sigmoid(mu[j] * p.scale[0] + p.base[j]) + p.hc_eps)
            .collect();
        let a: Vec<f32> = (0..d)
            .map(|c| {
                let s: f32 = (0..N).map(|j| pre[j] * xf[j * d + c]).sum();
                bf16::from_f32(s).to_f32()
            })
            .collect();
        let ss: f32 = a.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / d as f32 + p.eps).sqrt();
        out.y
            .extend(a.iter().zip(p.norm_w).map(|(v, w)| w * (v * inv)));
    }
    out
}

/// 4x4 Sinkhorn: row softmax + eps, column normalise, then `iters - 1` row/column pairs (+eps in every
/// denominator).
fn sinkhorn(l: &[f32], eps: f32, iters: usize) -> Vec<f32> {
    let mut p = vec![0f32; 16];
    for i in 0..N {
        let row = &l[i * N..(i + 1) * N];
        let mx = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let s: f32 = row.iter().map(|v| (v - mx).exp()).sum();
        (0..N).for_each(|k| p[i * N + k] = (row[k] - mx).exp() / s + eps);
    }
    for it in 0..iters {
        if it > 0 {
            for i in 0..N {
                let s: f32 = p[i * N..(i + 1) * N].iter().sum::<f32>() + eps;
                p[i * N..(i + 1) * N].iter_mut().for_each(|v| *v /= s);
            }
        }
        for k in 0..N {
            let s: f32 = (0..N).map(|i| p[i * N + k]).sum::<f32>() + eps;
            (0..N).for_each(|i| p[i * N + k] /= s);
        }
    }
    p
}
