//! Attention of one block (spec §2.4-2.7): low-rank q, a single shared K=V head, a sliding
//! window plus compressed entries (all of them for HCA, the indexer's top-k for CSA), an
//! attention sink, and the grouped low-rank output projection.

use super::compressor::finish_entry;
use super::indexer::{self, IndexerRows};
use super::ops::{dot, rms_scale_chunks, rmsnorm_rows};
use super::quant::{fake_quant_fp4, fake_quant_fp8, hadamard};
use super::rope::Rope;
use super::state::LayerState;
use super::weights::{AttentionWeights, CompressorWeights};
use crate::api::Numerics;
use crate::model::ModelConfig;
use std::ops::Range;

/// FP8 simulation block of the non-rope KV channels.
const KV_QUANT_BLOCK: usize = 64;
/// FP4 simulation block of the indexer's queries and keys.
const INDEX_QUANT_BLOCK: usize = 32;

/// What a block's sub-layers need besides weights.
pub struct BlockCtx<'a> {
    pub cfg: &'a ModelConfig,
    pub rope: &'a Rope,
    pub numerics: Numerics,
}

/// The rows of one sequence inside a batch, and the absolute position of its first row.
#[derive(Debug, Clone)]
pub struct Segment {
    pub rows: Range<usize>,
    pub start_pos: usize,
}

/// Per-token projections shared by every segment of the batch.
struct Projections {
    q: Vec<f32>,
    kv: Vec<f32>,
    comp: Option<(Vec<f32>, Vec<f32>)>,
    index: Option<IndexerRows>,
}

/// Attention over a batch of rows `a` `[T, D]`; `states[i]` belongs to `segs[i]`.
pub fn forward(
    ctx: &BlockCtx<'_>,
    w: &AttentionWeights,
    a: &[f32],
    segs: &[Segment],
    states: &mut [&mut LayerState],
) -> Vec<f32> {
    let o = forward_heads(ctx, w, a, segs, states);
    output_projection(ctx, w, &o)
}

/// The per-head attention outputs `[T, H·d]` (inverse-roped), before the grouped output
/// projection; `w.wo_a`/`w.wo_b` are not used (a tensor-parallel rank projects its own heads).
pub fn forward_heads(
    ctx: &BlockCtx<'_>,
    w: &AttentionWeights,
    a: &[f32],
    segs: &[Segment],
    states: &mut [&mut LayerState],
) -> Vec<f32> {
    let cfg = ctx.cfg;
    let proj = project(ctx, w, a, segs);
    let hd = cfg.num_attention_heads * cfg.head_dim;
    let mut o = vec![0.0f32; a.len() / cfg.hidden_size * hd];
    for (seg, state) in segs.iter().zip(states.iter_mut()) {
        for (i, row) in seg.rows.clone().enumerate() {
            let pos = seg.start_pos + i;
            let selected = update_caches(ctx, w, &proj, row, pos, state);
            let out = &mut o[row * hd..(row + 1) * hd];
            attend(
                ctx,
                w,
                &proj.q[row * hd..(row + 1) * hd],
                pos,
                state,
                &selected,
                out,
            );
        }
    }
    o
}

fn project(ctx: &BlockCtx<'_>, w: &AttentionWeights, a: &[f32], segs: &[Segment]) -> Projections {
    let (cfg, nm) = (ctx.cfg, ctx.numerics);
    let eps = cfg.rms_norm_eps;
    let mut qr = w.wq_a.forward(a, nm);
    rmsnorm_rows(&mut qr, &w.q_norm, eps);
    let mut q = w.wq_b.forward(&qr, nm);
    rms_scale_chunks(&mut q, cfg.head_dim, eps);
    let mut kv = w.wkv.forward(a, nm);
    rmsnorm_rows(&mut kv, &w.kv_norm, eps);
    let hd = cfg.num_attention_heads * cfg.head_dim;
    for_each_row_pos(segs, |row, pos| {
        for head in q[row * hd..(row + 1) * hd].chunks_mut(cfg.head_dim) {
            ctx.rope.apply(head, pos, false);
        }
        let kv_row = &mut kv[row * cfg.head_dim..(row + 1) * cfg.head_dim];
        ctx.rope.apply(kv_row, pos, false);
        quantize_kv(ctx, kv_row);
    });
    let comp = w.compressor.as_ref().map(|c| compressor_inputs(c, a));
    let index = w
        .indexer
        .as_ref()
        .map(|iw| indexer::project(ctx, iw, a, &qr, segs));
    Projections { q, kv, comp, index }
}

impl Segment {
    /// Consecutive segments for items feeding `(tokens, start position)` each, in batch order.
    pub fn consecutive(items: impl IntoIterator<Item = (usize, usize)>) -> Vec<Segment> {
        let mut row = 0;
        items
            .into_iter()
            .map(|(tokens, start_pos)| {
                let seg = Segment {
                    rows: row..row + tokens,
                    start_pos,
                };
                row += tokens;
                seg
            })
            .collect()
    }
}

/// Calls `f(row, absolute position)` for every row of every segment.
pub fn for_each_row_pos(segs: &[Segment], mut f: impl FnMut(usize, usize)) {
    for seg in segs {
        for (i, row) in seg.rows.clone().enumerate() {
            f(row, seg.start_pos + i);
        }
    }
}

/// The official FP8 simulation of the non-rope KV channels (window rows and compressed entries).
fn quantize_kv(ctx: &BlockCtx<'_>, kv: &mut [f32]) {
    if ctx.numerics == Numerics::Official {
        let nope = ctx.cfg.head_dim - ctx.cfg.qk_rope_head_dim;
        fake_quant_fp8(&mut kv[..nope], KV_QUANT_BLOCK);
    }
}

/// The official Hadamard + FP4 simulation of indexer queries and keys.
pub fn quantize_index_vec(numerics: Numerics, v: &mut [f32]) {
    if numerics == Numerics::Official {
        hadamard(v);
        fake_quant_fp4(v, INDEX_QUANT_BLOCK);
    }
}

/// Compressor projections `(κ, γ)` of every row, in f32 from the block input.
pub fn compressor_inputs(c: &CompressorWeights, a: &[f32]) -> (Vec<f32>, Vec<f32>) {
    (
        c.wkv.forward(a, Numerics::Reference),
        c.wgate.forward(a, Numerics::Reference),
    )
}

/// Writes the token at `pos` into the window and compressors; returns the compressed entries
/// its query attends to.
fn update_caches(
    ctx: &BlockCtx<'_>,
    w: &AttentionWeights,
    p: &Projections,
    row: usize,
    pos: usize,
    st: &mut LayerState,
) -> Vec<usize> {
    let (cfg, d) = (ctx.cfg, ctx.cfg.head_dim);
    let slot = pos % cfg.sliding_window;
    st.window[slot * d..(slot + 1) * d].copy_from_slice(&p.kv[row * d..(row + 1) * d]);
    if let (Some(cw), Some((ckv, cgate)), Some(cs)) = (&w.compressor, &p.comp, &mut st.compressor) {
        let width = cw.wkv.out;
        let range = row * width..(row + 1) * width;
        if let Some(mut entry) = cs.push(cw, pos, &ckv[range.clone()], &cgate[range]) {
            let index = st.compressed.len() / d;
            finish_entry(cw, &mut entry, index, ctx.rope, cfg.rms_norm_eps);
            quantize_kv(ctx, &mut entry);
            st.compressed.extend_from_slice(&entry);
        }
    }
    let entries = st.compressed.len() / d;
    match (&w.indexer, &p.index) {
        (Some(iw), Some(rows)) => {
            indexer::push_key(ctx, iw, rows, row, pos, st);
            indexer::select(ctx, rows, row, st, entries)
        }
        _ => (0..entries).collect(),
    }
}

/// Sparse attention with sink for one token; writes `[H, d]` into `out` (inverse-roped).
fn attend(
    ctx: &BlockCtx<'_>,
    w: &AttentionWeights,
    q: &[f32],
    pos: usize,
    st: &LayerState,
    selected: &[usize],
    out: &mut [f32],
) {
    let (cfg, d) = (ctx.cfg, ctx.cfg.head_dim);
    let first = (pos + 1).saturating_sub(cfg.sliding_window);
    let mut keys: Vec<&[f32]> = (first..=pos)
        .map(|t| {
            let slot = t % cfg.sliding_window;
            &st.window[slot * d..(slot + 1) * d]
        })
        .collect();
    keys.extend(selected.iter().map(|&e| &st.compressed[e * d..(e + 1) * d]));
    let scale = (d as f32).powf(-0.5);
    let mut scores = vec![0.0f32; keys.len()];
    for (h, (qh, oh)) in q.chunks(d).zip(out.chunks_mut(d)).enumerate() {
        for (s, k) in scores.iter_mut().zip(&keys) {
            *s = scale * dot(qh, k);
        }
        let sink = w.sink[h];
        let max = scores.iter().fold(sink, |m, &s| m.max(s));
        let den: f32 = scores.iter().map(|&s| (s - max).exp()).sum::<f32>() + (sink - max).exp();
        oh.iter_mut().for_each(|v| *v = 0.0);
        for (s, k) in scores.iter().zip(&keys) {
            let p = (s - max).exp() / den;
            for (o, kv) in oh.iter_mut().zip(k.iter()) {
                *o += p * kv;
            }
        }
        ctx.rope.apply(oh, pos, true);
    }
}

/// `wo_b(concat_g wo_a[g](heads of group g))` of per-head outputs `o` `[T, H·d]`.
pub fn output_projection(ctx: &BlockCtx<'_>, w: &AttentionWeights, o: &[f32]) -> Vec<f32> {
    let cfg = ctx.cfg;
    let hd = cfg.num_attention_heads * cfg.head_dim;
    let rows = o.len() / hd;
    let group_width = hd / cfg.o_groups;
    let lora = cfg.o_lora_rank;
    let mut u = vec![0.0f32; rows * cfg.o_groups * lora];
    for (g, wa) in w.wo_a.iter().enumerate() {
        let group_in: Vec<f32> = o
            .chunks(hd)
            .flat_map(|r| r[g * group_width..(g + 1) * group_width].iter().copied())
            .collect();
        let ug = wa.forward(&group_in, ctx.numerics);
        for r in 0..rows {
            let dst = r * cfg.o_groups * lora + g * lora;
            u[dst..dst + lora].copy_from_slice(&ug[r * lora..(r + 1) * lora]);
        }
    }
    w.wo_b.forward(&u, ctx.numerics)
}
