//! `kbench gemv-q8 [B,..]`: the FP8-activation GEMVs (gemv_wq8.cu) on the model's FP8 launches, next to the
//! bf16-x kernel the engine plans for the same launch (printed by the caller): the GEMV alone at each ring
//! depth, and the act_quant launch that makes its input plus the GEMV, back to back.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{
    bf16, GemvParams, GemvQ8X, GpuContext, Q8Kernel, FP8X_MAX_ROWS, GEMV_Q8_BLOCK, GEMV_ROW_TILE,
};

use super::{filled, ptr_of, ptr_of_ro, time_ms, R};

/// One model launch: its weight copies ([copy][group]) rotated out of L2, `p` the launch's params (x, w filled
/// per call), `scratch` (ws_len, cnt_len) what p.ws / p.cnt hold.
pub struct Q8Case<'a> {
    pub name: &'a str,
    pub ns: &'a [usize],
    pub ws: &'a [Vec<CudaSlice<u8>>],
    pub p: GemvParams,
    pub scratch: (usize, usize),
    pub x: &'a CudaSlice<bf16>,
    pub wbytes: usize,
}

/// Prints the q8 rows of one launch at `b` rows: gemv_fp8x (planned and neighbouring splits) and the wgmma ring
/// (each depth, split neighbours, and with an act_quant launch in front), where each runs.
pub fn bench(g: &GpuContext, c: &Q8Case<'_>, b: usize, copy: f64) -> R<()> {
    let k = c.p.k as usize;
    if !k.is_multiple_of(GEMV_Q8_BLOCK) {
        return Ok(());
    }
    let mut xq = filled(g, b * k, 0u8)?;
    let mut xs = filled(g, b * k / GEMV_Q8_BLOCK, 0f32)?;
    g.launch_act_quant(&g.stream, b, k, GEMV_Q8_BLOCK, c.x, &mut xq, &mut xs)?;
    let mut q = GemvQ8X::default();
    for i in 0..c.ns.len() {
        q.xq[i] = ptr_of(&mut xq, g);
        q.xs[i] = ptr_of(&mut xs, g);
    }
    let tiles: usize = c.ns.iter().map(|n| n.div_ceil(GEMV_ROW_TILE)).sum();
    let sms = g.info.sm_count as usize;
    let copies = c.ws.len();
    let launch_with = |kernel: Q8Kernel, it: usize, splits: usize| -> R<()> {
        let mut p = c.p;
        for (i, w) in c.ws[it % copies].iter().enumerate() {
            p.w[i] = ptr_of_ro(w, g);
        }
        let (groups, (wl, cl)) = (c.ns.len(), c.scratch);
        // SAFETY: xq / xs hold b*k codes and b*k/128 scales; weights, scales, outputs and scratch as the caller's
        // params name them (its scratch is sized for 8 splits, the most timed here).
        Ok(unsafe { g.launch_gemv_q8(&g.stream, kernel, (groups, splits), &p, &q, wl, cl) }?)
    };
    let launch = |it: usize, depth: usize, splits: usize| -> R<()> {
        let mut p = c.p;
        for (i, w) in c.ws[it % copies].iter().enumerate() {
            p.w[i] = ptr_of_ro(w, g);
        }
        // SAFETY: xq / xs hold b*k codes and b*k/128 scales; weights, scales, outputs and scratch as the caller's
        // params name them (the caller's scratch is sized for the largest split).
        Ok(unsafe {
            g.launch_gemv_wq8(
                &g.stream,
                (c.ns.len(), splits, depth),
                &p,
                &q,
                c.scratch.0,
                c.scratch.1,
            )
        }?)
    };
    let row = |label: String, splits: usize, ms: f64| {
        let gbs = (c.wbytes + b * k + 4 * b * c.ns.iter().sum::<usize>()) as f64 / ms / 1e6;
        println!(
            "| gemv {:<12} | {}x{k} x{} | {b:>2} | {label} | {splits:>3} | {:>8.2} | {gbs:>7.0} | {:>5.1}% |",
            c.name,
            c.ns.iter().max().unwrap_or(&0),
            c.ns.len(),
            ms * 1e3,
            100.0 * gbs / copy
        );
    };
    if g.gemv_fp8x_runs() && b <= FP8X_MAX_ROWS {
        let planned = Q8Kernel::MmaSync.splits(sms, tiles, k);
        for s in [planned, planned / 2, planned * 2] {
            if (1..=8).contains(&s) && (s == planned || s <= k / GEMV_Q8_BLOCK) {
                let ms = time_ms(g, 20, |it| launch_with(Q8Kernel::MmaSync, it, s))?;
                row(format!("q8 fp8x s{s}"), s, ms);
            }
        }
    }
    let Some(kern) = g.wq8_ring(b) else {
        return Ok(());
    };
    let splits = Q8Kernel::Wgmma.splits(sms, tiles, k);
    for d in 2..=kern.depth_max {
        let mark = if d == kern.depth { " (default)" } else { "" };
        let ms = time_ms(g, 20, |it| launch(it, d, splits))?;
        row(format!("q8 d{d}{mark}"), splits, ms);
    }
    for s in [splits / 4, splits / 2, splits * 2] {
        if (1..=8).contains(&s) && s <= k / GEMV_Q8_BLOCK {
            let ms = time_ms(g, 20, |it| launch(it, 0, s))?;
            row(format!("q8 s{s}"), s, ms);
        }
    }
    let ms = time_ms(g, 20, |it| {
        g.launch_act_quant(&g.stream, b, k, GEMV_Q8_BLOCK, c.x, &mut xq, &mut xs)?;
        launch(it, 0, splits)
    })?;
    row("act_quant + q8".into(), splits, ms);
    Ok(())
}
