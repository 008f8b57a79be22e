//! The lightning indexer of CSA blocks (spec §2.6): scores every visible compressed entry with
//! `Σ_j ω_j · ReLU(⟨q_j, K_w⟩)` and keeps the top `index_topk`.

use super::attention::{
    compressor_inputs, for_each_row_pos, quantize_index_vec, BlockCtx, Segment,
};
use super::compressor::finish_entry;
use super::ops::{dot, top_k_indices};
use super::state::LayerState;
use super::weights::IndexerWeights;

/// Per-row indexer inputs of a batch.
pub struct IndexerRows {
    /// `[T, heads, head_dim]` queries after rope (and the official Hadamard + FP4).
    q: Vec<f32>,
    /// `[T, heads]` per-head weights, already scaled.
    weights: Vec<f32>,
    /// Compressor projections `[T, 2·head_dim]`.
    kv: Vec<f32>,
    gate: Vec<f32>,
}

pub fn project(
    ctx: &BlockCtx<'_>,
    w: &IndexerWeights,
    a: &[f32],
    qr: &[f32],
    segs: &[Segment],
) -> IndexerRows {
    let cfg = ctx.cfg;
    let (heads, dim) = (cfg.index_n_heads, cfg.index_head_dim);
    let mut q = w.wq_b.forward(qr, ctx.numerics);
    for_each_row_pos(segs, |row, pos| {
        for head in q[row * heads * dim..(row + 1) * heads * dim].chunks_mut(dim) {
            ctx.rope.apply(head, pos, false);
            quantize_index_vec(ctx.numerics, head);
        }
    });
    let scale = (dim as f32).powf(-0.5) * (heads as f32).powf(-0.5);
    let mut weights = w.weights_proj.forward(a, ctx.numerics);
    weights.iter_mut().for_each(|v| *v *= scale);
    let (kv, gate) = compressor_inputs(&w.compressor, a);
    IndexerRows {
        q,
        weights,
        kv,
        gate,
    }
}

/// Feeds the token at `pos` to the indexer's compressor, appending a key when a window closes.
pub fn push_key(
    ctx: &BlockCtx<'_>,
    w: &IndexerWeights,
    rows: &IndexerRows,
    row: usize,
    pos: usize,
    st: &mut LayerState,
) {
    let c = &w.compressor;
    let width = c.wkv.out;
    let Some(cs) = st.index_compressor.as_mut() else {
        return;
    };
    let range = row * width..(row + 1) * width;
    if let Some(mut key) = cs.push(c, pos, &rows.kv[range.clone()], &rows.gate[range]) {
        let index = st.index_keys.len() / c.dim;
        finish_entry(c, &mut key, index, ctx.rope, ctx.cfg.rms_norm_eps);
        quantize_index_vec(ctx.numerics, &mut key);
        st.index_keys.extend_from_slice(&key);
    }
}

/// The top-k visible entries for the query in `row` (all of them when there are few).
pub fn select(
    ctx: &BlockCtx<'_>,
    rows: &IndexerRows,
    row: usize,
    st: &LayerState,
    entries: usize,
) -> Vec<usize> {
    let cfg = ctx.cfg;
    let (heads, dim) = (cfg.index_n_heads, cfg.index_head_dim);
    if entries <= cfg.index_topk {
        return (0..entries).collect();
    }
    let q = &rows.q[row * heads * dim..(row + 1) * heads * dim];
    let wts = &rows.weights[row * heads..(row + 1) * heads];
    let scores: Vec<f32> = st
        .index_keys
        .chunks(dim)
        .take(entries)
        .map(|key| {
            q.chunks(dim)
                .zip(wts)
                .map(|(qj, wj)| wj * dot(qj, key).max(0.0))
                .sum()
        })
        .collect();
    top_k_indices(&scores, cfg.index_topk)
}
