//! Mixture of experts (spec §2.8): sqrt-softplus gate scores, hash or bias-corrected top-k
//! routing, renormalised and scaled weights, clamped SwiGLU experts plus one shared expert.

use super::ops::{silu, softplus, top_k_indices};
use super::weights::{ExpertWeights, MoeWeights};
use crate::api::Numerics;
use crate::model::ModelConfig;

/// The routing decision of one token.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Routes every row of `m` `[T, D]`; `tokens[t]` is the token id of row `t`.
pub fn route(cfg: &ModelConfig, w: &MoeWeights, m: &[f32], tokens: &[u32]) -> Vec<Route> {
    let k = cfg.num_experts_per_tok;
    let logits = w.gate.forward(m, Numerics::Reference);
    logits
        .chunks(cfg.n_routed_experts)
        .zip(tokens)
        .map(|(l, &tok)| {
            let scores: Vec<f32> = l.iter().map(|&x| softplus(x).sqrt()).collect();
            let experts: Vec<usize> = match (&w.tid2eid, &w.bias) {
                (Some(table), _) => table[tok as usize * k..(tok as usize + 1) * k]
                    .iter()
                    .map(|&e| e as usize)
                    .collect(),
                (None, Some(bias)) => {
                    let biased: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
                    top_k_indices(&biased, k)
                }
                (None, None) => top_k_indices(&scores, k),
            };
            let sum: f32 = experts.iter().map(|&e| scores[e]).sum();
            let weights = experts
                .iter()
                .map(|&e| scores[e] / sum * cfg.routed_scaling_factor)
                .collect();
            Route { experts, weights }
        })
        .collect()
}

/// SwiGLU expert on rows `x`, each row scaled by `row_weight` before the down projection.
fn expert_forward(
    cfg: &ModelConfig,
    e: &ExpertWeights,
    x: &[f32],
    row_weight: &[f32],
    numerics: Numerics,
) -> Vec<f32> {
    let g = e.w1.forward(x, numerics);
    let u = e.w3.forward(x, numerics);
    let limit = cfg.swiglu_limit;
    let inter = e.w1.out;
    let mut h: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| {
            let (g, u) = if limit > 0.0 {
                (g.min(limit), u.clamp(-limit, limit))
            } else {
                (g, u)
            };
            silu(g) * u
        })
        .collect();
    for (row, &wt) in h.chunks_mut(inter).zip(row_weight) {
        row.iter_mut().for_each(|v| *v *= wt);
    }
    e.w2.forward(&h, numerics)
}

/// MoE output `[T, D]` for the normalised input rows `m`.
pub fn forward(
    cfg: &ModelConfig,
    w: &MoeWeights,
    m: &[f32],
    tokens: &[u32],
    numerics: Numerics,
) -> (Vec<f32>, Vec<Route>) {
    let d = cfg.hidden_size;
    let rows = m.len() / d;
    let routes = route(cfg, w, m, tokens);
    let mut out = expert_forward(cfg, &w.shared, m, &vec![1.0; rows], numerics);
    // Gather the rows routed to each expert so every expert runs once per batch.
    for (e, ew) in w.experts.iter().enumerate() {
        let picks: Vec<(usize, f32)> = routes
            .iter()
            .enumerate()
            .flat_map(|(t, r)| {
                r.experts
                    .iter()
                    .zip(&r.weights)
                    .filter(move |(&x, _)| x == e)
                    .map(move |(_, &wt)| (t, wt))
            })
            .collect();
        if picks.is_empty() {
            continue;
        }
        let x: Vec<f32> = picks
            .iter()
            .flat_map(|&(t, _)| m[t * d..(t + 1) * d].iter().copied())
            .collect();
        let wts: Vec<f32> = picks.iter().map(|&(_, wt)| wt).collect();
        let y = expert_forward(cfg, ew, &x, &wts, numerics);
        for (i, &(t, _)) in picks.iter().enumerate() {
            for (o, v) in out[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&y[i * d..(i + 1) * d])
            {
                *o += v;
            }
        }
    }
    (out, routes)
}
