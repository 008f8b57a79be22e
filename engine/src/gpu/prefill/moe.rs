//! The MoE over every row of a prefill call (spec 2.8): gate GEMM, the decode routing kernel, slots grouped
//! per expert into row tiles, the FP4 routed experts as grouped GEMMs (each expert's weights read once per
//! tile), the FP8 shared expert. Leaves per-slot routed outputs and the shared output for the HCPost.

use super::attn::Call;
use super::gemm::{self, ExpertTiles, Job};
use super::ws::{PrefillWs, EXPERT_MIN_BM};
use super::PrefillHook;
use crate::gpu::attention::{dptr, dptr_mut};
use crate::gpu::weights::{ExpertBank, MoeDev};
use crate::gpu::RunnerError;
use crate::model::ModelConfig;
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::{PfGroup, PfSwiglu, PfWeights};
use dsv4_kernels::{pf_kperm_cols, pf_max_tiles, RouteBy, RouteShape};

/// Routed-expert row tile for `slots` slots over `experts` on pf_gemm_fp4_expert: the larger tile once experts
/// average 96 rows (a tile converts its expert's weights however many of its rows are used; 32-row tiles
/// measured slower).
fn expert_bm(slots: usize, experts: usize) -> usize {
    if slots >= 96 * experts.max(1) {
        128
    } else {
        EXPERT_MIN_BM
    }
}

/// How a call's slots were grouped: the tile rows and the kernel the tiles are for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grouping {
    pub bm: usize,
    /// pf_wgmma_fp4_expert (inputs K-permuted by pf_kperm), else pf_gemm_fp4_expert.
    pub wgmma: bool,
}

/// Whether this call's routed experts take the wgmma kernel: an sm_90a fatbin device, enough rows
/// (DSV4_PF_WGMMA), and room for the K-permuted inputs: x' in `y_routed` (borrowed: w2 writes it only after
/// w1/w3 read x'), h' in `h` (sized for it; pf_swiglu_kperm writes it straight from g and u).
fn expert_wgmma(c: &Call<'_>, cfg: &ModelConfig, ws: &PrefillWs) -> bool {
    let (d, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let rows = c.plan.rows;
    let slots = rows * cfg.num_experts_per_tok;
    let ex = &ws.moe.ex;
    gemm::expert_wgmma(c.ctx, rows)
        && rows * pf_kperm_cols(d) <= 2 * ex.y_routed.len()
        && slots * pf_kperm_cols(i) <= ex.h.len()
}

pub(super) fn forward(
    c: &Call<'_>,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut PrefillWs,
    hook: PrefillHook<'_>,
) -> Result<(), RunnerError> {
    route(c, cfg, w, ws)?;
    let e = cfg.n_routed_experts;
    let ids = dptr(&ws.moe.ids, c.s);
    let grouping = group(c, cfg, ws, ids, e)?;
    hook("moe.route")?;
    routed(c, cfg, &w.bank, ws, grouping, e)?;
    hook("moe.routed")?;
    shared(c, w, cfg.swiglu_limit, ws)?;
    hook("moe.shared")
}

/// Gate GEMM and the decode routing kernel: expert ids and weights per slot (row·topk + k).
pub(super) fn route(
    c: &Call<'_>,
    cfg: &ModelConfig,
    w: &MoeDev,
    ws: &mut PrefillWs,
) -> Result<(), RunnerError> {
    let (s, rows) = (c.s, c.plan.rows);
    let (e, d, k) = (
        cfg.n_routed_experts,
        cfg.hidden_size,
        cfg.num_experts_per_tok,
    );
    let m = &mut ws.moe;
    let gate = Job::bf16(s, dptr(&ws.io.a, s), &w.gate, dptr_mut(&mut m.gate, s), e);
    gemm::dense(c.ctx, s, PfWeights::Bf16, rows, d, false, &[gate])?;
    let shape = RouteShape {
        rows,
        experts: e,
        topk: k,
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
    c.ctx
        .launch_moe_route(s, &shape, &m.gate, by, &mut m.ids, &mut m.wts)?;
    Ok(())
}

/// Groups the slots by the ids at `ids` (`experts` experts; negative ids are left out) into row tiles for the
/// kernel this call's experts take.
pub(super) fn group(
    c: &Call<'_>,
    cfg: &ModelConfig,
    ws: &mut PrefillWs,
    ids: u64,
    experts: usize,
) -> Result<Grouping, RunnerError> {
    let s = c.s;
    let slots = c.plan.rows * cfg.num_experts_per_tok;
    let wgmma = expert_wgmma(c, cfg, ws);
    let bm = if wgmma {
        gemm::expert_wgmma_bm(slots, experts)
    } else {
        expert_bm(slots, experts)
    };
    let m = &mut ws.moe;
    let gp = PfGroup {
        ids,
        order: dptr_mut(&mut m.order, s),
        tiles: dptr_mut(&mut m.tiles, s),
        slots: slots as i32,
        experts: experts as i32,
        bm: bm as i32,
        pad: 0,
    };
    // SAFETY: ids holds `slots` ids < experts (moe_route, or moe_localize's local ids and -1), order `slots`
    // ints, tiles was sized for the smallest tile (the most tiles) at the workspace's rows and all experts.
    unsafe { c.ctx.launch_pf_moe_group(s, &gp) }?;
    Ok(Grouping { bm, wgmma })
}

/// The sub-block input the expert GEMMs read: official numerics the FP8 fake-quantised `aq` (written by the
/// ffn HCPre), else `a`.
fn input(c: &Call<'_>, ws: &PrefillWs) -> u64 {
    if c.official {
        dptr(&ws.io.aq, c.s)
    } else {
        dptr(&ws.io.a, c.s)
    }
}

/// The grouped slots through the experts of `bank` (`experts` of them, tiles as `grouping`): per-slot
/// outputs `ws.moe.ex.y_routed`, weighted (slots outside the tiles are not written). On the wgmma kernel its
/// inputs come K-permuted: x through pf_kperm into `y_routed`, h from pf_swiglu_kperm (moe_swiglu and
/// pf_kperm in one pass, the same bits; see `expert_wgmma`).
pub(super) fn routed(
    c: &Call<'_>,
    cfg: &ModelConfig,
    bank: &ExpertBank,
    ws: &mut PrefillWs,
    grouping: Grouping,
    experts: usize,
) -> Result<(), RunnerError> {
    let (s, rows) = (c.s, c.plan.rows);
    let (d, i, k) = (
        cfg.hidden_size,
        cfg.moe_intermediate_size,
        cfg.num_experts_per_tok,
    );
    let slots = rows * k;
    let mut x = input(c, ws);
    let m = &mut ws.moe;
    let Grouping { bm, wgmma } = grouping;
    let tiles = ExpertTiles {
        tiles: dptr(&m.tiles, s),
        order: dptr(&m.order, s),
        bm,
        max_tiles: pf_max_tiles(slots, experts, bm),
        topk: k,
        wgmma,
    };
    if wgmma {
        let xp = dptr_mut(&mut m.ex.y_routed, s);
        // SAFETY: x holds rows x d bf16 (the ffn input); y_routed has room for rows x pf_kperm_cols(d) bf16
        // (expert_wgmma checked it) and is not read before w2 overwrites it.
        unsafe { gemm::kperm(c.ctx, s, x, xp, rows, d) }?;
        x = xp;
    }
    let up = [
        Job::new(s, x, &bank.w1, &bank.s1, dptr_mut(&mut m.ex.g, s), i),
        Job::new(s, x, &bank.w3, &bank.s3, dptr_mut(&mut m.ex.u, s), i),
    ];
    gemm::experts(c.ctx, s, &tiles, d, false, &up)?;
    let (lim, ex) = (cfg.swiglu_limit, &mut m.ex);
    if wgmma {
        let p = PfSwiglu {
            g: dptr(&ex.g, s),
            u: dptr(&ex.u, s),
            wt: dptr(&m.wts, s),
            out: dptr_mut(&mut ex.h, s),
            slots: slots as i32,
            inter: i as i32,
            limit: lim,
            quant: i32::from(c.official),
        };
        // SAFETY: g and u hold slots x i f32 (w1/w3 above), wts slots f32, h room for slots x pf_kperm_cols(i)
        // bf16 (expert_wgmma checked it); separate allocations.
        unsafe { c.ctx.launch_pf_swiglu_kperm(s, &p) }?;
    } else {
        let (g, u, wts) = (&ex.g, &ex.u, Some(&m.wts));
        c.ctx
            .launch_moe_swiglu(s, slots, i, lim, c.official, g, u, wts, &mut ex.h)?;
    }
    let h = dptr(&ex.h, s);
    let down = Job::new(s, h, &bank.w2, &bank.s2, dptr_mut(&mut ex.y_routed, s), d);
    gemm::experts(c.ctx, s, &tiles, i, true, &[down])
}

/// The shared expert (its rows held here: all of them on one GPU, a share on a tensor-split rank) into
/// `ws.moe.ex.y_shared`.
pub(super) fn shared(
    c: &Call<'_>,
    w: &MoeDev,
    swiglu_limit: f32,
    ws: &mut PrefillWs,
) -> Result<(), RunnerError> {
    let (s, rows) = (c.s, c.plan.rows);
    let x = input(c, ws);
    let m = &mut ws.moe;
    let [w1, w3, w2] = &w.shared;
    let up = [
        Job::new(s, x, &w1.w, &w1.scale, dptr_mut(&mut m.ex.sg, s), w1.out),
        Job::new(s, x, &w3.w, &w3.scale, dptr_mut(&mut m.ex.su, s), w3.out),
    ];
    gemm::fp8(c, rows, w1.inp, false, &up)?;
    let none: Option<&CudaSlice<f32>> = None;
    let i = w1.out;
    c.ctx.launch_moe_swiglu(
        s,
        rows,
        i,
        swiglu_limit,
        c.official,
        &m.ex.sg,
        &m.ex.su,
        none,
        &mut m.ex.sh,
    )?;
    let down = Job::new(
        s,
        dptr(&m.ex.sh, s),
        &w2.w,
        &w2.scale,
        dptr_mut(&mut m.ex.y_shared, s),
        w2.out,
    );
    gemm::fp8(c, rows, w2.inp, false, &[down])
}
