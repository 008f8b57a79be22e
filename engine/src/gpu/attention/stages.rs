//! The middle stages of a decode step (see decode.rs): compressor updates, the CSA indexer (keys, queries,
//! scores, top-k) and the split sparse attention with its merge.
use super::error::GpuError;
use super::layer::{AttnLayer, CompressorDev, IndexerDev};
use super::scratch::AttnScratch;
use super::state::{AttnState, CompCache};
use super::step::Step;
use super::{dptr, dptr_mut};
use dsv4_kernels::attn::*;
use dsv4_kernels::cudarc::driver::CudaStream;

/// The parameters of one compressor that decode (attn_compress.cu) and prefill (prefill_state.cu) share:
/// everything but how rows are addressed. `quant` is the resolved `ATTN_QUANT_*` mode.
pub(crate) fn compress_params(
    s: &CudaStream,
    layer: &AttnLayer,
    c: &CompressorDev,
    cache: &mut CompCache,
    proj: u64,
    quant: i32,
) -> (CompressHead, CompressTail) {
    let head = CompressHead {
        proj,
        ape: dptr(&c.ape, s),
        norm_w: dptr(&c.norm, s),
        freqs: dptr(&layer.freqs, s),
    };
    let tail = CompressTail {
        state_kv: dptr_mut(&mut cache.kv, s),
        state_sc: dptr_mut(&mut cache.sc, s),
        cache: dptr_mut(&mut cache.cache, s),
        proj_stride: layer.lin_rows as i32,
        kv_off: c.kv_off as i32,
        gate_off: c.gate_off as i32,
        dc: c.dim as i32,
        ratio: c.ratio as i32,
        overlap: i32::from(c.overlap),
        rdim: layer.cfg.qk_rope_head_dim as i32,
        quant,
        cap: cache.cap as i32,
        eps: layer.cfg.rms_norm_eps,
    };
    (head, tail)
}

/// The parameters of one compressor of this step (see attn_compress.cu).
fn compress_job(
    st: &Step<'_>,
    c: &CompressorDev,
    cache: &mut CompCache,
    layer: &AttnLayer,
    proj: u64,
    quant: i32,
) -> AttnCompress {
    let (head, tail) = compress_params(st.s, layer, c, cache, proj, st.quant(quant));
    AttnCompress {
        head,
        slots: st.slots,
        positions: st.positions,
        tail,
    }
}

/// The indexer score parameters that decode and prefill share (the keys and every dim; the caller fills in
/// q, weights, slots, positions and scores) and the score scale.
pub(crate) fn index_score_shape(
    s: &CudaStream,
    layer: &AttnLayer,
    ix: &IndexerDev,
    keys: &CompCache,
) -> (IndexScoreCore, f32) {
    let cfg = &layer.cfg;
    let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
    let core = IndexScoreCore {
        keys: dptr(&keys.cache, s),
        wts_stride: layer.lin_rows as i32,
        heads: ih as i32,
        dim: id as i32,
        cap: keys.cap as i32,
        ratio: ix.comp.ratio as i32,
        k: cfg.index_topk as i32,
        ..Default::default()
    };
    (core, ((id * ih) as f32).powf(-0.5))
}

/// Pushes this step's tokens into the layer's compressors (the attention's and, CSA, the indexer's keys):
/// one launch. Both come before scoring and attention (an entry completed by this token is visible to it).
pub(super) fn compress(
    st: &Step<'_>,
    layer: &AttnLayer,
    state: &mut AttnState,
    proj: u64,
) -> Result<(), GpuError> {
    let mut jobs = [AttnCompress::default(); COMPRESS_JOBS];
    let mut n = 0;
    if let (Some(c), Some(cache)) = (&layer.comp, state.comp.as_mut()) {
        jobs[n] = compress_job(st, c, cache, layer, proj, QUANT_Q8_NOPE);
        n += 1;
    }
    if let (Some(ix), Some(keys)) = (&layer.index, state.index.as_mut()) {
        jobs[n] = compress_job(st, &ix.comp, keys, layer, proj, QUANT_HAD_Q4);
        n += 1;
    }
    if n == 0 {
        return Ok(());
    }
    // SAFETY: proj holds rows x lin_rows f32 (scratch.act.proj, checked), ape/norm/freqs are the layer's, the
    // state and cache buffers are [slots, ...] of this layer kind, meta holds `rows` slots < state.slots.
    unsafe { st.ctx.launch_attn_compress(st.s, st.rows, &jobs[..n]) }?;
    st.mark("compress")
}

/// CSA: indexer keys, queries, scores over the live entries, top-k into `sc.act.sel`.
pub(super) fn indexer(
    st: &Step<'_>,
    layer: &AttnLayer,
    state: &mut AttnState,
    sc: &mut AttnScratch,
) -> Result<(), GpuError> {
    let (Some(ix), Some(keys), Some(scores)) =
        (&layer.index, state.index.as_mut(), state.scores.as_mut())
    else {
        return Ok(());
    };
    let (s, cfg, rows) = (st.s, st.cfg, st.rows);
    // The keys were compressed and the queries prepared with the attention's (compress, project).
    let (cap, k) = (keys.cap as i32, cfg.index_topk as i32);
    let (shape, scale) = index_score_shape(s, layer, ix, keys);
    let p = AttnIndexScore {
        core: IndexScoreCore {
            q: dptr(&sc.act.iq, s),
            wts: dptr(&sc.act.proj, s) + 4 * ix.wts_off as u64,
            slots: st.slots,
            positions: st.positions,
            scores: dptr_mut(scores, s),
            ..shape
        },
        scale,
        pad: 0,
    };
    // SAFETY: wts points at column wts_off of proj (rows x lin_rows); keys [slots, cap, id]; scores [slots, cap].
    unsafe {
        st.ctx
            .launch_attn_index_score(s, sc.score_blocks[rows - 1], rows, &p)
    }?;
    st.mark("index score")?;
    let p = AttnIndexTopk {
        scores: dptr(scores, s),
        slots: st.slots,
        positions: st.positions,
        sel: dptr_mut(&mut sc.act.sel, s),
        cap,
        ratio: ix.comp.ratio as i32,
        k,
        pad: 0,
    };
    // SAFETY: scores [slots, cap]; sel holds max_rows x index_topk ints.
    unsafe { st.ctx.launch_attn_index_topk(s, rows, &p) }?;
    st.mark("index topk")
}

/// Split attention over window + compressed keys, then the merge with sink and inverse rope.
pub(super) fn attend(
    st: &Step<'_>,
    layer: &AttnLayer,
    state: &AttnState,
    sc: &mut AttnScratch,
) -> Result<(), GpuError> {
    let (s, cfg, rows) = (st.s, st.cfg, st.rows);
    let splits = sc.splits[rows - 1];
    let (comp, cap, ratio) = match (&state.comp, &layer.comp) {
        (Some(c), Some(l)) => (dptr(&c.cache, s), c.cap as i32, l.ratio as i32),
        _ => (0, 0, 0),
    };
    let p = AttnSparse {
        q: dptr(&sc.act.q, s),
        ring: dptr(&state.ring, s),
        comp,
        sel: if layer.index.is_some() {
            dptr(&sc.act.sel, s)
        } else {
            0
        },
        slots: st.slots,
        positions: st.positions,
        part_o: dptr_mut(&mut sc.part_o, s),
        part_ml: dptr_mut(&mut sc.part_ml, s),
        heads: cfg.num_attention_heads as i32,
        dim: cfg.head_dim as i32,
        window: state.window as i32,
        ratio,
        cap,
        k: cfg.index_topk as i32,
        scale: (cfg.head_dim as f32).powf(-0.5),
        pad: 0,
    };
    // SAFETY: q rows x heads x dim; ring/comp are the state's [slots, ...]; sel rows x k (CSA); part_* hold
    // rows x splits x heads (x dim) since splits = sc.splits[rows-1] sized them.
    unsafe { st.ctx.launch_attn_sparse_partial(s, splits, rows, &p) }?;
    st.mark("attention")?;
    let m = AttnMerge {
        part_o: dptr(&sc.part_o, s),
        part_ml: dptr(&sc.part_ml, s),
        sink: dptr(&layer.sink, s),
        freqs: dptr(&layer.freqs, s),
        positions: st.positions,
        out: dptr_mut(&mut sc.act.o, s),
        splits: splits as i32,
        heads: cfg.num_attention_heads as i32,
        dim: cfg.head_dim as i32,
        rdim: cfg.qk_rope_head_dim as i32,
        groups: cfg.o_groups as i32,
        rows: rows as i32,
    };
    // SAFETY: as above; o holds rows x heads x dim bf16; sink heads f32.
    unsafe { st.ctx.launch_attn_sparse_merge(s, &m) }?;
    st.mark("merge")
}
