//! One decode step of the attention block (spec §2.4-2.6, §2.10 decode order) for a batch of rows, each the
//! next token of a different sequence slot. Launch order: projections, window write, compressors (both
//! before scoring/attention: an entry completed by this token is visible to it), indexer scores + top-k,
//! split attention + merge (sink, inverse rope), wo_a per group, wo_b.
use super::error::{ensure, GpuError};
use super::layer::{AttnLayer, CompressorDev, Fp8Linear};
use super::scratch::AttnScratch;
use super::state::{AttnState, CompCache, StepMeta};
use super::{dptr, dptr_mut};
use crate::api::Numerics;
use crate::model::ModelConfig;
use dsv4_kernels::attn::*;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use dsv4_kernels::{bf16, GemvOut, GpuContext};

/// FP8 activation-quant block of the official numerics.
const ACT_BLOCK: i32 = 128;

/// What one step needs besides buffers.
struct Step<'a> {
    ctx: &'a GpuContext,
    s: &'a CudaStream,
    cfg: &'a ModelConfig,
    rows: usize,
    official: bool,
    slots: u64,
    positions: u64,
}

impl Step<'_> {
    fn gemv(
        &self,
        w: &Fp8Linear,
        x: &impl DevicePtr<bf16>,
        out: GemvOut<'_>,
        ws: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let plan = self.ctx.fp8_gemv_plan(self.rows, w.n, w.k)?;
        self.ctx
            .launch_fp8_gemv(self.s, &plan, x, &w.w, &w.scale, out, Some(ws))?;
        Ok(())
    }

    fn quant(&self, q: i32) -> i32 {
        if self.official {
            q
        } else {
            QUANT_NONE
        }
    }

    /// Pushes this step's tokens into a compressor (see attn_compress.cu).
    fn compress(
        &self,
        c: &CompressorDev,
        cache: &mut CompCache,
        layer: &AttnLayer,
        proj: u64,
        quant: i32,
    ) -> Result<(), GpuError> {
        let p = AttnCompress {
            proj,
            ape: dptr(&c.ape, self.s),
            norm_w: dptr(&c.norm, self.s),
            freqs: dptr(&layer.freqs, self.s),
            slots: self.slots,
            positions: self.positions,
            state_kv: dptr_mut(&mut cache.kv, self.s),
            state_sc: dptr_mut(&mut cache.sc, self.s),
            cache: dptr_mut(&mut cache.cache, self.s),
            proj_stride: layer.lin_rows as i32,
            kv_off: c.kv_off as i32,
            gate_off: c.gate_off as i32,
            dc: c.dim as i32,
            ratio: c.ratio as i32,
            overlap: i32::from(c.overlap),
            rdim: self.cfg.qk_rope_head_dim as i32,
            quant: self.quant(quant),
            cap: cache.cap as i32,
            eps: self.cfg.rms_norm_eps,
        };
        // SAFETY: proj holds rows x lin_rows f32 (scratch.proj, checked), ape/norm/freqs are the layer's, the
        // state and cache buffers are [slots, ...] of this layer kind, meta holds `rows` slots < state.slots.
        unsafe { self.ctx.launch_attn_compress(self.s, self.rows, &p) }?;
        Ok(())
    }
}

fn check(
    layer: &AttnLayer,
    state: &AttnState,
    meta: &StepMeta,
    rows: usize,
    cfg: &ModelConfig,
    sc: &AttnScratch,
    io: (usize, usize),
) -> Result<(), GpuError> {
    ensure(
        rows >= 1
            && rows <= sc.max_rows
            && rows <= meta.slots.len()
            && rows <= meta.positions.len(),
        || {
            format!(
                "rows {rows}: scratch holds {}, meta {}",
                sc.max_rows,
                meta.slots.len()
            )
        },
    )?;
    ensure(
        io.0 >= rows * cfg.hidden_size && io.1 >= rows * cfg.hidden_size,
        || "a or out shorter than rows x hidden".into(),
    )?;
    ensure(
        layer.comp.is_some() == state.comp.is_some()
            && layer.index.is_some() == state.index.is_some(),
        || format!("state does not belong to layer {}", layer.layer),
    )?;
    ensure(
        sc.proj.len() >= rows * layer.lin_rows && state.dim == cfg.head_dim,
        || "scratch/state dims".into(),
    )?;
    ensure(cfg.index_topk <= TOPK_MAX, || {
        format!("index_topk {} > {TOPK_MAX}", cfg.index_topk)
    })
}

/// One decode step for `rows` rows (row i = the sequence in slot `meta.slots[i]` at `meta.positions[i]`).
/// `a` `[rows, hidden]` bf16 normalised block input; writes `out` `[rows, hidden]` bf16. No allocation, no host
/// sync, no host reads of device values: graph-capturable. Slots within a step must be distinct, and the
/// caller must keep every position below the state's `max_context`.
#[allow(clippy::too_many_arguments)]
pub fn decode(
    ctx: &GpuContext,
    stream: &CudaStream,
    layer: &AttnLayer,
    state: &mut AttnState,
    meta: &StepMeta,
    rows: usize,
    a: &CudaSlice<bf16>,
    sc: &mut AttnScratch,
    out: &mut CudaSlice<bf16>,
    numerics: Numerics,
) -> Result<(), GpuError> {
    let cfg = &layer.cfg;
    check(layer, state, meta, rows, cfg, sc, (a.len(), out.len()))?;
    let st = Step {
        ctx,
        s: stream,
        cfg,
        rows,
        official: numerics == Numerics::Official,
        slots: dptr(&meta.slots, stream),
        positions: dptr(&meta.positions, stream),
    };
    project(&st, layer, state, a, sc)?;
    let proj = dptr(&sc.proj, stream);
    if let (Some(c), Some(cache)) = (&layer.comp, state.comp.as_mut()) {
        st.compress(c, cache, layer, proj, QUANT_Q8_NOPE)?;
    }
    indexer(&st, layer, state, sc)?;
    attend(&st, layer, state, sc)?;
    output(&st, layer, sc, out)
}

/// q (normed per head, roped), the window row, and the stacked bf16 projections.
fn project(
    st: &Step<'_>,
    layer: &AttnLayer,
    state: &mut AttnState,
    a: &CudaSlice<bf16>,
    sc: &mut AttnScratch,
) -> Result<(), GpuError> {
    let (s, cfg, rows) = (st.s, st.cfg, st.rows);
    let d = cfg.hidden_size;
    if st.official {
        let p = AttnRowPrep {
            x: dptr(a, s),
            out: dptr_mut(&mut sc.xq, s),
            groups: 1,
            rows: rows as i32,
            width: d as i32,
            quant_blk: ACT_BLOCK,
            ..Default::default()
        };
        // SAFETY: a holds rows x hidden bf16 (checked), xq rows x hidden.
        unsafe { st.ctx.launch_attn_row_prep(s, &p) }?;
    }
    let x = if st.official { &sc.xq } else { a };
    st.gemv(&layer.wq_a, x, GemvOut::f32(&mut sc.qr_f32, s), &mut sc.ws)?;
    st.gemv(&layer.wkv, x, GemvOut::f32(&mut sc.kv_f32, s), &mut sc.ws)?;
    let p = AttnRowPrep {
        x: dptr(&sc.qr_f32, s),
        norm_w: dptr(&layer.q_norm, s),
        out: dptr_mut(&mut sc.qr, s),
        x_f32: 1,
        groups: 1,
        rows: rows as i32,
        width: cfg.q_lora_rank as i32,
        quant_blk: if st.official { ACT_BLOCK } else { 0 },
        eps: cfg.rms_norm_eps,
    };
    // SAFETY: qr_f32 / qr hold rows x q_lora, q_norm q_lora.
    unsafe { st.ctx.launch_attn_row_prep(s, &p) }?;
    st.gemv(
        &layer.wq_b,
        &sc.qr,
        GemvOut::f32(&mut sc.q_f32, s),
        &mut sc.ws,
    )?;
    let hd = cfg.num_attention_heads * cfg.head_dim;
    let base = AttnVecPrep {
        freqs: dptr(&layer.freqs, s),
        positions: st.positions,
        dim: cfg.head_dim as i32,
        rdim: cfg.qk_rope_head_dim as i32,
        rms: 1,
        eps: cfg.rms_norm_eps,
        ..Default::default()
    };
    let q = AttnVecPrep {
        x: dptr(&sc.q_f32, s),
        out: dptr_mut(&mut sc.q, s),
        x_stride: hd as i32,
        ..base
    };
    // SAFETY: q_f32 / q hold rows x heads x head_dim; positions rows ints.
    unsafe {
        st.ctx
            .launch_attn_vec_prep(s, cfg.num_attention_heads, rows, &q)
    }?;
    let kv = AttnVecPrep {
        x: dptr(&sc.kv_f32, s),
        norm_w: dptr(&layer.kv_norm, s),
        slots: st.slots,
        out: dptr_mut(&mut state.ring, s),
        x_stride: cfg.head_dim as i32,
        quant: st.quant(QUANT_Q8_NOPE),
        window: state.window as i32,
        ..base
    };
    // SAFETY: kv_f32 holds rows x head_dim; ring is [slots, window, head_dim] and meta slots < slots.
    unsafe { st.ctx.launch_attn_vec_prep(s, 1, rows, &kv) }?;
    if let Some(lin) = &layer.lin {
        let p = AttnBf16Gemv {
            x: dptr(a, s),
            w: dptr(lin, s),
            y: dptr_mut(&mut sc.proj, s),
            b: rows as i32,
            n: layer.lin_rows as i32,
            k: d as i32,
            pad: 0,
        };
        // SAFETY: a rows x hidden, lin lin_rows x hidden (checked at load), proj >= rows x lin_rows (checked).
        unsafe { st.ctx.launch_attn_bf16_gemv(s, &p) }?;
    }
    Ok(())
}

/// CSA: indexer keys, queries, scores over the live entries, top-k into `sc.sel`.
fn indexer(
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
    st.compress(&ix.comp, keys, layer, dptr(&sc.proj, s), QUANT_HAD_Q4)?;
    st.gemv(
        &ix.wq_b,
        &sc.qr,
        GemvOut::f32(&mut sc.iq_f32, s),
        &mut sc.ws,
    )?;
    let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
    let p = AttnVecPrep {
        x: dptr(&sc.iq_f32, s),
        freqs: dptr(&layer.freqs, s),
        positions: st.positions,
        out: dptr_mut(&mut sc.iq, s),
        x_stride: (ih * id) as i32,
        dim: id as i32,
        rdim: cfg.qk_rope_head_dim as i32,
        quant: st.quant(QUANT_HAD_Q4),
        ..Default::default()
    };
    // SAFETY: iq_f32 / iq hold rows x ih x id.
    unsafe { st.ctx.launch_attn_vec_prep(s, ih, rows, &p) }?;
    let (cap, k) = (keys.cap as i32, cfg.index_topk as i32);
    let p = AttnIndexScore {
        q: dptr(&sc.iq, s),
        wts: dptr(&sc.proj, s) + 4 * ix.wts_off as u64,
        keys: dptr(&keys.cache, s),
        slots: st.slots,
        positions: st.positions,
        scores: dptr_mut(scores, s),
        wts_stride: layer.lin_rows as i32,
        heads: ih as i32,
        dim: id as i32,
        cap,
        ratio: ix.comp.ratio as i32,
        k,
        scale: ((id * ih) as f32).powf(-0.5),
        pad: 0,
    };
    // SAFETY: wts points at column wts_off of proj (rows x lin_rows); keys [slots, cap, id]; scores [slots, cap].
    unsafe {
        st.ctx
            .launch_attn_index_score(s, sc.score_blocks[rows - 1], rows, &p)
    }?;
    let p = AttnIndexTopk {
        scores: dptr(scores, s),
        slots: st.slots,
        positions: st.positions,
        sel: dptr_mut(&mut sc.sel, s),
        cap,
        ratio: ix.comp.ratio as i32,
        k,
        pad: 0,
    };
    // SAFETY: scores [slots, cap]; sel holds max_rows x index_topk ints.
    unsafe { st.ctx.launch_attn_index_topk(s, rows, &p) }?;
    Ok(())
}

/// Split attention over window + compressed keys, then the merge with sink and inverse rope.
fn attend(
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
        q: dptr(&sc.q, s),
        ring: dptr(&state.ring, s),
        comp,
        sel: if layer.index.is_some() {
            dptr(&sc.sel, s)
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
    let m = AttnMerge {
        part_o: dptr(&sc.part_o, s),
        part_ml: dptr(&sc.part_ml, s),
        sink: dptr(&layer.sink, s),
        freqs: dptr(&layer.freqs, s),
        positions: st.positions,
        out: dptr_mut(&mut sc.o, s),
        splits: splits as i32,
        heads: cfg.num_attention_heads as i32,
        dim: cfg.head_dim as i32,
        rdim: cfg.qk_rope_head_dim as i32,
        groups: cfg.o_groups as i32,
        rows: rows as i32,
    };
    // SAFETY: as above; o holds rows x heads x dim bf16; sink heads f32.
    unsafe { st.ctx.launch_attn_sparse_merge(s, &m) }?;
    Ok(())
}

/// wo_a per group (no activation quant), regroup (+ FP8 act quant in official numerics), wo_b.
fn output(
    st: &Step<'_>,
    layer: &AttnLayer,
    sc: &mut AttnScratch,
    out: &mut CudaSlice<bf16>,
) -> Result<(), GpuError> {
    let (s, cfg, rows) = (st.s, st.cfg, st.rows);
    let (g_in, lora) = (
        cfg.num_attention_heads * cfg.head_dim / cfg.o_groups,
        cfg.o_lora_rank,
    );
    for (g, w) in layer.wo_a.iter().enumerate() {
        let x = sc.o.slice(g * rows * g_in..(g + 1) * rows * g_in);
        let mut u = sc.u_f32.slice_mut(g * rows * lora..(g + 1) * rows * lora);
        st.gemv(w, &x, GemvOut::f32(&mut u, s), &mut sc.ws)?;
    }
    let p = AttnRowPrep {
        x: dptr(&sc.u_f32, s),
        out: dptr_mut(&mut sc.u, s),
        x_f32: 1,
        groups: cfg.o_groups as i32,
        rows: rows as i32,
        width: lora as i32,
        quant_blk: if st.official { ACT_BLOCK } else { 0 },
        ..Default::default()
    };
    // SAFETY: u_f32 holds groups x rows x lora f32, u rows x groups*lora bf16.
    unsafe { st.ctx.launch_attn_row_prep(s, &p) }?;
    st.gemv(&layer.wo_b, &sc.u, GemvOut::bf16(out, s), &mut sc.ws)
}
