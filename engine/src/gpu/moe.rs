//! The MoE of one block on the device (spec 2.8): gate GEMV, routing, grouped FP4 routed experts and
//! the FP8 shared expert. The final sum of expert outputs is fused into the following HCPost.

use super::attention::{dptr, dptr_mut, grouped_gemv, Job};
use super::weights::{Fp8Linear, MoeDev};
use super::workspace::Workspace;
use super::RunnerError;
use crate::api::Numerics;
use crate::model::ModelConfig;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{ExpertShape, GemvOut, GemvWeights, GpuContext, RouteBy, RouteShape};

/// Called after each op with its name and the workspace (the profiler records an event there, the
/// bench reads the routed expert ids; normally a no-op).
pub type Hook<'a> = &'a mut dyn FnMut(&'static str, &Workspace) -> Result<(), RunnerError>;

/// An FP8 linear of the MoE as one group of a grouped GEMV (x `[rows, inp]` bf16 -> out f32).
fn fp8_job(lin: &Fp8Linear, x: u64, out: &mut CudaSlice<f32>, s: &CudaStream) -> Job {
    Job {
        x,
        w: dptr(&lin.w, s),
        s: dptr(&lin.scale, s),
        out: dptr_mut(out, s),
        n: lin.out,
    }
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
    let x = if quant { &ws.aq } else { &ws.a };
    let up = expert_shape(cfg, rows, i, d, false);
    ctx.launch_fp4_expert(
        s,
        &up,
        x,
        &b.w1,
        &b.s1,
        &ws.group,
        GemvOut::f32(&mut ws.g, s),
    )?;
    ctx.launch_fp4_expert(
        s,
        &up,
        x,
        &b.w3,
        &b.s3,
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
    ctx.launch_fp4_expert(s, &down, &ws.h, &b.w2, &b.s2, &ws.group, out)?;
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
    let fp8 = GemvWeights::Fp8;
    let x = dptr(if quant { &ws.aq } else { &ws.a }, s);
    let [w1, w3, w2] = &w.shared;
    let up = [fp8_job(w1, x, &mut ws.sg, s), fp8_job(w3, x, &mut ws.su, s)];
    grouped_gemv(ctx, s, rows, fp8, w1.inp, false, &up, &mut ws.gemv)?;
    let (i, lim) = (w1.out, cfg.swiglu_limit);
    let none: Option<&CudaSlice<f32>> = None;
    ctx.launch_moe_swiglu(s, rows, i, lim, quant, &ws.sg, &ws.su, none, &mut ws.sh)?;
    let down = [fp8_job(w2, dptr(&ws.sh, s), &mut ws.y_shared, s)];
    grouped_gemv(ctx, s, rows, fp8, w2.inp, false, &down, &mut ws.gemv)?;
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
    // Official numerics: ws.aq (the FP8 fake-quantised input) was written by the ffn HCPre.
    let quant = numerics == Numerics::Official;
    routed(ctx, cfg, w, ws, rows, quant)?;
    hook("moe.routed", ws)?;
    shared(ctx, cfg, w, ws, rows, quant)?;
    hook("moe.shared", ws)
}
