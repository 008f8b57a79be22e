//! The MoE of one block on the device (spec 2.8): gate GEMV, routing, grouped routed experts (FP4 or
//! bf16) and the shared expert (FP8 or bf16). The final sum of expert outputs is fused into the
//! following HCPost. Official numerics quantise an expert GEMV's input only for FP8/FP4 weights.

use super::attention::{dptr, dptr_mut, grouped_gemv, grouped_gemv_q8, Job};
use super::weights::{ExpertBank, Fp8Linear, MoeDev};
use super::workspace::{CodesOf, Workspace};
use super::RunnerError;
use crate::api::Numerics;
use crate::model::{ExpertFormat, ModelConfig};
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream, CudaView};
use dsv4_kernels::{
    bf16, env_usize, fp4_routed_up_fits, fp4_swiglu_down_fits, ExpertShape, Fp4Mat, GemvOut,
    GemvPath, GemvWeights, GpuContext, RouteBy, RouteShape, RoutedUpRoute, SwigluAct, SwigluIn,
};
use std::sync::OnceLock;

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

/// Gate logits, then (unless `fused`: the w1 / w3 launch routes) routing into `ws.ids` / `ws.wts` and the
/// expert grouping into `ws.group` (routing and grouping in one launch).
fn route_or_gate(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
    fused: bool,
) -> Result<(), RunnerError> {
    if fused {
        return gate_logits(ctx, cfg, w, ws, rows);
    }
    gate_route_into(ctx, cfg, w, ws, rows, true)
}

/// Up to this many rows the routed w1 / w3 launch routes the rows itself (the fused kernel, ops::fp4_routed,
/// which takes up to 4). Every block of that launch scores every (row, expert) pair again, so the fused form
/// pays only where the routing launch was one block's latency chain. Measured (one H200, full-size bench,
/// graphs, 4K, 15 steps after 3, same binary, three rounds, `DSV4_MOE_FUSED_ROUTE` 0 / 4, ms per step): batch 1
/// 6.533-6.560 -> 6.405-6.433 (-1.9%), batch 2 7.730-7.753 -> 7.891-7.911 (+2.1%), batch 4 9.913-9.965 ->
/// 10.864-10.901 (+9.5%: 3072 blocks scoring 1024 pairs each), batch 8 (not fused) unchanged.
const FUSED_ROUTE_ROWS: usize = 1;

/// Whether the routed w1 / w3 launch routes the rows itself: FP4 banks of the compiled shape, at most
/// [`FUSED_ROUTE_ROWS`] rows (`DSV4_MOE_FUSED_ROUTE`: another limit for A/B runs, 0 = never). The same bits as
/// the separate routing launch.
fn fused_route_up(cfg: &ModelConfig, w: &MoeDev, rows: usize) -> bool {
    static MAX_ROWS: OnceLock<usize> = OnceLock::new();
    let max_rows = rows_knob(&MAX_ROWS, "DSV4_MOE_FUSED_ROUTE", FUSED_ROUTE_ROWS);
    let (d, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    rows <= max_rows
        && w.bank.format == ExpertFormat::Fp4
        && fp4_routed_up_fits(
            &route_shape(cfg, rows),
            &expert_shape(cfg, rows, i, d, false),
        )
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
    gate_route_into(ctx, cfg, w, ws, rows, false)
}

/// The gate GEMV, then routing, with the grouping into `ws.group` when `group`.
fn gate_route_into(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
    group: bool,
) -> Result<(), RunnerError> {
    gate_logits(ctx, cfg, w, ws, rows)?;
    let (shape, s) = (route_shape(cfg, rows), &ctx.stream);
    let by = route_by(w, &ws.tokens);
    let (ids, wts) = (&mut ws.ids, &mut ws.wts);
    if group {
        ctx.launch_moe_route_group(s, &shape, &ws.gate, by, ids, wts, &mut ws.group)?;
    } else {
        ctx.launch_moe_route(s, &shape, &ws.gate, by, ids, wts)?;
    }
    Ok(())
}

/// The gate GEMV: f32 logits [rows, E] into `ws.gate`.
fn gate_logits(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
) -> Result<(), RunnerError> {
    let s = &ctx.stream;
    let (e, d) = (cfg.n_routed_experts, cfg.hidden_size);
    // Always gemv.cu: faster for these 256 rows at every batch than the ring (kbench, BENCH_NOTES ring2), and a
    // token's gate logits (so its experts) then have the same bits whatever the batch.
    let plan = ctx.gemv_plan_on(GemvPath::Skinny, GemvWeights::Bf16, rows, e, d)?;
    let out = GemvOut::f32(&mut ws.gate, s);
    ctx.launch_gemv_bf16(s, &plan, &ws.io.a, &w.gate, out, &mut ws.gemv)?;
    Ok(())
}

fn route_shape(cfg: &ModelConfig, rows: usize) -> RouteShape {
    RouteShape {
        rows,
        experts: cfg.n_routed_experts,
        topk: cfg.num_experts_per_tok,
        route_scale: cfg.routed_scaling_factor,
    }
}

/// Hash layers route by the token's row of `tid2eid`, the others by top-k of score + bias.
fn route_by<'a>(
    w: &'a MoeDev,
    tokens: &'a CudaSlice<i32>,
) -> RouteBy<'a, CudaSlice<i32>, CudaSlice<f32>> {
    match &w.tid2eid {
        Some(t) => RouteBy::Hash { tid2eid: t, tokens },
        None => RouteBy::TopK {
            bias: w.bias.as_ref(),
        },
    }
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

/// Routed experts: w1, w3 -> SwiGLU (x routing weight, act-quant) -> w2, per slot into `ws.ex.y_routed`.
/// `cfg.n_routed_experts` is the bank's expert count (a tensor-parallel rank's own experts). With
/// `fused_route` the w1 / w3 launch also routes and groups the rows (the gate logits are in `ws.gate` and no
/// routing launch ran: see [`fused_route_up`]).
pub(crate) fn routed(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
    quant: bool,
    fused_route: bool,
) -> Result<(), RunnerError> {
    let s = &ctx.stream;
    let (d, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let b = &w.bank;
    let quant = quant && b.format == ExpertFormat::Fp4;
    let x = if quant { &ws.io.aq } else { &ws.io.a };
    let up = expert_shape(cfg, rows, i, d, false);
    let (g, u) = (GemvOut::f32(&mut ws.ex.g, s), GemvOut::f32(&mut ws.ex.u, s));
    if fused_route {
        let route = RoutedUpRoute {
            shape: route_shape(cfg, rows),
            logits: &ws.gate,
            by: route_by(w, &ws.tokens),
        };
        let [m1, m3] = fp4_pair(b, [g, u]);
        let (ids, wts, meta) = (&mut ws.ids, &mut ws.wts, &mut ws.group);
        ctx.launch_fp4_routed_up(s, route, ids, wts, meta, &up, x, [m1, m3])?;
    } else {
        expert_up(ctx, s, &up, x, b, &ws.group, [g, u])?;
    }
    let down = expert_shape(cfg, rows, d, i, true);
    let lim = cfg.swiglu_limit;
    if fused_swiglu_down(b, &down) {
        let sw = SwigluIn {
            g: &ws.ex.g,
            u: &ws.ex.u,
            wt: Some(&ws.wts),
            limit: lim,
            quant,
        };
        let out = GemvOut::f32(&mut ws.ex.y_routed, s);
        let w2 = Fp4Mat {
            w: &b.w2,
            scale: &b.s2,
            out,
        };
        ctx.launch_fp4_swiglu_down(s, &down, sw, w2, &ws.group)?;
        return Ok(());
    }
    let slots = rows * cfg.num_experts_per_tok;
    let early_w2 = b.format == ExpertFormat::Fp4 && w2_starts_early();
    let act = SwigluAct {
        slots,
        inter: i,
        limit: lim,
        quant,
        early: early_w2,
    };
    let (g, u, wt) = (&ws.ex.g, &ws.ex.u, Some(&ws.wts));
    ctx.launch_moe_swiglu_with(s, act, g, u, wt, &mut ws.ex.h)?;
    let out = GemvOut::f32(&mut ws.ex.y_routed, s);
    if early_w2 {
        // The group table came from the routing, two launches back.
        let w2 = Fp4Mat {
            w: &b.w2,
            scale: &b.s2,
            out,
        };
        ctx.launch_fp4_expert_table_ready(s, &down, &ws.ex.h, w2, &ws.group)?;
        return Ok(());
    }
    expert_down(ctx, s, &down, &ws.ex.h, b, &ws.group, out)?;
    Ok(())
}

/// Whether the routed w2 after a separate SwiGLU launch starts during that launch (`DSV4_W2_EARLY=0`: not, for
/// A/B runs): the SwiGLU lets it be placed right after its own wait, and w2's blocks issue their first weight
/// chunks before they wait for it (the same bits). Measured (one H200, graphs, 4K, ms per step, two rounds):
/// batch 8 13.307 / 13.331 -> 13.189 / 13.207 (-0.9%; the early start alone -0.7%, the early weights alone
/// -0.4%), batch 1 (not this path) and 64 level.
fn w2_starts_early() -> bool {
    static V: OnceLock<usize> = OnceLock::new();
    rows_knob(&V, "DSV4_W2_EARLY", 1) != 0
}

/// Up to this many rows the routed w2 launch makes the SwiGLU itself (ops::fp4_swiglu_down): each block makes
/// its group's SwiGLU while its first weight chunks are in flight, which pays while the SwiGLU launch was latency
/// on the critical path. Measured (one H200, full-size bench, graphs, 4K, same binary, `DSV4_MOE_FUSED_SWIGLU`
/// 0 / 64, ms per step): batch 1 6.403-6.411 -> 6.320-6.325 (-1.3%, three rounds), batch 2 7.740 / 7.746 ->
/// 7.629 / 7.621 (-1.5%), batch 4 9.953 / 9.969 -> 9.813 / 9.812 (-1.5%), batch 8 13.573 / 13.584 -> 13.637 /
/// 13.647 (+0.5%: ~3 waves of blocks, each remaking its SwiGLU).
const FUSED_SWIGLU_ROWS: usize = 4;

/// Whether the routed w2 launch makes the SwiGLU itself: FP4 banks of the compiled shape, at most
/// [`FUSED_SWIGLU_ROWS`] rows (`DSV4_MOE_FUSED_SWIGLU`: another limit for A/B runs, 0 = never). The same bits
/// as the separate SwiGLU launch.
fn fused_swiglu_down(bank: &ExpertBank, down: &ExpertShape) -> bool {
    static MAX_ROWS: OnceLock<usize> = OnceLock::new();
    let max_rows = rows_knob(&MAX_ROWS, "DSV4_MOE_FUSED_SWIGLU", FUSED_SWIGLU_ROWS);
    down.b <= max_rows && bank.format == ExpertFormat::Fp4 && fp4_swiglu_down_fits(down)
}

/// The w1 and w3 matrices of an FP4 bank with their outputs.
fn fp4_pair<'a>(bank: &'a ExpertBank, outs: [GemvOut<'a>; 2]) -> [Fp4Mat<'a, CudaSlice<u8>>; 2] {
    let [g, u] = outs;
    [
        Fp4Mat {
            w: &bank.w1,
            scale: &bank.s1,
            out: g,
        },
        Fp4Mat {
            w: &bank.w3,
            scale: &bank.s3,
            out: u,
        },
    ]
}

/// The w2 (down) GEMV of `bank`, in the bank's format.
fn expert_down(
    ctx: &GpuContext,
    s: &CudaStream,
    shape: &ExpertShape,
    x: &CudaSlice<bf16>,
    bank: &ExpertBank,
    group: &CudaSlice<i32>,
    out: GemvOut<'_>,
) -> Result<(), RunnerError> {
    match bank.format {
        ExpertFormat::Fp4 => {
            ctx.launch_fp4_expert(s, shape, x, &bank.w2, &bank.s2, group, out)?;
        }
        ExpertFormat::Bf16 => {
            ctx.launch_bf16_expert(s, shape, x, &bf16_view(&bank.w2)?, group, out)?
        }
        ExpertFormat::Fp8 => return Err(fp8_unsupported()),
    }
    Ok(())
}

/// The w1 and w3 (up) GEMVs of `bank` in one launch (same input, same grouping) into `outs`.
fn expert_up(
    ctx: &GpuContext,
    s: &CudaStream,
    shape: &ExpertShape,
    x: &CudaSlice<bf16>,
    bank: &ExpertBank,
    group: &CudaSlice<i32>,
    outs: [GemvOut<'_>; 2],
) -> Result<(), RunnerError> {
    let [g, u] = outs;
    match bank.format {
        ExpertFormat::Fp4 => {
            ctx.launch_fp4_expert_pair(s, shape, x, fp4_pair(bank, [g, u]), group, None)?;
        }
        ExpertFormat::Bf16 => {
            let (w1, w3) = (bf16_view(&bank.w1)?, bf16_view(&bank.w3)?);
            ctx.launch_bf16_expert_pair(s, shape, x, [(&w1, g), (&w3, u)], group)?;
        }
        ExpertFormat::Fp8 => return Err(fp8_unsupported()),
    }
    Ok(())
}

fn fp8_unsupported() -> RunnerError {
    RunnerError::Unsupported("FP8 routed experts are not run on the GPU".into())
}

/// A Bf16 bank's byte buffer viewed as bf16.
fn bf16_view(w: &CudaSlice<u8>) -> Result<CudaView<'_, bf16>, RunnerError> {
    // SAFETY: a Bf16 bank's matrices hold bf16 values as their little-endian bytes (load.rs), and every
    // 16-bit pattern is a valid bf16; the view covers the whole buffer.
    unsafe { w.transmute::<bf16>(w.len() / 2) }
        .ok_or_else(|| RunnerError::Unsupported("bf16 expert bank of odd byte length".into()))
}

/// The shared expert into `ws.ex.y_shared` on the work stream (the tensor-split rank's serial path).
pub(crate) fn shared(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
    quant: bool,
) -> Result<(), RunnerError> {
    shared_on(ctx, &ctx.stream, cfg, w, ws, rows, quant)
}

/// The shared expert into `ws.ex.y_shared` on stream `s`: w1 and w3 in one grouped GEMV (same input),
/// SwiGLU, w2. Its width is the weights' (a tensor-parallel rank holds a slice of its rows). Its GEMVs use
/// their own split-K scratch (`ws.gemv_side`), so they may run concurrently with the gate GEMV.
fn shared_on(
    ctx: &GpuContext,
    s: &CudaStream,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
    quant: bool,
) -> Result<(), RunnerError> {
    let [w1, w3, w2] = &w.shared;
    // w1 and w3 share one launch, so one format (checked at load: check_shared_formats).
    let wt = w1.wt;
    let quant = quant && wt == GemvWeights::Fp8;
    let x = dptr(if quant { &ws.io.aq } else { &ws.io.a }, s);
    let up = [
        fp8_job(w1, x, &mut ws.ex.sg, s),
        fp8_job(w3, x, &mut ws.ex.su, s),
    ];
    // The FFN HCPre wrote aq's codes where the FP8-activation GEMV engages at this many rows (codes_of).
    let codes = ws.codes.of(CodesOf::Ffn, s).filter(|_| quant);
    match codes {
        Some(x8) => grouped_gemv_q8(ctx, s, rows, (w1.inp, false), &up, x8, &mut ws.gemv_side)?,
        None => grouped_gemv(ctx, s, rows, wt, w1.inp, false, &up, &mut ws.gemv_side)?,
    }
    let (i, lim) = (w1.out, cfg.swiglu_limit);
    let none: Option<&CudaSlice<f32>> = None;
    ctx.launch_moe_swiglu(
        s,
        rows,
        i,
        lim,
        quant,
        &ws.ex.sg,
        &ws.ex.su,
        none,
        &mut ws.ex.sh,
    )?;
    let down = [fp8_job(w2, dptr(&ws.ex.sh, s), &mut ws.ex.y_shared, s)];
    grouped_gemv(ctx, s, rows, w2.wt, w2.inp, false, &down, &mut ws.gemv_side)?;
    Ok(())
}

/// Up to this many rows the shared expert forks before the gate GEMV, above it after the routing (now: always
/// before).
/// Measured (H200, full-size bench, graph replay, ms/step): batch 1 forking before the gate 9.83 vs after
/// the routing 9.92; batch 8 21.05 vs 21.02; batch 64 79.24 vs 78.83 (serial: 10.18, 21.06, 79.92). At
/// large batches the shared expert's GEMVs compete with the gate GEMV and routing, which every routed
/// launch waits for; at batch 1 the SMs are mostly idle and the earlier start wins. Re-measured with PDL on
/// (twelfth session, same call, graphs): batch 1 6.79 / 6.79 forking early against 7.00 / 7.01 after the
/// routing, batch 2 8.02 / 8.03 against 8.19 / 8.19. Thirteenth session (same call, three rounds): batch 8
/// 14.415 / 14.427 / 14.362 early against 14.509 / 14.553 / 14.503 after (-0.8%), batch 16 a tie (21.94-22.00
/// against 21.86-22.03), batch 4 early either way: so early up to 8 rows. Eighteenth session (`0c16ebf`'s
/// kernels, one H200, same call, three rounds, `DSV4_MOE_FORK_EARLY_ROWS` 16 against 8): batch 9 15.06-15.07 ->
/// 14.85-14.90, batch 12 17.42-17.55 -> 17.21-17.24, batch 16 20.07-20.10 -> 19.89-19.93 (-0.8 to -1.4%); batch
/// 24 (after the routing either way) 25.90-25.99 against 25.83-25.97: so early up to 16 rows. Then
/// `DSV4_MOE_FORK_EARLY_ROWS` 64 against 16 (same call, three rounds): batch 24 25.30-25.36 -> 25.08-25.11,
/// batch 32 29.94-30.01 -> 29.71-29.86, batch 48 37.21-37.64 -> 37.12-37.25, batch 64 42.35-42.44 ->
/// 42.06-42.20 (-0.6 to -0.9%): with today's routed-expert kernels the early start wins at every batch, so the
/// shared expert always forks before the gate (the knob's 0 still puts it after the routing).
const FORK_BEFORE_GATE_ROWS: usize = usize::MAX;

/// [`FORK_BEFORE_GATE_ROWS`], or `DSV4_MOE_FORK_EARLY_ROWS` (A/B runs; 0: always after the routing).
fn fork_before_gate_rows() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    rows_knob(&V, "DSV4_MOE_FORK_EARLY_ROWS", FORK_BEFORE_GATE_ROWS)
}

/// A row-count switch read once from the environment variable `name` (for A/B runs), else `default`.
fn rows_knob(cell: &'static OnceLock<usize>, name: &str, default: usize) -> usize {
    *cell.get_or_init(|| env_usize(name).unwrap_or(default))
}

/// The MoE of `rows` rows of `ws.io.a`: leaves routed outputs in `ws.ex.y_routed` and the shared expert's in
/// `ws.ex.y_shared` (summed by the caller's HCPost).
///
/// The shared expert depends only on the input, so it runs on the workspace's side stream, forked from
/// the work stream (before the gate GEMV or after the routing, see [`FORK_BEFORE_GATE_ROWS`]) and joined
/// after the routed experts: the two chains of dependent launches overlap (graph capture turns the fork
/// into parallel branches). The chains write disjoint buffers, so eager runs and replays give the same
/// bits as a serial order. With a profiling `hook`, "moe.route" and "moe.routed" time the routed chain
/// (with the shared expert running beside it) and "moe.shared" only the join's extra wait.
pub fn forward(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut Workspace,
    rows: usize,
    numerics: Numerics,
    hook: Hook<'_>,
) -> Result<(), RunnerError> {
    // Official numerics: ws.io.aq (the FP8 fake-quantised input) was written by the ffn HCPre; it (and the
    // FP8 round trip of the SwiGLU output) feeds FP4 experts / FP8 shared experts only.
    let official = numerics == Numerics::Official;
    let early = rows <= fork_before_gate_rows();
    let fused = fused_route_up(cfg, w, rows);
    if !early {
        route_or_gate(ctx, cfg, w, ws, rows, fused)?;
    }
    let side = ws.side.stream.clone();
    ws.side.fork.record(&ctx.stream)?;
    side.wait(&ws.side.fork)?;
    shared_on(ctx, &side, cfg, w, ws, rows, official)?;
    ws.side.join.record(&side)?;
    if early {
        route_or_gate(ctx, cfg, w, ws, rows, fused)?;
    }
    hook("moe.route", ws)?;
    routed(ctx, cfg, w, ws, rows, official, fused)?;
    hook("moe.routed", ws)?;
    ctx.stream.wait(&ws.side.join)?;
    hook("moe.shared", ws)
}
