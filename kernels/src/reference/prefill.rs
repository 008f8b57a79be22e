//! CPU references of the batched-prefill kernels (`cuda/prefill_*.cu`): plain loops, f64 sums where the order
//! should not matter. The FP8 dense GEMM's reference is [`super::fp8_gemv`] (any row count) and the routed-expert
//! GEMM's is [`super::fp4_expert`] (same per-slot semantics).
use half::bf16;

/// y[m, n] = sum_k x[m, k] * w[n, k] with bf16 weights.
pub fn bf16_gemm(x: &[bf16], w: &[bf16], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for r in 0..n {
        let wr = &w[r * k..(r + 1) * k];
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let acc: f64 = xr
                .iter()
                .zip(wr)
                .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
                .sum();
            y[i * n + r] = acc as f32;
        }
    }
    y
}

/// `pf_kperm`: x `[rows, k]` in the K order of pf_wgmma_fp4_expert, `[rows, kp]` with kp = k rounded up to 128
/// (zeros past k). In each 128-wide chunk, bf16 pair q = 16j + 4i + t (j, i, t < 4) holds x[8(4t + j) + 2i] and
/// x[8(4t + j) + 2i + 1]: the k that the kernel's thread t pairs from word 4t + j of a device-layout FP4 row.
pub fn kperm(x: &[bf16], rows: usize, k: usize) -> Vec<bf16> {
    let kp = k.div_ceil(128) * 128;
    let mut out = vec![bf16::ZERO; rows * kp];
    for r in 0..rows {
        for c in 0..kp / 128 {
            for q in 0..64 {
                let (j, i, t) = (q / 16, (q / 4) % 4, q % 4);
                for h in 0..2 {
                    let src = c * 128 + 8 * (4 * t + j) + 2 * i + h;
                    if src < k {
                        out[r * kp + c * 128 + 2 * q + h] = x[r * k + src];
                    }
                }
            }
        }
    }
    out
}

/// [`swiglu`]'s result: h bf16 `[slots, inter]` and the FP8 scale of each 128-block (1 without quantisation).
pub struct Swiglu {
    pub h: Vec<bf16>,
    pub scales: Vec<f32>,
}

/// The routed SwiGLU of `moe_swiglu` / `pf_swiglu_kperm` (natural K order): h = silu(min(g, L)) * clamp(u, -L,
/// L) * wt (no clamp for L <= 0, wt 1 without weights) in f32; then bf16, or (`quant`) FP8 fake quantisation
/// from f32 in blocks of 128 along the row (a shorter last block) with the UE8M0 scale of `act_quant`.
pub fn swiglu(
    g: &[f32],
    u: &[f32],
    wt: Option<&[f32]>,
    inter: usize,
    limit: f32,
    quant: bool,
) -> Swiglu {
    let mut out = Swiglu {
        h: Vec::with_capacity(g.len()),
        scales: Vec::new(),
    };
    for (s, (gr, ur)) in g.chunks(inter).zip(u.chunks(inter)).enumerate() {
        let w = wt.map_or(1.0, |w| w[s]);
        let row: Vec<f32> = gr
            .iter()
            .zip(ur)
            .map(|(&g, &u)| {
                let (g, u) = if limit > 0.0 {
                    (g.min(limit), u.clamp(-limit, limit))
                } else {
                    (g, u)
                };
                g / (1.0 + (-g).exp()) * u * w
            })
            .collect();
        for blk in row.chunks(128) {
            if !quant {
                out.scales.push(1.0);
                out.h.extend(blk.iter().map(|&v| bf16::from_f32(v)));
                continue;
            }
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-4);
            let bits = (amax / 448.0).to_bits();
            let sc =
                f32::from_bits((((bits >> 23) & 0xff) + u32::from(bits & 0x7f_ffff != 0)) << 23);
            out.scales.push(sc);
            out.h.extend(blk.iter().map(|&v| {
                let c = super::formats::f32_to_e4m3((v / sc).clamp(-448.0, 448.0));
                bf16::from_f32(super::formats::e4m3_to_f32(c) * sc)
            }));
        }
    }
    out
}

/// Where the rows of one prefill call live: per row its sequence slot, position, and the row / position at
/// which its sequence's rows start in the call.
#[derive(Debug, Clone, Default)]
pub struct PfRows {
    pub slots: Vec<i32>,
    pub positions: Vec<i32>,
    pub row0: Vec<i32>,
    pub pos0: Vec<i32>,
}

/// Shapes of one attention layer for [`sparse_attention`].
#[derive(Debug, Clone, Copy)]
pub struct PfAttnShape {
    pub heads: usize,
    pub dim: usize,
    pub window: usize,
    /// 0: window only; else the compression ratio.
    pub ratio: usize,
    pub cap: usize,
    /// Top-k of the CSA selection (used when `sel` is given).
    pub k: usize,
    pub rdim: usize,
    pub groups: usize,
    pub scale: f32,
}

/// The key rows (as slices of `kv` / `ring` / `comp`) of query row `r`, in the kernel's order.
fn keys_of<'a>(
    sh: &PfAttnShape,
    rows: &PfRows,
    r: usize,
    kv: &'a [bf16],
    ring: &'a [bf16],
    comp: &'a [bf16],
    sel: Option<&[i32]>,
) -> Vec<&'a [bf16]> {
    let d = sh.dim;
    let pos = rows.positions[r] as usize;
    let slot = rows.slots[r] as usize;
    let (p0, r0) = (rows.pos0[r] as usize, rows.row0[r] as usize);
    let nwin = (pos + 1).min(sh.window);
    let mut keys = Vec::new();
    for q in pos + 1 - nwin..=pos {
        keys.push(if q >= p0 {
            &kv[(r0 + q - p0) * d..][..d]
        } else {
            &ring[(slot * sh.window + q % sh.window) * d..][..d]
        });
    }
    if let Some(n) = (pos + 1).checked_div(sh.ratio) {
        let n = n.min(sh.cap);
        let entries: Vec<usize> = match sel {
            Some(s) => s[r * sh.k..][..n.min(sh.k)]
                .iter()
                .map(|&e| e as usize)
                .collect(),
            None => (0..n).collect(),
        };
        keys.extend(
            entries
                .iter()
                .map(|&e| &comp[(slot * sh.cap + e) * d..][..d]),
        );
    }
    keys
}

/// Sparse attention with sink of every row (spec 2.4), output `[groups, rows, heads/groups * dim]` f32 after
/// the inverse RoPE at each row's position (angle in f64 as the kernels do). `freqs` has `rdim/2` entries.
#[allow(clippy::too_many_arguments)]
pub fn sparse_attention(
    sh: &PfAttnShape,
    rows: &PfRows,
    q: &[bf16],
    kv: &[bf16],
    ring: &[bf16],
    comp: &[bf16],
    sel: Option<&[i32]>,
    sink: &[f32],
    freqs: &[f32],
) -> Vec<f32> {
    let (h, d) = (sh.heads, sh.dim);
    let n = rows.positions.len();
    let hpg = h / sh.groups;
    let mut out = vec![0f32; n * h * d];
    for r in 0..n {
        let keys = keys_of(sh, rows, r, kv, ring, comp, sel);
        let pos = rows.positions[r];
        for head in 0..h {
            let qh = &q[(r * h + head) * d..][..d];
            let z: Vec<f64> = keys
                .iter()
                .map(|k| {
                    let dot: f64 = qh
                        .iter()
                        .zip(k.iter())
                        .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
                        .sum();
                    dot * f64::from(sh.scale)
                })
                .collect();
            let s = f64::from(sink[head]);
            let mx = z.iter().fold(s, |m, &v| m.max(v));
            let den: f64 = z.iter().map(|v| (v - mx).exp()).sum::<f64>() + (s - mx).exp();
            let mut o = vec![0f64; d];
            for (zj, k) in z.iter().zip(&keys) {
                let p = (zj - mx).exp() / den;
                for (ov, kv) in o.iter_mut().zip(k.iter()) {
                    *ov += p * f64::from(kv.to_f32());
                }
            }
            let mut of: Vec<f32> = o.iter().map(|&v| v as f32).collect();
            rope_inverse(&mut of, sh.rdim, freqs, pos);
            let g = head / hpg;
            let dst = ((g * n + r) * hpg + head % hpg) * d;
            out[dst..dst + d].copy_from_slice(&of);
        }
    }
    out
}

/// Inverse interleaved RoPE of the last `rdim` channels at `pos` (f64 angle, like the kernels).
pub fn rope_inverse(v: &mut [f32], rdim: usize, freqs: &[f32], pos: i32) {
    let start = v.len() - rdim;
    for i in 0..rdim / 2 {
        let th = f64::from(pos) * f64::from(freqs[i]);
        let (sn, cs) = ((-th).sin() as f32, th.cos() as f32);
        let (a, b) = (v[start + 2 * i], v[start + 2 * i + 1]);
        v[start + 2 * i] = a * cs - b * sn;
        v[start + 2 * i + 1] = a * sn + b * cs;
    }
}

/// Indexer scores of row `r` over its visible entries (empty when they are at most `k`: all get selected).
#[allow(clippy::too_many_arguments)]
pub fn index_scores(
    rows: &PfRows,
    r: usize,
    q: &[bf16],
    wts: &[f32],
    wts_stride: usize,
    keys: &[bf16],
    heads: usize,
    dim: usize,
    cap: usize,
    ratio: usize,
    k: usize,
    scale: f32,
) -> Vec<f32> {
    let pos = rows.positions[r] as usize;
    let slot = rows.slots[r] as usize;
    let n = ((pos + 1) / ratio).min(cap);
    if n <= k {
        return Vec::new();
    }
    (0..n)
        .map(|w| {
            let key = &keys[(slot * cap + w) * dim..][..dim];
            let s: f64 = (0..heads)
                .map(|h| {
                    let qh = &q[(r * heads + h) * dim..][..dim];
                    let dot: f64 = qh
                        .iter()
                        .zip(key)
                        .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
                        .sum();
                    f64::from(wts[r * wts_stride + h] * scale) * dot.max(0.0)
                })
                .sum();
            s as f32
        })
        .collect()
}

/// One compressor's streaming state for one sequence in the decode kernel's layout (spec 3): `[srows, width]`
/// kappa and gamma (ape included), srows = 2m with overlap (rows 0..m previous window, m..2m current), else m.
#[derive(Debug, Clone, PartialEq)]
pub struct CompState {
    pub kv: Vec<f32>,
    pub sc: Vec<f32>,
}

/// Shapes of one compressor for [`compress_decode`].
#[derive(Debug, Clone, Copy)]
pub struct CompShape {
    pub ratio: usize,
    pub overlap: bool,
    pub dc: usize,
}

impl CompShape {
    pub fn width(&self) -> usize {
        if self.overlap {
            2 * self.dc
        } else {
            self.dc
        }
    }
    pub fn srows(&self) -> usize {
        if self.overlap {
            2 * self.ratio
        } else {
            self.ratio
        }
    }
    /// The reset state: kappa 0, gamma -inf.
    pub fn fresh(&self) -> CompState {
        let n = self.srows() * self.width();
        CompState {
            kv: vec![0.0; n],
            sc: vec![f32::NEG_INFINITY; n],
        }
    }
}

/// Feeds tokens at positions `pos0..` (projections `kappa`/`gamma` rows of `width`, gamma without ape) to the
/// state one at a time, as the decode kernel does, and returns the pooled entries `(w, raw pooled [dc])`
/// (before norm / rope / quantisation).
pub fn compress_decode(
    sh: &CompShape,
    st: &mut CompState,
    pos0: usize,
    kappa: &[f32],
    gamma: &[f32],
    ape: &[f32],
) -> Vec<(usize, Vec<f32>)> {
    let (m, w) = (sh.ratio, sh.width());
    let mut out = Vec::new();
    for (i, (kr, gr)) in kappa.chunks(w).zip(gamma.chunks(w)).enumerate() {
        let pos = pos0 + i;
        let j = pos % m;
        let row = if sh.overlap { m + j } else { j };
        for c in 0..w {
            st.kv[row * w + c] = kr[c];
            st.sc[row * w + c] = gr[c] + ape[j * w + c];
        }
        if !(pos + 1).is_multiple_of(m) {
            continue;
        }
        let pooled: Vec<f32> = (0..sh.dc)
            .map(|c| {
                let cell = |r: usize| {
                    let ch = if sh.overlap && r >= m { c + sh.dc } else { c };
                    (f64::from(st.kv[r * w + ch]), f64::from(st.sc[r * w + ch]))
                };
                let mx = (0..sh.srows()).fold(f64::NEG_INFINITY, |a, r| a.max(cell(r).1));
                let (mut num, mut den) = (0f64, 0f64);
                for r in 0..sh.srows() {
                    let (k, g) = cell(r);
                    let e = (g - mx).exp();
                    den += e;
                    num += e * k;
                }
                (num / den) as f32
            })
            .collect();
        out.push((pos / m, pooled));
        if sh.overlap {
            let (prev, cur) = st.kv.split_at_mut(m * w);
            prev.copy_from_slice(cur);
            let (prev, cur) = st.sc.split_at_mut(m * w);
            prev.copy_from_slice(cur);
        }
    }
    out
}

/// `v * (mean(v^2) + eps)^-1/2 * w`, f32 like the kernels.
pub fn rmsnorm_f32(v: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ss: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let inv = (1.0 / (ss / v.len() as f64 + f64::from(eps)).sqrt()) as f32;
    v.iter().zip(w).map(|(x, w)| w * (x * inv)).collect()
}

/// Checks a `pf_moe_group` result: `order` is a permutation of the slots grouped by expert, and the tiles
/// cover every expert's slots in order with at most `bm` rows each. Returns a description of the first
/// violation.
pub fn check_moe_group(ids: &[i32], order: &[i32], tiles: &[i32], bm: usize) -> Result<(), String> {
    let mut seen = vec![false; ids.len()];
    for &s in order {
        let s = usize::try_from(s).map_err(|_| format!("negative slot {s}"))?;
        if s >= ids.len() || seen[s] {
            return Err(format!("slot {s} out of range or repeated"));
        }
        seen[s] = true;
    }
    let count = usize::try_from(tiles[0]).map_err(|_| "negative tile count".to_string())?;
    let mut next = 0usize;
    for t in 0..count {
        let (e, begin, rows) = (tiles[1 + 3 * t], tiles[2 + 3 * t], tiles[3 + 3 * t]);
        let (begin, rows) = (begin as usize, rows as usize);
        if begin != next || rows == 0 || rows > bm {
            return Err(format!(
                "tile {t}: begin {begin} rows {rows}, expected begin {next}"
            ));
        }
        if let Some(&s) = order[begin..begin + rows]
            .iter()
            .find(|&&s| ids[s as usize] != e)
        {
            return Err(format!(
                "tile {t} of expert {e} holds slot {s} of expert {}",
                ids[s as usize]
            ));
        }
        next = begin + rows;
    }
    if next != ids.len() {
        return Err(format!("tiles cover {next} of {} slots", ids.len()));
    }
    Ok(())
}
