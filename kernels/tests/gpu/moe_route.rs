//! moe_route and the fused moe_route_group against a CPU routing reference and the CPU grouping.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{moe_group_meta_len, ExpertShape, RouteBy, RouteShape};
use rand::Rng;

use crate::common::*;
use crate::expert::assert_grouping;

/// sqrt(softplus(l)) in f64 (the kernel computes it in f32).
fn score(l: f32) -> f64 {
    let l = l as f64;
    let sp = if l > 20.0 { l } else { l.exp().ln_1p() };
    sp.sqrt()
}

/// Checks one row's top-k choice against the f64 scores: the chosen experts come in descending order of
/// score + bias and no other expert beats the last one, both up to `tol` (f32 score rounding); the weights
/// are s / sum s * scale to 1e-5 relative.
#[allow(clippy::too_many_arguments)]
fn check_row(
    row: usize,
    logits: &[f32],
    bias: Option<&[f32]>,
    ids: &[i32],
    wts: &[f32],
    e: usize,
    topk: usize,
    scale: f32,
) {
    let tol = 1e-5;
    let sc: Vec<f64> = logits[row * e..(row + 1) * e]
        .iter()
        .map(|&l| score(l))
        .collect();
    let biased = |i: usize| sc[i] + bias.map_or(0.0, |b| b[i] as f64);
    let chosen: Vec<usize> = ids[row * topk..(row + 1) * topk]
        .iter()
        .map(|&i| usize::try_from(i).expect("id >= 0"))
        .collect();
    for w in chosen.windows(2) {
        assert!(
            w[0] != w[1] && biased(w[0]) + tol >= biased(w[1]),
            "row {row}: order {chosen:?}"
        );
    }
    let last = biased(*chosen.last().expect("topk > 0"));
    for i in (0..e).filter(|i| !chosen.contains(i)) {
        assert!(
            biased(i) <= last + tol,
            "row {row}: expert {i} beats the chosen {chosen:?}"
        );
    }
    check_weights(row, &sc, &chosen, wts, topk, scale);
}

fn check_weights(row: usize, sc: &[f64], chosen: &[usize], wts: &[f32], topk: usize, scale: f32) {
    let sum: f64 = chosen.iter().map(|&i| sc[i]).sum();
    for (k, &i) in chosen.iter().enumerate() {
        let want = sc[i] / sum * scale as f64;
        let got = wts[row * topk + k] as f64;
        assert!(
            (got - want).abs() <= 1e-5 * want.abs() + 1e-12,
            "row {row} k {k}: weight {got} want {want}"
        );
    }
}

/// How a case routes.
#[derive(Debug, Clone, Copy)]
enum By {
    TopK,
    TopKBias,
    Hash,
}

/// Routes `rows` random rows with moe_route + moe_group and with moe_route_group (twice: the block
/// counter must be back at zero); all three must give the same bits, the routing must match the CPU and
/// the grouping the CPU grouping.
fn run_case(g: &dsv4_kernels::GpuContext, seed: u64, rows: usize, e: usize, topk: usize, by: By) {
    let mut r = rng(seed);
    let scale = 2.5f32;
    let logits: Vec<f32> = (0..rows * e)
        .map(|_| r.random_range(-6.0f32..6.0))
        .collect();
    let bias: Vec<f32> = (0..e).map(|_| r.random_range(-0.5f32..0.5)).collect();
    let vocab: i32 = 50;
    let table: Vec<i32> = (0..vocab)
        .flat_map(|_| crate::expert::rand_ids(&mut r, 1, topk, e))
        .collect();
    let tokens: Vec<i32> = (0..rows).map(|_| r.random_range(0..vocab)).collect();
    let (dl, db, dt, dtok) = (
        upload(g, &logits),
        upload(g, &bias),
        upload(g, &table),
        upload(g, &tokens),
    );
    let shape = RouteShape {
        rows,
        experts: e,
        topk,
        route_scale: scale,
    };
    let route_by = || -> RouteBy<'_, CudaSlice<i32>, CudaSlice<f32>> {
        match by {
            By::TopK => RouteBy::TopK { bias: None },
            By::TopKBias => RouteBy::TopK { bias: Some(&db) },
            By::Hash => RouteBy::Hash {
                tid2eid: &dt,
                tokens: &dtok,
            },
        }
    };
    let s = rows * topk;
    let mlen = moe_group_meta_len(s);
    let (mut ids, mut wts) = (upload(g, &vec![-1i32; s]), upload(g, &vec![f32::NAN; s]));
    let mut meta: CudaSlice<i32> = upload(g, &vec![-7i32; mlen]);
    g.launch_moe_route(&g.stream, &shape, &dl, route_by(), &mut ids, &mut wts)
        .expect("route");
    let gshape = ExpertShape {
        b: rows,
        topk,
        experts: e,
        n: 0,
        k: 0,
        x_per_slot: false,
    };
    g.launch_moe_group(&g.stream, &gshape, &ids, &mut meta)
        .expect("group");
    let (hid, hwt) = (download(g, &ids), download(g, &wts));
    assert_grouping(&download(g, &meta), &hid, e, "moe_group");
    for row in 0..rows {
        match by {
            By::Hash => {
                let t = tokens[row] as usize;
                assert_eq!(
                    hid[row * topk..(row + 1) * topk],
                    table[t * topk..(t + 1) * topk],
                    "hash row {row}"
                );
                let sc: Vec<f64> = logits[row * e..(row + 1) * e]
                    .iter()
                    .map(|&l| score(l))
                    .collect();
                let chosen: Vec<usize> = table[t * topk..(t + 1) * topk]
                    .iter()
                    .map(|&i| i as usize)
                    .collect();
                check_weights(row, &sc, &chosen, &hwt, topk, scale);
            }
            By::TopK => check_row(row, &logits, None, &hid, &hwt, e, topk, scale),
            By::TopKBias => check_row(row, &logits, Some(&bias), &hid, &hwt, e, topk, scale),
        }
    }
    // Fused, twice, into poisoned ids / weights / meta (the counter, last, starts at zero).
    for pass in 0..2 {
        let mut poison = vec![-7i32; mlen];
        poison[mlen - 1] = 0;
        let mut fmeta: CudaSlice<i32> = upload(g, &poison);
        let (mut fid, mut fwt) = (upload(g, &vec![-1i32; s]), upload(g, &vec![f32::NAN; s]));
        for _ in 0..=pass {
            g.launch_moe_route_group(
                &g.stream,
                &shape,
                &dl,
                route_by(),
                &mut fid,
                &mut fwt,
                &mut fmeta,
            )
            .expect("route_group");
        }
        let fm = download(g, &fmeta);
        let case = format!("rows {rows} E {e} topk {topk} {by:?} pass {pass}");
        assert_eq!(download(g, &fid), hid, "{case}: ids");
        assert_same_bits(&download(g, &fwt), &hwt, &format!("{case}: weights"));
        assert_grouping(&fm, &hid, e, &format!("{case}: grouping"));
        assert_eq!(fm[mlen - 1], 0, "{case}: counter not reset");
    }
}

#[test]
fn moe_route_group_matches_reference() {
    let Some(g) = gpu() else { return };
    let cases = [
        (1, 256, 6, By::TopKBias), // decode batch 1 of the real model: one warp routes and groups
        (3, 256, 6, By::Hash),
        (5, 8, 6, By::TopK), // few experts, 30 slots: one block, warp grouping
        (64, 256, 6, By::TopKBias), // batch 64: 16 blocks, 384 slots
        (17, 1000, 16, By::TopKBias), // E not a multiple of 32, top-16, the first multi-block row count
        (64, 33, 1, By::TopK),        // top-1, one expert past a warp
        (9, 64, 4, By::Hash),         // one block, 36 slots: block grouping
        (8, 256, 6, By::TopKBias),    // decode batch 8 of the real model: 48 slots
        (11, 8, 5, By::TopK),         // 55 slots over 8 experts: long runs of one expert
        (16, 256, 2, By::TopK),       // one block of 16 warps, exactly 32 slots
        (2, 1000, 16, By::TopK),      // the 32-per-lane register width, 32 slots
        (16, 300, 6, By::TopKBias),   // one block, 96 slots, 32 per lane
        (1, 3, 3, By::TopK),          // every expert chosen
        (6, 1000, 8, By::TopKBias),   // one block whose scores do not fit its scratch: lanes score
    ];
    for (i, (rows, e, topk, by)) in cases.into_iter().enumerate() {
        run_case(&g, 800 + i as u64, rows, e, topk, by);
    }
}

/// One meta buffer sized for the largest batch, a launch of 64 rows then of 1 row (a batch shrinking
/// between decode steps): the small launch must still group its ids (its counter must not lie inside the
/// groups the large launch wrote).
#[test]
fn moe_route_group_survives_a_shrinking_batch() {
    let Some(g) = gpu() else { return };
    let (e, topk, big) = (256usize, 6usize, 64usize);
    let mut r = rng(901);
    let mut meta: CudaSlice<i32> = upload(&g, &vec![0i32; moe_group_meta_len(big * topk)]);
    for rows in [big, 1, 3, big, 2] {
        let logits: Vec<f32> = (0..rows * e)
            .map(|_| r.random_range(-6.0f32..6.0))
            .collect();
        let dl = upload(&g, &logits);
        let shape = RouteShape {
            rows,
            experts: e,
            topk,
            route_scale: 1.0,
        };
        let s = rows * topk;
        let (mut ids, mut wts) = (upload(&g, &vec![-1i32; s]), upload(&g, &vec![0f32; s]));
        let by: RouteBy<'_, CudaSlice<i32>, CudaSlice<f32>> = RouteBy::TopK { bias: None };
        g.launch_moe_route_group(&g.stream, &shape, &dl, by, &mut ids, &mut wts, &mut meta)
            .expect("route_group");
        let m = download(&g, &meta);
        assert_grouping(
            &m,
            &download(&g, &ids),
            e,
            &format!("{rows} rows after others"),
        );
        assert_eq!(
            *m.last().expect("meta"),
            0,
            "{rows} rows: counter not reset"
        );
    }
}
