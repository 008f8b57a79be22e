//! bf16_expert (routed experts of BF16 checkpoints) against the CPU reference, grouped by moe_group.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, moe_group_meta_len, reference, ExpertShape, GemvOut};

use crate::common::*;
use crate::expert::rand_ids;

/// Runs one shape with f32 and bf16 output; every slot's every row must be written.
fn run_case(g: &dsv4_kernels::GpuContext, seed: u64, shape: ExpertShape) {
    let mut r = rng(seed);
    let (s, n, k, e) = (shape.b * shape.topk, shape.n, shape.k, shape.experts);
    let ids = rand_ids(&mut r, shape.b, shape.topk, e);
    let xrows = if shape.x_per_slot { s } else { shape.b };
    let x = rand_bf16(&mut r, xrows * k);
    let w = rand_bf16(&mut r, e * n * k);
    let want = reference::bf16_expert(&x, &w, &ids, shape.topk, e, n, k, shape.x_per_slot);
    // f32 accumulation over at most k/256 chunks of 8 per lane, then a 32-way tree: the error is below
    // (k/32 + 5) * 2^-24 of sum |x*w| (< 1e-5 for k <= 4096).
    let absum: Vec<f32> = (0..s * n)
        .map(|i| {
            let (slot, row) = (i / n, i % n);
            let xr = if shape.x_per_slot {
                slot
            } else {
                slot / shape.topk
            };
            let wrow = (ids[slot] as usize * n + row) * k;
            (0..k)
                .map(|j| (x[xr * k + j].to_f32() * w[wrow + j].to_f32()).abs())
                .sum()
        })
        .collect();
    let (dids, dx, dw) = (upload(g, &ids), upload(g, &x), upload(g, &w));
    let mut meta: CudaSlice<i32> = upload(g, &vec![-7i32; moe_group_meta_len(s)]);
    g.launch_moe_group(&g.stream, &shape, &dids, &mut meta)
        .expect("moe_group");

    let mut y = upload(g, &vec![f32::NAN; s * n]);
    g.launch_bf16_expert(
        &g.stream,
        &shape,
        &dx,
        &dw,
        &meta,
        GemvOut::f32(&mut y, &g.stream),
    )
    .expect("launch");
    let got = download(g, &y);
    let (worst, at) = worst_ratio(&got, &want, |i| 1e-5 * absum[i] + 1e-30);
    println!(
        "bf16_expert {shape:?}: rel_l2 {:.2e}, worst/bound {worst:.3}",
        rel_l2(&got, &want)
    );
    assert!(
        worst <= 1.0,
        "{shape:?}: element {at} got {} want {}",
        got[at],
        want[at]
    );

    // bf16 output: the same sums, rounded once (half an ulp of bf16 on top of the f32 bound).
    let mut yb = upload(g, &vec![bf16::from_f32(f32::NAN); s * n]);
    g.launch_bf16_expert(
        &g.stream,
        &shape,
        &dx,
        &dw,
        &meta,
        GemvOut::bf16(&mut yb, &g.stream),
    )
    .expect("launch bf16 out");
    let gotb: Vec<f32> = download(g, &yb).iter().map(|v| v.to_f32()).collect();
    let (worst, at) = worst_ratio(&gotb, &want, |i| {
        1e-5 * absum[i] + want[i].abs() * 2f32.powi(-8) + 1e-30
    });
    assert!(
        worst <= 1.0,
        "{shape:?} bf16 out: element {at} got {} want {}",
        gotb[at],
        want[at]
    );
}

#[test]
fn bf16_expert_matches_reference() {
    let Some(g) = gpu() else { return };
    let cases = [
        (1, 6, 32, 96, 4096, false),
        (3, 6, 8, 50, 168, true), // K % 32 != 0, N not a multiple of the 8 rows of a block
        (8, 2, 4, 33, 256, false), // groups of up to 16 tokens: two passes of 8 over a row
        (5, 2, 3, 7, 8, false),   // one 16-byte chunk per row, fewer rows than a block
        (64, 6, 256, 40, 520, true), // batch 64 x top-6 of 256, K not a multiple of the 256 a warp covers
        (20, 2, 8, 64, 32, true),    // the tiny golden model's w2 shape with groups of ~5 slots
    ];
    for (i, c) in cases.into_iter().enumerate() {
        run_case(&g, 500 + i as u64, expert_shape(c));
    }
}

/// The paired launch (two matrices, grid z = 2) gives each matrix the same bits as its single launch.
#[test]
fn bf16_expert_pair_matches_single_launches() {
    let Some(g) = gpu() else { return };
    let cases = [
        (1, 6, 32, 96, 4096, false),
        (3, 6, 8, 50, 168, false),
        (64, 6, 256, 40, 520, false),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        let shape = expert_shape(c);
        let (b, topk, experts, n, k) = (c.0, c.1, c.2, c.3, c.4);
        let mut r = rng(700 + i as u64);
        let s = b * topk;
        let ids = rand_ids(&mut r, b, topk, experts);
        let x = upload(&g, &rand_bf16(&mut r, b * k));
        let w = [
            upload(&g, &rand_bf16(&mut r, experts * n * k)),
            upload(&g, &rand_bf16(&mut r, experts * n * k)),
        ];
        let dids = upload(&g, &ids);
        let mut meta: CudaSlice<i32> = upload(&g, &vec![0i32; moe_group_meta_len(s)]);
        g.launch_moe_group(&g.stream, &shape, &dids, &mut meta)
            .expect("moe_group");
        let mut single = Vec::new();
        for wm in &w {
            let mut y = upload(&g, &vec![f32::NAN; s * n]);
            let out = GemvOut::f32(&mut y, &g.stream);
            g.launch_bf16_expert(&g.stream, &shape, &x, wm, &meta, out)
                .expect("single");
            single.push(download(&g, &y));
        }
        let mut ya = upload(&g, &vec![f32::NAN; s * n]);
        let mut yb = upload(&g, &vec![f32::NAN; s * n]);
        let mats = [
            (&w[0], GemvOut::f32(&mut ya, &g.stream)),
            (&w[1], GemvOut::f32(&mut yb, &g.stream)),
        ];
        g.launch_bf16_expert_pair(&g.stream, &shape, &x, mats, &meta)
            .expect("pair");
        for (m, y) in [ya, yb].iter().enumerate() {
            let what = format!("{shape:?} matrix {m}: pair vs single launch");
            assert_same_bits(&download(&g, y), &single[m], &what);
        }
    }
}
