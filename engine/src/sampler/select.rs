//! Candidate filtering for one sampling step: temperature, top-k, top-p, min-p, and the draw.
//!
//! Works on unnormalised weights `w = exp((logit - max) / T)` (so the most likely token has
//! weight 1 and min-p is a plain threshold) and never sorts the whole vocabulary unless it
//! must: top-k uses a partial select, top-p sorts growing prefixes until the mass is reached.
//!
//! This is also the specification of the GPU sampler (`kernels/cuda/sample.cu`), which must pick
//! the same token for the same [`Draw`]: the weight is `exp` taken in f64 and rounded to f32 (both
//! sides' f64 `exp` round to the same f32), and the draw walks the surviving tokens in id order, an
//! order a parallel prefix sum can reproduce (a walk in weight order would need a full sort).

/// A token and its unnormalised probability.
pub(crate) type Candidate = (u32, f32);

/// Index of the largest logit (lowest index on ties; NaN never wins; 0 if none is finite).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// Descending weight, then ascending id: a total order, so results never depend on the
/// (unstable) selection algorithm.
fn by_weight_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Filter settings, already validated by the caller.
pub(crate) struct Filters {
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// >= 1 = off.
    pub top_p: f32,
    /// <= 0 = off.
    pub min_p: f32,
}

/// Tokens that survive the filters, with their weights (not normalised).
/// Order of application: top-k, then top-p relative to the top-k mass, then min-p (relative
/// to the best token, so unaffected by renormalisation).
pub(crate) fn candidates(logits: &[f32], f: &Filters) -> Vec<Candidate> {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return vec![(argmax(logits), 1.0)];
    }
    let inv_t = 1.0 / f.temperature;
    let weight = |l: f32| weight(l, max, inv_t);
    let min_w = f.min_p.max(0.0);
    let top_k_on = f.top_k > 0 && f.top_k < logits.len();
    let top_p_on = f.top_p < 1.0;

    if top_k_on {
        let mut all: Vec<Candidate> = (0..logits.len())
            .map(|i| (i as u32, weight(logits[i])))
            .collect();
        all.select_nth_unstable_by(f.top_k - 1, by_weight_desc);
        all.truncate(f.top_k);
        all.sort_unstable_by(by_weight_desc);
        let mass: f64 = all.iter().map(|c| f64::from(c.1)).sum();
        if top_p_on {
            cut_at_mass(&mut all, f.top_p, mass);
        }
        all.retain(|c| c.1 > 0.0 && c.1 >= min_w);
        return all;
    }

    // No top-k: the total mass is over the whole vocabulary, but tokens below the min-p
    // threshold can be dropped first: they sort after every token that passes it.
    let mut mass = 0.0f64;
    let mut kept: Vec<Candidate> = Vec::new();
    for (i, &l) in logits.iter().enumerate() {
        let w = weight(l);
        mass += f64::from(w);
        if w > 0.0 && w >= min_w {
            kept.push((i as u32, w));
        }
    }
    if top_p_on {
        nucleus(&mut kept, f.top_p, mass);
    }
    kept
}

/// `exp((l - max) * inv_t)` evaluated in f64 and rounded once to f32; NaN (from a NaN logit or
/// an infinite one) weighs nothing.
pub(crate) fn weight(l: f32, max: f32, inv_t: f32) -> f32 {
    let w = f64::from((l - max) * inv_t).exp() as f32;
    if w.is_nan() {
        0.0
    } else {
        w
    }
}

/// Keeps the smallest prefix of `sorted` whose weight reaches `p * mass` (at least one).
fn cut_at_mass(sorted: &mut Vec<Candidate>, p: f32, mass: f64) {
    let target = f64::from(p) * mass;
    let mut cum = 0.0f64;
    let mut keep = sorted.len();
    for (i, c) in sorted.iter().enumerate() {
        cum += f64::from(c.1);
        if cum >= target {
            keep = i + 1;
            break;
        }
    }
    sorted.truncate(keep.max(1));
}

/// Top-p over an unsorted candidate list: sort only the largest `n` (64, 512, ...) until
/// they hold enough mass; falls back to a full sort for very flat distributions.
fn nucleus(cands: &mut Vec<Candidate>, p: f32, mass: f64) {
    let target = f64::from(p) * mass;
    let mut n = 64usize;
    while n < cands.len() {
        cands.select_nth_unstable_by(n - 1, by_weight_desc);
        let head_mass: f64 = cands[..n].iter().map(|c| f64::from(c.1)).sum();
        if head_mass >= target {
            cands.truncate(n);
            break;
        }
        n = n.saturating_mul(8);
    }
    cands.sort_unstable_by(by_weight_desc);
    cut_at_mass(cands, p, mass);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(top_k: usize, top_p: f32, min_p: f32) -> Filters {
        Filters {
            temperature: 1.0,
            top_k,
            top_p,
            min_p,
        }
    }

    fn ids(c: &[Candidate]) -> Vec<u32> {
        let mut v: Vec<u32> = c.iter().map(|c| c.0).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn argmax_basics() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0]), 1);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn filters_keep_expected_sets() {
        // probs ~ [0.64, 0.24, 0.09, 0.03]
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        assert_eq!(ids(&candidates(&logits, &f(2, 1.0, 0.0))), vec![0, 1]);
        assert_eq!(ids(&candidates(&logits, &f(0, 0.5, 0.0))), vec![0]);
        assert_eq!(ids(&candidates(&logits, &f(0, 0.8, 0.0))), vec![0, 1]);
        assert_eq!(ids(&candidates(&logits, &f(0, 0.95, 0.0))), vec![0, 1, 2]);
        // min-p 0.3: keeps p >= 0.3 * p_max, i.e. weights >= 0.3: e^-1 = 0.37 passes, e^-2 not.
        assert_eq!(ids(&candidates(&logits, &f(0, 1.0, 0.3))), vec![0, 1]);
        // top-p is relative to the top-k mass: of {0,1} the first has 0.73 < 0.8.
        assert_eq!(ids(&candidates(&logits, &f(2, 0.8, 0.0))), vec![0, 1]);
        assert_eq!(ids(&candidates(&logits, &f(2, 0.7, 0.0))), vec![0]);
    }

    /// Brute force: full sort, cumulative cut.
    fn nucleus_reference(logits: &[f32], p: f64) -> Vec<u32> {
        let mut w: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, (l - 2.0).exp()))
            .collect();
        w.sort_by(by_weight_desc);
        let mass: f64 = w.iter().map(|c| f64::from(c.1)).sum();
        let mut cum = 0.0;
        let mut out = Vec::new();
        for c in w {
            out.push(c.0);
            cum += f64::from(c.1);
            if cum >= p * mass {
                break;
            }
        }
        out.sort_unstable();
        out
    }

    #[test]
    fn nucleus_on_a_flat_large_vocab_matches_full_sort() {
        let logits: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0)
            .collect();
        let fast = candidates(&logits, &f(0, 0.9, 0.0));
        assert!(fast.len() > 64);
        assert_eq!(ids(&fast), nucleus_reference(&logits, 0.9));
    }
}
