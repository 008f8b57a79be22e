//! One decode step of the attention block (spec §2.4-2.6, §2.10 decode order) for a batch of rows, each the
//! next token of a different sequence slot. Launch order: projections (wq_a + wkv in one grouped GEMV, wq_b +
//! the indexer's wq_b in another), window write, compressors (both before scoring/attention: an entry
//! completed by this token is visible to it), indexer scores + top-k, split attention + merge (sink, inverse
//! rope), the 8 wo_a groups in one grouped GEMV, wo_b. The grouped GEMVs reduce their split-K partials inside
//! the kernel (attn_gemv.cu), so no projection needs a second launch.
use super::error::{ensure, GpuError};
use super::layer::AttnLayer;
use super::scratch::AttnScratch;
use super::state::{AttnState, StepMeta};
use super::step::{grouped_gemv, Job, Q8In, StageMarks, Step};
use super::{dptr, dptr_mut, row_prep, stages};
use crate::api::Numerics;
use dsv4_kernels::attn::*;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{bf16, GpuContext};
use dsv4_kernels::{GemvWeights, GEMV_GROUPS};
use std::cell::RefCell;

/// The step's shapes against the scratch, state and config (`out_len`: the output's length, if any).
fn check(
    layer: &AttnLayer,
    state: &AttnState,
    inp: &DecodeIn<'_>,
    sc: &AttnScratch,
    out_len: usize,
) -> Result<(), GpuError> {
    let (cfg, meta, rows) = (&layer.cfg, inp.meta, inp.rows);
    let io = (inp.a.len(), out_len);
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
        sc.act.proj.len() >= rows * layer.lin_rows && state.dim == cfg.head_dim,
        || "scratch/state dims".into(),
    )?;
    ensure(
        cfg.index_topk <= TOPK_MAX && (1..=GEMV_GROUPS).contains(&cfg.o_groups),
        || {
            format!(
                "index_topk {} (<= {TOPK_MAX}), o_groups {} (1..={GEMV_GROUPS})",
                cfg.index_topk, cfg.o_groups
            )
        },
    )
}

/// What one decode step reads: `rows` rows (row i = the sequence in slot `meta.slots[i]` at
/// `meta.positions[i]`) of the normalised block input `a` `[rows, hidden]` bf16.
pub struct DecodeIn<'a> {
    pub meta: &'a StepMeta,
    pub rows: usize,
    pub a: &'a CudaSlice<bf16>,
    /// The caller already wrote the scratch's `xq` (the FP8 fake quantisation of `a`, official numerics with
    /// FP8 wq_a: the decode HCPre does it in its finish kernel), so the projections skip their own x-quant
    /// launch (same bits).
    pub xq_ready: bool,
    /// The e4m3 codes and scales of `xq` when the caller's HCPre wrote them too (wq_a + wkv then take the
    /// FP8-activation GEMV where [`Step::q8`] engages it).
    pub codes: Option<Q8In>,
}

impl<'a> DecodeIn<'a> {
    /// The step's input, its FP8 copy not yet written.
    pub fn new(meta: &'a StepMeta, rows: usize, a: &'a CudaSlice<bf16>) -> Self {
        DecodeIn {
            meta,
            rows,
            a,
            xq_ready: false,
            codes: None,
        }
    }
}

/// One decode step of `inp`; writes `out` `[rows, hidden]` bf16. No allocation, no host sync, no host reads
/// of device values: graph-capturable. Slots within a step must be distinct, and the caller must keep every
/// position below the state's `max_context`.
#[allow(clippy::too_many_arguments)]
pub fn decode(
    ctx: &GpuContext,
    stream: &CudaStream,
    layer: &AttnLayer,
    state: &mut AttnState,
    inp: &DecodeIn<'_>,
    sc: &mut AttnScratch,
    out: &mut CudaSlice<bf16>,
    numerics: Numerics,
) -> Result<(), GpuError> {
    check(layer, state, inp, sc, out.len())?;
    let st = start(ctx, stream, layer, inp, numerics, None)?;
    heads(&st, layer, state, inp, sc)?;
    output(&st, layer, sc, out)
}

/// [`decode`] with a CUDA event recorded after each stage into `marks` (name, event): a per-kernel time
/// breakdown of an eager step (not for graph capture). Times: `marks[i-1].1.elapsed_ms(&marks[i].1)`.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn decode_profiled(
    ctx: &GpuContext,
    stream: &CudaStream,
    layer: &AttnLayer,
    state: &mut AttnState,
    inp: &DecodeIn<'_>,
    sc: &mut AttnScratch,
    out: &mut CudaSlice<bf16>,
    numerics: Numerics,
    marks: &mut StageMarks,
) -> Result<(), GpuError> {
    check(layer, state, inp, sc, out.len())?;
    let st = start(ctx, stream, layer, inp, numerics, Some(RefCell::new(marks)))?;
    heads(&st, layer, state, inp, sc)?;
    output(&st, layer, sc, out)
}

/// The step's launch context; records its first mark.
fn start<'a>(
    ctx: &'a GpuContext,
    stream: &'a CudaStream,
    layer: &'a AttnLayer,
    inp: &DecodeIn<'_>,
    numerics: Numerics,
    marks: Option<RefCell<&'a mut StageMarks>>,
) -> Result<Step<'a>, GpuError> {
    let st = Step {
        ctx,
        s: stream,
        cfg: &layer.cfg,
        rows: inp.rows,
        official: numerics == Numerics::Official,
        slots: dptr(&inp.meta.slots, stream),
        positions: dptr(&inp.meta.positions, stream),
        marks,
    };
    st.mark("start")?;
    Ok(st)
}

/// Everything up to the attention output of every head in `sc.act.o` (group-major).
fn heads(
    st: &Step<'_>,
    layer: &AttnLayer,
    state: &mut AttnState,
    inp: &DecodeIn<'_>,
    sc: &mut AttnScratch,
) -> Result<(), GpuError> {
    project(st, layer, state, inp, sc)?;
    stages::indexer(st, layer, state, sc)?;
    stages::attend(st, layer, state, sc)
}

/// [`decode`] without the output projection: leaves the heads' outputs in `sc.act.o` (group-major
/// `[groups, rows, heads·head_dim/groups]`). A tensor-parallel rank projects them itself (rank.rs).
pub fn decode_heads(
    ctx: &GpuContext,
    stream: &CudaStream,
    layer: &AttnLayer,
    state: &mut AttnState,
    inp: &DecodeIn<'_>,
    sc: &mut AttnScratch,
    numerics: Numerics,
) -> Result<(), GpuError> {
    check(layer, state, inp, sc, inp.a.len())?;
    let st = start(ctx, stream, layer, inp, numerics, None)?;
    heads(&st, layer, state, inp, sc)
}

/// q (normed per head, roped), the window row, and the stacked bf16 projections.
fn project(
    st: &Step<'_>,
    layer: &AttnLayer,
    state: &mut AttnState,
    inp: &DecodeIn<'_>,
    sc: &mut AttnScratch,
) -> Result<(), GpuError> {
    let a = inp.a;
    fork_lin(st, layer, state, a, sc)?;
    let (s, cfg, rows) = (st.s, st.cfg, st.rows);
    let d = cfg.hidden_size;
    // FP8 act_quant of the block input only for FP8-stored wq_a/wkv (one format: check_dims); skipped
    // when the caller's HCPre already wrote it (same bits, one launch fewer).
    let xq = st.official && layer.wq_a.act_quant();
    if xq && !inp.xq_ready {
        let p = row_prep::quant_input(dptr(a, s), dptr_mut(&mut sc.act.xq, s), rows, d);
        // SAFETY: a holds rows x hidden bf16 (checked), xq rows x hidden.
        unsafe { st.ctx.launch_attn_row_prep(s, &p) }?;
        st.mark("x quant")?;
    }
    let x = dptr(if xq { &sc.act.xq } else { a }, s);
    let jobs = [
        Job::linear(&layer.wq_a, x, dptr_mut(&mut sc.act.qr_f32, s), s),
        Job::linear(&layer.wkv, x, dptr_mut(&mut sc.act.kv_f32, s), s),
    ];
    match inp.codes.filter(|_| xq && inp.xq_ready && st.q8(true, d)) {
        Some(x8) => st.gemv_q8_on(x8, d, false, &jobs, sc)?,
        None => st.gemv(layer.wq_a.wt, d, false, &jobs, sc)?,
    }
    st.mark("wq_a+wkv")?;
    // wq_b and the indexer's wq_b share this input and its format (check_dims).
    let quant = st.official && layer.wq_b.act_quant();
    let (k, wt) = (cfg.q_lora_rank, layer.wq_b.wt);
    let mut p = row_prep::q_norm(s, layer, &mut sc.act, rows, quant);
    let q8 = st.with_codes(&mut p, st.q8(quant, k), sc);
    // SAFETY: qr_f32 / qr hold rows x q_lora, q_norm q_lora (x8 / x8_scales max_rows x q_lora codes and
    // scales when q8).
    unsafe { st.ctx.launch_attn_row_prep(s, &p) }?;
    st.mark("q norm")?;
    // wq_b and the indexer's wq_b read the same qr: one launch.
    let qr = dptr(&sc.act.qr, s);
    let q_job = Job::linear(&layer.wq_b, qr, dptr_mut(&mut sc.act.q_f32, s), s);
    let mut jobs = [q_job; 2];
    let jobs = match &layer.index {
        Some(ix) => {
            jobs[1] = Job::linear(&ix.wq_b, qr, dptr_mut(&mut sc.act.iq_f32, s), s);
            &jobs[..]
        }
        None => &jobs[..1],
    };
    st.gemv_maybe_q8(q8, wt, k, false, jobs, sc)?;
    st.mark("wq_b")?;
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
        x: dptr(&sc.act.q_f32, s),
        out: dptr_mut(&mut sc.act.q, s),
        x_stride: hd as i32,
        ..base
    };
    let kv = AttnVecPrep {
        x: dptr(&sc.act.kv_f32, s),
        norm_w: dptr(&layer.kv_norm, s),
        slots: st.slots,
        out: dptr_mut(&mut state.ring, s),
        x_stride: cfg.head_dim as i32,
        quant: st.quant(QUANT_Q8_NOPE),
        window: state.window as i32,
        ..base
    };
    let mut jobs = [
        (cfg.num_attention_heads, q),
        (1, kv),
        (0, AttnVecPrep::default()),
    ];
    let mut n = 2;
    if layer.index.is_some() {
        // The indexer's queries (iq_f32 came with wq_b): no norm, Hadamard + Q4 in official numerics.
        let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
        let iq = AttnVecPrep {
            x: dptr(&sc.act.iq_f32, s),
            freqs: dptr(&layer.freqs, s),
            positions: st.positions,
            out: dptr_mut(&mut sc.act.iq, s),
            x_stride: (ih * id) as i32,
            dim: id as i32,
            rdim: cfg.qk_rope_head_dim as i32,
            quant: st.quant(QUANT_HAD_Q4),
            ..Default::default()
        };
        jobs[2] = (ih, iq);
        n = 3;
    }
    // SAFETY: q_f32 / q hold rows x heads x head_dim; kv_f32 rows x head_dim and the ring is [slots, window,
    // head_dim] with meta slots < slots; iq_f32 / iq rows x index heads x index dim; positions rows ints.
    unsafe { st.ctx.launch_attn_vec_prep(s, rows, &jobs[..n]) }?;
    st.mark("q/kv prep")?;
    if layer.lin.is_some() {
        st.s.wait(&sc.lin_side.join)?;
        st.mark("bf16 lin (side stream, joined)")?;
    }
    Ok(())
}

/// The stacked bf16 compressor/indexer projection of the block input `a` (not the FP8-quantised xq: the
/// compressors and weights_proj run in bf16) into `sc.act.proj`, then the compressor updates that read only
/// it (stages::compress), on the side stream: forked from the work stream here, joined back at the end of
/// [`project`], before the indexer and the attention read the caches. The chains write disjoint buffers (the
/// side one `proj`, its own split-K scratch and the compressor states / caches, which the work stream touches
/// only after the join), so eager runs and graph replays (the fork becomes parallel branches) give the same
/// bits. At batch 1 this takes the compressor launch off the layer's critical path (the side chain, ~15 us,
/// ends well before wq_a+wkv, q norm and wq_b do).
fn fork_lin(
    st: &Step<'_>,
    layer: &AttnLayer,
    state: &mut AttnState,
    a: &CudaSlice<bf16>,
    sc: &mut AttnScratch,
) -> Result<(), GpuError> {
    let Some(lin) = &layer.lin else {
        // No projection, so no compressor reads one (a sliding-window layer): nothing to launch.
        return stages::compress(st, layer, state, dptr(&sc.act.proj, st.s));
    };
    let side = sc.lin_side.stream.clone();
    sc.lin_side.fork.record(st.s)?;
    side.wait(&sc.lin_side.fork)?;
    let job = Job {
        x: dptr(a, &side),
        w: dptr(lin, &side),
        out: dptr_mut(&mut sc.act.proj, &side),
        n: layer.lin_rows,
        ..Default::default()
    };
    let d = st.cfg.hidden_size;
    grouped_gemv(
        st.ctx,
        &side,
        st.rows,
        GemvWeights::Bf16,
        d,
        false,
        &[job],
        &mut sc.gemv_lin,
    )?;
    stages::compress(&st.on(&side), layer, state, dptr(&sc.act.proj, &side))?;
    sc.lin_side.join.record(&side)?;
    Ok(())
}

/// wo_a, all groups in one launch (no activation quant), regroup (+ FP8 act quant in official numerics), wo_b.
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
    // All groups in one launch: group g reads o[g] [rows, g_in] bf16 and writes u_f32[g] [rows, lora].
    let (o, u) = (dptr(&sc.act.o, s), dptr_mut(&mut sc.act.u_f32, s));
    let mut jobs = [Job::default(); GEMV_GROUPS];
    let groups = layer.wo_a.len().min(GEMV_GROUPS);
    for (g, w) in layer.wo_a.iter().take(groups).enumerate() {
        let x = o + (2 * g * rows * g_in) as u64;
        jobs[g] = Job::linear(w, x, u + (4 * g * rows * lora) as u64, s);
    }
    // The groups share one format (check_dims).
    st.gemv(layer.wo_a[0].wt, g_in, false, &jobs[..groups], sc)?;
    st.mark("wo_a")?;
    let quant = st.official && layer.wo_b.act_quant();
    let mut p = row_prep::regroup(
        dptr(&sc.act.u_f32, s),
        dptr_mut(&mut sc.act.u, s),
        cfg.o_groups,
        rows,
        lora,
        quant,
    );
    let q8 = st.with_codes(&mut p, st.q8(quant, layer.wo_b.k), sc);
    // SAFETY: u_f32 holds groups x rows x lora f32, u rows x groups*lora bf16 (x8 / x8_scales max_rows x
    // groups*lora codes and scales when q8).
    unsafe { st.ctx.launch_attn_row_prep(s, &p) }?;
    st.mark("u quant")?;
    let job = Job::linear(&layer.wo_b, dptr(&sc.act.u, s), dptr_mut(out, s), s);
    st.gemv_maybe_q8(q8, layer.wo_b.wt, layer.wo_b.k, true, &[job], sc)?;
    st.mark("wo_b")
}
