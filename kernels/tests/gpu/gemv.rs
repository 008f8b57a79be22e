use dsv4_kernels::reference;
use dsv4_kernels::GemvOut;

use crate::common::*;

/// (batch, N, K): split-K and single-pass plans, K not a multiple of 128, N not a multiple of 32.
const SHAPES: [(usize, usize, usize); 7] = [
    (1, 512, 4096),
    (3, 300, 1040),
    (8, 129, 2048),
    (1, 8320, 256),
    (17, 77, 272),
    (64, 640, 2304),
    (33, 1000, 1024),
];

fn run_case(
    g: &dsv4_kernels::GpuContext,
    seed: u64,
    (b, n, k): (usize, usize, usize),
    bf16_out: bool,
) {
    let mut r = rng(seed);
    let x = rand_bf16(&mut r, b * k);
    let w = rand_e4m3(&mut r, n * k);
    let s = rand_exponents(&mut r, n.div_ceil(128) * k.div_ceil(128), 100, 134);
    let want = reference::fp8_gemv(&x, &w, &s, b, n, k);
    let plan = g.fp8_gemv_plan(b, n, k).expect("plan");
    let (dx, dw, ds) = (upload(g, &x), upload(g, &w), upload(g, &s));
    let mut ws = upload(g, &vec![f32::NAN; plan.workspace_len().max(1)]);
    let got: Vec<f32> = if bf16_out {
        let mut y = upload(g, &vec![dsv4_kernels::bf16::NAN; b * n]);
        g.launch_fp8_gemv(
            &g.stream,
            &plan,
            &dx,
            &dw,
            &ds,
            GemvOut::bf16(&mut y, &g.stream),
            Some(&mut ws),
        )
        .expect("launch");
        download(g, &y).iter().map(|v| v.to_f32()).collect()
    } else {
        let mut y = upload(g, &vec![f32::NAN; b * n]);
        g.launch_fp8_gemv(
            &g.stream,
            &plan,
            &dx,
            &dw,
            &ds,
            GemvOut::f32(&mut y, &g.stream),
            Some(&mut ws),
        )
        .expect("launch");
        download(g, &y)
    };
    // Bound: f32 accumulation error grows with sum |x*w| (1e-5 of it is ~100 f32 ulps); a bf16 output adds
    // half an ulp of the value (2^-9 relative).
    let absum: Vec<f32> = (0..b * n)
        .map(|i| {
            let (bi, row) = (i / n, i % n);
            (0..k)
                .map(|j| {
                    let wv = reference::formats::e4m3_to_f32(w[row * k + j])
                        * reference::formats::ue8m0(s[(row / 128) * k.div_ceil(128) + j / 128]);
                    (x[bi * k + j].to_f32() * wv).abs()
                })
                .sum()
        })
        .collect();
    let (worst, at) = worst_ratio(&got, &want, |i| {
        let rnd = if bf16_out {
            want[i].abs() * 2f32.powi(-8)
        } else {
            0.0
        };
        1e-5 * absum[i] + rnd + 1e-30
    });
    println!(
        "fp8_gemv b={b} n={n} k={k} splits={} bf16_out={bf16_out}: rel_l2 {:.2e}, worst/bound {worst:.3} at {at}",
        plan.splits,
        rel_l2(&got, &want)
    );
    assert!(
        worst <= 1.0,
        "b={b} n={n} k={k}: element {at} got {} want {}",
        got[at],
        want[at]
    );
}

#[test]
fn fp8_gemv_matches_reference() {
    let Some(g) = gpu() else { return };
    for (i, shape) in SHAPES.iter().enumerate() {
        run_case(&g, 100 + i as u64, *shape, false);
    }
    run_case(&g, 200, (5, 384, 1024), true);
}

#[test]
fn fp8_gemv_rejects_bad_shapes() {
    let Some(g) = gpu() else { return };
    assert!(g.fp8_gemv_plan(0, 128, 128).is_err());
    assert!(g.fp8_gemv_plan(65, 128, 128).is_err());
    assert!(g.fp8_gemv_plan(1, 128, 100).is_err());
}
