//! The MoE of one block on the device (spec 2.8): gate GEMV, routing, grouped routed experts (FP4 or
//! bf16) and the shared expert (FP8 or bf16). The final sum of expert outputs is fused into the
//! following HCPost. Official numerics quantise an expert GEMV's input only for FP8/FP4 weights.

use super::attention::{dptr, dptr_mut, grouped_gemv, Job};
use super::weights::{ExpertBank, Fp8Linear, MoeDev};
use super::workspace::Workspace;
use super::RunnerError;
use crate::api::Numerics;
use crate::model::{ExpertFormat, ModelConfig};
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{bf16, ExpertShape, GemvOut, GemvWeights, GpuContext, RouteBy, RouteShape};

/// Called after each op with its name and the workspace (the profiler records an event there, the
/// bench reads the routed expert ids; normally a no-op).
pub type Hook<'a> = &'a mut dyn FnMut(&'static str, &Workspace) -> Result<(), RunnerError>;

/// A linear of the MoE (FP8 or bf16) as one group of a grouped GEMV (x `[rows, inp]` bf16 -> out f32).
fn fp8_job(lin: &Fp8Linear, x: u64, out: &mut CudaSlice<f32>, s: &CudaStream) -> Job {
    Job {
        x,
        w: dptr(&lin.w, s),
        s: dptr(&lin.scale, s),
        out: dptr_mut(out, s),
        n: lin.out,
    }
}

/// The shared expert's w1 and w3 run in one grouped GEMV: they must share a weight format.
pub(crate) fn check_shared_formats(w: &MoeDev, layer: usize) -> Result<(), RunnerError> {
    let [w1, w3, _] = &w.shared;
    if w1.wt != w3.wt {
        return Err(RunnerError::Unsupported(format!(
            "layer {layer}: shared expert w1 is {:?} but w3 {:?} (one GEMV launch reads both)",
            w1.wt, w3.wt
        )));
    }
    Ok(())
}

/// Gate logits and routing into `ws.ids` / `ws.wts`, then the expert grouping.
fn route(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
) -> Result<(), RunnerError> {
    gate_route(ctx, cfg, w, ws, rows)?;
    let gshape = expert_shape(cfg, rows, 0, 0, false);
    ctx.launch_moe_group(&ctx.stream, &gshape, &ws.ids, &mut ws.group)?;
    Ok(())
}

/// Gate logits and routing into `ws.ids` (global expert ids) / `ws.wts`, without the grouping (a
/// tensor-parallel rank groups only the ids of its own experts).
pub(crate) fn gate_route(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
) -> Result<(), RunnerError> {
    let s = &ctx.stream;
    let (e, d) = (cfg.n_routed_experts, cfg.hidden_size);
    let plan = ctx.gemv_plan(GemvWeights::Bf16, rows, e, d)?;
    let out = GemvOut::f32(&mut ws.gate, s);
    ctx.launch_gemv_bf16(s, &plan, &ws.a, &w.gate, out, &mut ws.gemv)?;
    let shape = RouteShape {
        rows,
        experts: e,
        topk: cfg.num_experts_per_tok,
        route_scale: cfg.routed_scaling_factor,
    };
    let by: RouteBy<'_, CudaSlice<i32>, CudaSlice<f32>> = match &w.tid2eid {
        Some(t) => RouteBy::Hash {
            tid2eid: t,
            tokens: &ws.tokens,
        },
        None => RouteBy::TopK {
            bias: w.bias.as_ref(),
        },
    };
    ctx.launch_moe_route(s, &shape, &ws.gate, by, &mut ws.ids, &mut ws.wts)?;
    Ok(())
}

pub(crate) fn expert_shape(
    cfg: &ModelConfig,
    rows: usize,
    n: usize,
    k: usize,
    per_slot: bool,
) -> ExpertShape {
    ExpertShape {
        b: rows,
        topk: cfg.num_experts_per_tok,
        experts: cfg.n_routed_experts,
        n,
        k,
        x_per_slot: per_slot,
    }
}

/// Routed experts: w1, w3 -> SwiGLU (x routing weight, act-quant) -> w2, per slot into `ws.y_routed`.
/// `cfg.n_routed_experts` is the bank's expert count (a tensor-parallel rank's own experts).
pub(crate) fn routed(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
    quant: bool,
) -> Result<(), RunnerError> {
    let s = &ctx.stream;
    let (d, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let b = &w.bank;
    let quant = quant && b.format == ExpertFormat::Fp4;
    let x = if quant { &ws.aq } else { &ws.a };
    let up = expert_shape(cfg, rows, i, d, false);
    expert_gemv(
        ctx,
        s,
        &up,
        x,
        b,
        Which::W1,
        &ws.group,
        GemvOut::f32(&mut ws.g, s),
    )?;
    expert_gemv(
        ctx,
        s,
        &up,
        x,
        b,
        Which::W3,
        &ws.group,
        GemvOut::f32(&mut ws.u, s),
    )?;
    let slots = rows * cfg.num_experts_per_tok;
    let lim = cfg.swiglu_limit;
    ctx.launch_moe_swiglu(
        s,
        slots,
        i,
        lim,
        quant,
        &ws.g,
        &ws.u,
        Some(&ws.wts),
        &mut ws.h,
    )?;
    let down = expert_shape(cfg, rows, d, i, true);
    let out = GemvOut::f32(&mut ws.y_routed, s);
    expert_gemv(ctx, s, &down, &ws.h, b, Which::W2, &ws.group, out)?;
    Ok(())
}

#[derive(Clone, Copy)]
enum Which {
    W1,
    W3,
    W2,
}

/// One grouped routed-expert GEMV of `bank`'s matrix `which`, in the bank's format.
#[allow(clippy::too_many_arguments)]
fn expert_gemv(
    ctx: &GpuContext,
    s: &CudaStream,
    shape: &ExpertShape,
    x: &CudaSlice<bf16>,
    bank: &ExpertBank,
    which: Which,
    group: &CudaSlice<i32>,
    out: GemvOut<'_>,
) -> Result<(), RunnerError> {
    let (w, sc) = match which {
        Which::W1 => (&bank.w1, &bank.s1),
        Which::W3 => (&bank.w3, &bank.s3),
        Which::W2 => (&bank.w2, &bank.s2),
    };
    match bank.format {
        ExpertFormat::Fp4 => ctx.launch_fp4_expert(s, shape, x, w, sc, group, out)?,
        ExpertFormat::Bf16 => {
            // SAFETY: a Bf16 bank's matrices hold bf16 values as their little-endian bytes (load.rs), and
            // every 16-bit pattern is a valid bf16; the view covers the whole buffer.
            let wb = unsafe { w.transmute::<bf16>(w.len() / 2) }.ok_or_else(|| {
                RunnerError::Unsupported("bf16 expert bank of odd byte length".into())
            })?;
            ctx.launch_bf16_expert(s, shape, x, &wb, group, out)?
        }
        ExpertFormat::Fp8 => {
            return Err(RunnerError::Unsupported(
                "FP8 routed experts are not run on the GPU".into(),
            ))
        }
    }
    Ok(())
}

/// The shared expert into `ws.y_shared`: w1 and w3 in one grouped GEMV (same input), SwiGLU, w2. Its
/// width is the weights' (a tensor-parallel rank holds a slice of its rows).
pub(crate) fn shared(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
    quant: bool,
) -> Result<(), RunnerError> {
    let s = &ctx.stream;
    let [w1, w3, w2] = &w.shared;
    // w1 and w3 share one launch, so one format (checked at load: check_shared_formats).
    let wt = w1.wt;
    let quant = quant && wt == GemvWeights::Fp8;
    let x = dptr(if quant { &ws.aq } else { &ws.a }, s);
    let up = [fp8_job(w1, x, &mut ws.sg, s), fp8_job(w3, x, &mut ws.su, s)];
    grouped_gemv(ctx, s, rows, wt, w1.inp, false, &up, &mut ws.gemv)?;
    let (i, lim) = (w1.out, cfg.swiglu_limit);
    let none: Option<&CudaSlice<f32>> = None;
    ctx.launch_moe_swiglu(s, rows, i, lim, quant, &ws.sg, &ws.su, none, &mut ws.sh)?;
    let down = [fp8_job(w2, dptr(&ws.sh, s), &mut ws.y_shared, s)];
    grouped_gemv(ctx, s, rows, w2.wt, w2.inp, false, &down, &mut ws.gemv)?;
    Ok(())
}

/// The MoE of `rows` rows of `ws.a`: leaves routed outputs in `ws.y_routed` and the shared expert's in
/// `ws.y_shared` (summed by the caller's HCPost).
pub fn forward(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
    numerics: Numerics,
    hook: Hook<'_>,
) -> Result<(), RunnerError> {
    route(ctx, cfg, w, ws, rows)?;
    hook("moe.route", ws)?;
    // Official numerics: ws.aq (the FP8 fake-quantised input) was written by the ffn HCPre; it (and the
    // FP8 round trip of the SwiGLU output) feeds FP4 experts / FP8 shared experts only.
    let official = numerics == Numerics::Official;
    routed(ctx, cfg, w, ws, rows, official)?;
    hook("moe.routed", ws)?;
    shared(ctx, cfg, w, ws, rows, official)?;
    hook("moe.shared", ws)
}
