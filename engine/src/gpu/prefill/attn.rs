//! The attention block over every row of a prefill call (spec 2.4-2.7): the same stages as a decode step
//! (decode.rs) with GEMMs over the rows, both compressors over the call's tokens (entries completed inside the
//! call are pooled before any query reads them), indexer scores per row against the entries its position sees,
//! attention reading this call's window rows and the previous ring, then the ring update.

use super::gemm::{self, at, at_mut, Job};
use super::plan::Plan;
use super::ws::{
    PrefillWs, META_POS0, META_POSITIONS, META_ROW0, META_ROWID, META_SEGLEN, META_SLOTS,
};
use super::PrefillHook;
use crate::gpu::attention::{
    compress_params, dptr, dptr_mut, index_score_shape, row_prep, AttnLayer, AttnState, CompCache,
    CompressorDev,
};
use crate::gpu::RunnerError;
use dsv4_kernels::attn::{
    AttnIndexTopk, AttnVecPrep, IndexScoreCore, QUANT_HAD_Q4, QUANT_NONE, QUANT_Q8_NOPE,
};
use dsv4_kernels::cudarc::driver::CudaStream;
use dsv4_kernels::prefill::{PfAttn, PfCompress, PfIndexScore, PfRing, PfWeights};
use dsv4_kernels::GpuContext;

/// What every stage needs besides buffers.
pub(super) struct Call<'a> {
    pub ctx: &'a GpuContext,
    pub s: &'a CudaStream,
    pub plan: &'a Plan,
    pub official: bool,
    /// The wgmma weight scratch (`PrefillWs::wbf`): device address and bf16 elements; None keeps every FP8
    /// GEMM on pf_gemm.
    pub wbf: Option<(u64, usize)>,
}

impl Call<'_> {
    fn quant(&self, q: i32) -> i32 {
        if self.official {
            q
        } else {
            QUANT_NONE
        }
    }

    /// Address of per-row array `which` (META_*), `from` rows in.
    fn meta(&self, ws: &PrefillWs, which: usize, from: usize) -> u64 {
        at(&ws.meta, self.s, which * ws.max_tokens + from)
    }
}

/// Attention of `plan.rows` rows of `ws.io.a` into `ws.io.attn_out`, updating `state` like as many decode steps.
pub(super) fn attention(
    c: &Call<'_>,
    layer: &AttnLayer,
    state: &mut AttnState,
    ws: &mut PrefillWs,
    hook: PrefillHook<'_>,
) -> Result<(), RunnerError> {
    heads(c, layer, state, ws, hook)?;
    output(c, layer, ws)?;
    hook("attn.out")
}

/// Every stage up to the heads' output `ws.attn.act.o` (group-major), updating `state`.
pub(super) fn heads(
    c: &Call<'_>,
    layer: &AttnLayer,
    state: &mut AttnState,
    ws: &mut PrefillWs,
    hook: PrefillHook<'_>,
) -> Result<(), RunnerError> {
    project(c, layer, ws)?;
    hook("attn.proj")?;
    let proj = dptr(&ws.attn.act.proj, c.s);
    if let (Some(comp), Some(cache)) = (&layer.comp, state.comp.as_mut()) {
        compress(c, ws, layer, comp, cache, proj, QUANT_Q8_NOPE)?;
    }
    if let (Some(ix), Some(keys)) = (&layer.index, state.index.as_mut()) {
        compress(c, ws, layer, &ix.comp, keys, proj, QUANT_HAD_Q4)?;
    }
    hook("attn.compress")?;
    indexer(c, layer, state, ws)?;
    hook("attn.indexer")?;
    attend(c, layer, state, ws)?;
    ring_write(c, layer, state, ws)?;
    hook("attn.core")
}

/// q (normed per head, roped), this call's window rows, the stacked bf16 projections.
fn project(c: &Call<'_>, layer: &AttnLayer, ws: &mut PrefillWs) -> Result<(), RunnerError> {
    let (s, cfg, rows) = (c.s, &layer.cfg, c.plan.rows);
    let d = cfg.hidden_size;
    let b = &mut ws.attn;
    if c.official {
        let p = row_prep::quant_input(dptr(&ws.io.a, s), dptr_mut(&mut b.act.xq, s), rows, d);
        // SAFETY: a and xq hold rows x hidden bf16.
        unsafe { c.ctx.launch_attn_row_prep(s, &p) }?;
    }
    let x = if c.official {
        dptr(&b.act.xq, s)
    } else {
        dptr(&ws.io.a, s)
    };
    let jobs = [
        Job::new(
            s,
            x,
            &layer.wq_a.w,
            &layer.wq_a.scale,
            dptr_mut(&mut b.act.qr_f32, s),
            layer.wq_a.n,
        ),
        Job::new(
            s,
            x,
            &layer.wkv.w,
            &layer.wkv.scale,
            dptr_mut(&mut b.act.kv_f32, s),
            layer.wkv.n,
        ),
    ];
    gemm::fp8(c, rows, d, false, &jobs)?;
    let p = row_prep::q_norm(s, layer, &mut b.act, rows, c.official);
    // SAFETY: qr_f32 / qr hold rows x q_lora, q_norm q_lora.
    unsafe { c.ctx.launch_attn_row_prep(s, &p) }?;
    let qr = dptr(&b.act.qr, s);
    let mut jobs = vec![Job::new(
        s,
        qr,
        &layer.wq_b.w,
        &layer.wq_b.scale,
        dptr_mut(&mut b.act.q_f32, s),
        layer.wq_b.n,
    )];
    if let Some(ix) = &layer.index {
        jobs.push(Job::new(
            s,
            qr,
            &ix.wq_b.w,
            &ix.wq_b.scale,
            dptr_mut(&mut b.act.iq_f32, s),
            ix.wq_b.n,
        ));
    }
    gemm::fp8(c, rows, cfg.q_lora_rank, false, &jobs)?;
    let hd = cfg.num_attention_heads * cfg.head_dim;
    let base = AttnVecPrep {
        freqs: dptr(&layer.freqs, s),
        positions: c.meta(ws, META_POSITIONS, 0),
        dim: cfg.head_dim as i32,
        rdim: cfg.qk_rope_head_dim as i32,
        rms: 1,
        eps: cfg.rms_norm_eps,
        ..Default::default()
    };
    let b = &mut ws.attn;
    let q = AttnVecPrep {
        x: dptr(&b.act.q_f32, s),
        out: dptr_mut(&mut b.act.q, s),
        x_stride: hd as i32,
        ..base
    };
    // SAFETY: q_f32 / q hold rows x heads x head_dim; positions rows ints.
    unsafe {
        c.ctx
            .launch_attn_vec_prep(s, rows, &[(cfg.num_attention_heads, q)])
    }?;
    let kv = AttnVecPrep {
        x: dptr(&b.act.kv_f32, s),
        norm_w: dptr(&layer.kv_norm, s),
        out: dptr_mut(&mut b.kv, s),
        x_stride: cfg.head_dim as i32,
        quant: c.quant(QUANT_Q8_NOPE),
        ..base
    };
    // SAFETY: kv_f32 / kv hold rows x head_dim (window 0: row-major output, not the ring).
    unsafe { c.ctx.launch_attn_vec_prep(s, rows, &[(1, kv)]) }?;
    if let Some(lin) = &layer.lin {
        // a (not the FP8-quantised xq): the compressors and weights_proj run in bf16, as in decode.
        let job = Job::bf16(
            s,
            dptr(&ws.io.a, s),
            lin,
            dptr_mut(&mut b.act.proj, s),
            layer.lin_rows,
        );
        gemm::dense(c.ctx, s, PfWeights::Bf16, rows, d, false, &[job])?;
    }
    Ok(())
}

/// Pools the entries the call completes, then moves the compressor state on (prefill_state.cu).
fn compress(
    c: &Call<'_>,
    ws: &PrefillWs,
    layer: &AttnLayer,
    comp: &CompressorDev,
    cache: &mut CompCache,
    proj: u64,
    quant: i32,
) -> Result<(), RunnerError> {
    let s = c.s;
    let jobs = c.plan.jobs_of(comp.ratio).ok_or_else(|| {
        RunnerError::Unsupported(format!("no prefill jobs planned for ratio {}", comp.ratio))
    })?;
    let (head, tail) = compress_params(s, layer, comp, cache, proj, c.quant(quant));
    let mut p = PfCompress {
        head,
        jobs: at(&ws.jobs, s, jobs.offset),
        tail,
    };
    // SAFETY: proj holds rows x lin_rows f32, the job table `count` jobs of slots < state slots and rows of
    // this call; ape/norm/freqs are the layer's; state and cache are [slots, ...] of this compressor.
    unsafe { c.ctx.launch_pf_compress_pool(s, jobs.count, &p) }?;
    p.jobs = at(&ws.jobs, s, 0);
    // SAFETY: as above; the table starts with the call's segments (slot, row0, pos0, len).
    unsafe { c.ctx.launch_pf_compress_state(s, c.plan.segs.len(), &p) }?;
    Ok(())
}

/// Indexer queries, scores of each row group against its visible keys, top-k into `ws.attn.act.sel`.
fn indexer(
    c: &Call<'_>,
    layer: &AttnLayer,
    state: &AttnState,
    ws: &mut PrefillWs,
) -> Result<(), RunnerError> {
    let (Some(ix), Some(keys)) = (&layer.index, &state.index) else {
        return Ok(());
    };
    let (s, cfg, rows) = (c.s, &layer.cfg, c.plan.rows);
    let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
    let p = AttnVecPrep {
        x: dptr(&ws.attn.act.iq_f32, s),
        freqs: dptr(&layer.freqs, s),
        positions: c.meta(ws, META_POSITIONS, 0),
        out: dptr_mut(&mut ws.attn.act.iq, s),
        x_stride: (ih * id) as i32,
        dim: id as i32,
        rdim: cfg.qk_rope_head_dim as i32,
        quant: c.quant(QUANT_HAD_Q4),
        ..Default::default()
    };
    // SAFETY: iq_f32 / iq hold rows x ih x id; positions rows ints.
    unsafe { c.ctx.launch_attn_vec_prep(s, rows, &[(ih, p)]) }?;
    let (cap, k) = (keys.cap as i32, cfg.index_topk as i32);
    let (shape, scale) = index_score_shape(s, layer, ix, keys);
    for g in &c.plan.score_groups {
        let sp = PfIndexScore {
            core: IndexScoreCore {
                q: dptr(&ws.attn.act.iq, s),
                wts: at(&ws.attn.act.proj, s, ix.wts_off),
                slots: c.meta(ws, META_SLOTS, 0),
                positions: c.meta(ws, META_POSITIONS, 0),
                scores: dptr_mut(&mut ws.attn.scores, s),
                ..shape
            },
            row_begin: g.begin as i32,
            scale,
            ..Default::default()
        };
        // SAFETY: iq rows x ih x id; wts at column wts_off of proj (rows x lin_rows); keys [slots, cap, id];
        // scores holds score_rows >= g.len rows of cap.
        unsafe { c.ctx.launch_pf_index_score(s, g.splits, g.len, &sp) }?;
        let tp = AttnIndexTopk {
            scores: dptr(&ws.attn.scores, s),
            slots: c.meta(ws, META_ROWID, 0),
            positions: c.meta(ws, META_POSITIONS, g.begin),
            sel: at_mut(&mut ws.attn.act.sel, s, g.begin * cfg.index_topk),
            cap,
            ratio: ix.comp.ratio as i32,
            k,
            pad: 0,
        };
        // SAFETY: row i of the group reads score row rowid[i] = i of `scores` (cap wide) and its position,
        // and writes k ints of sel at row g.begin + i.
        unsafe { c.ctx.launch_attn_index_topk(s, g.len, &tp) }?;
    }
    Ok(())
}

fn attend(
    c: &Call<'_>,
    layer: &AttnLayer,
    state: &AttnState,
    ws: &mut PrefillWs,
) -> Result<(), RunnerError> {
    let (s, cfg) = (c.s, &layer.cfg);
    let (comp, cap, ratio) = match (&state.comp, &layer.comp) {
        (Some(cc), Some(l)) => (dptr(&cc.cache, s), cc.cap as i32, l.ratio as i32),
        _ => (0, 0, 0),
    };
    let p = PfAttn {
        q: dptr(&ws.attn.act.q, s),
        kv: dptr(&ws.attn.kv, s),
        ring: dptr(&state.ring, s),
        comp,
        sel: if layer.index.is_some() {
            dptr(&ws.attn.act.sel, s)
        } else {
            0
        },
        slots: c.meta(ws, META_SLOTS, 0),
        positions: c.meta(ws, META_POSITIONS, 0),
        row0: c.meta(ws, META_ROW0, 0),
        pos0: c.meta(ws, META_POS0, 0),
        sink: dptr(&layer.sink, s),
        freqs: dptr(&layer.freqs, s),
        out: dptr_mut(&mut ws.attn.act.o, s),
        heads: cfg.num_attention_heads as i32,
        dim: cfg.head_dim as i32,
        window: state.window as i32,
        ratio,
        cap,
        k: cfg.index_topk as i32,
        rdim: cfg.qk_rope_head_dim as i32,
        groups: cfg.o_groups as i32,
        rows: c.plan.rows as i32,
        scale: (cfg.head_dim as f32).powf(-0.5),
    };
    // SAFETY: q rows x heads x dim, kv rows x dim, ring/comp the state's [slots, ...], sel rows x k (CSA), the
    // per-row arrays rows ints, o rows x heads x dim bf16.
    unsafe { c.ctx.launch_pf_attn(s, &p) }?;
    Ok(())
}

/// The ring takes each sequence's last `window` rows (after the attention read the previous ones).
fn ring_write(
    c: &Call<'_>,
    layer: &AttnLayer,
    state: &mut AttnState,
    ws: &PrefillWs,
) -> Result<(), RunnerError> {
    let s = c.s;
    let p = PfRing {
        kv: dptr(&ws.attn.kv, s),
        ring: dptr_mut(&mut state.ring, s),
        slots: c.meta(ws, META_SLOTS, 0),
        positions: c.meta(ws, META_POSITIONS, 0),
        pos0: c.meta(ws, META_POS0, 0),
        seglen: c.meta(ws, META_SEGLEN, 0),
        dim: layer.cfg.head_dim as i32,
        window: state.window as i32,
    };
    // SAFETY: kv rows x dim, ring [slots, window, dim] with the rows' slots < slots.
    unsafe { c.ctx.launch_pf_ring_write(s, c.plan.rows, &p) }?;
    Ok(())
}

/// wo_a per group (group-major input, no activation quant), regroup (+ FP8 act quant), wo_b.
fn output(c: &Call<'_>, layer: &AttnLayer, ws: &mut PrefillWs) -> Result<(), RunnerError> {
    let (s, groups) = (c.s, layer.cfg.o_groups);
    let slots: Vec<usize> = (0..groups).collect();
    let lat = dptr_mut(&mut ws.attn.act.u_f32, s);
    wo_a(c, layer, ws, lat, &slots)?;
    let b = &mut ws.attn;
    regroup(
        c,
        &layer.cfg,
        dptr(&b.act.u_f32, s),
        groups,
        dptr_mut(&mut b.act.u, s),
    )?;
    let job = Job::new(
        s,
        dptr(&b.act.u, s),
        &layer.wo_b.w,
        &layer.wo_b.scale,
        dptr_mut(&mut ws.io.attn_out, s),
        layer.wo_b.n,
    );
    gemm::fp8(c, c.plan.rows, layer.wo_b.k, true, &[job])
}

/// `wo_a` of every group of the heads' output `ws.attn.act.o` into the f32 latents at `lat`
/// (`[slots, rows, o_lora_rank]`, group i at slot `slots[i]`).
pub(super) fn wo_a(
    c: &Call<'_>,
    layer: &AttnLayer,
    ws: &PrefillWs,
    lat: u64,
    slots: &[usize],
) -> Result<(), RunnerError> {
    let (s, cfg, rows) = (c.s, &layer.cfg, c.plan.rows);
    let g_in = cfg.num_attention_heads * cfg.head_dim / cfg.o_groups;
    let lora = cfg.o_lora_rank;
    if slots.len() != layer.wo_a.len() {
        return Err(RunnerError::Unsupported(format!(
            "{} latent slots for {} wo_a groups",
            slots.len(),
            layer.wo_a.len()
        )));
    }
    let o = dptr(&ws.attn.act.o, s);
    let jobs: Vec<Job> = layer
        .wo_a
        .iter()
        .zip(slots)
        .enumerate()
        .map(|(g, (w, &slot))| {
            let x = o + (2 * g * rows * g_in) as u64;
            Job::new(
                s,
                x,
                &w.w,
                &w.scale,
                lat + (4 * slot * rows * lora) as u64,
                w.n,
            )
        })
        .collect();
    for chunk in jobs.chunks(dsv4_kernels::prefill::PF_GROUPS) {
        gemm::fp8(c, rows, g_in, false, chunk)?;
    }
    Ok(())
}

/// The f32 latents at `lat` (`[groups, rows, o_lora_rank]`) as bf16 rows `[rows, groups·o_lora_rank]` at
/// `out`, FP8 activation-quantised in official numerics (the input of `wo_b`).
pub(super) fn regroup(
    c: &Call<'_>,
    cfg: &crate::model::ModelConfig,
    lat: u64,
    groups: usize,
    out: u64,
) -> Result<(), RunnerError> {
    let p = row_prep::regroup(lat, out, groups, c.plan.rows, cfg.o_lora_rank, c.official);
    // SAFETY: the callers pass lat holding groups x rows x lora f32 and out rows x groups*lora bf16.
    unsafe { c.ctx.launch_attn_row_prep(c.s, &p) }?;
    Ok(())
}
