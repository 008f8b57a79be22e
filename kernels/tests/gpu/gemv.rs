use dsv4_kernels::reference;
use dsv4_kernels::{GemvOut, GemvPath, GemvScratch, GemvWeights, RING_ROWS_MIN};

use crate::common::*;

/// (batch, N, K): split-K and single-pass plans, K not a multiple of 128, N not a multiple of 32, a batch in
/// every 8-column bucket of the ring kernels (1, 2, 3-4 and 5-8 tiles of 8).
const SHAPES: [(usize, usize, usize); 9] = [
    (1, 512, 4096),
    (3, 300, 1040),
    (8, 129, 2048),
    (1, 8320, 256),
    (17, 77, 272),
    (64, 640, 2304),
    (33, 1000, 1024),
    (12, 1160, 1552),
    (57, 200, 4112),
];

/// Worst error relative to the bound 1e-5 * sum|x*w| (f32 accumulation error grows with it; 1e-5 is ~100
/// f32 ulps) plus half an ulp of the value for a bf16 output (2^-9 relative); panics above 1.
fn assert_within(what: &str, got: &[f32], want: &[f32], mag: &[f32], bf16_out: bool) -> f32 {
    let (worst, at) = worst_ratio(got, want, |i| {
        let rnd = if bf16_out {
            want[i].abs() * 2f32.powi(-8)
        } else {
            0.0
        };
        1e-5 * mag[i] + rnd + 1e-30
    });
    assert!(
        worst <= 1.0,
        "{what}: element {at} got {} want {}",
        got[at],
        want[at]
    );
    worst
}

/// The kernels that take `b` rows, as (family, portable mma.sync ring): gemv.cu always; the ring from
/// RING_ROWS_MIN rows, both its wgmma kernels (where they run: on other devices this repeats the mma.sync ones)
/// and its mma.sync kernels.
fn paths_for(b: usize) -> Vec<(GemvPath, bool)> {
    let mut v = vec![(GemvPath::Skinny, false)];
    if b >= RING_ROWS_MIN {
        v.push((GemvPath::Ring, false));
        v.push((GemvPath::Ring, true));
    }
    v
}

fn run_case(
    g: &dsv4_kernels::GpuContext,
    seed: u64,
    (b, n, k): (usize, usize, usize),
    bf16_out: bool,
    (path, mma_sync): (GemvPath, bool),
) {
    let mut r = rng(seed);
    let x = rand_bf16(&mut r, b * k);
    let w = rand_e4m3(&mut r, n * k);
    let s = rand_exponents(&mut r, n.div_ceil(128) * k.div_ceil(128), 100, 134);
    let want = reference::fp8_gemv(&x, &w, &s, b, n, k);
    let mut plan = g
        .gemv_plan_on(path, GemvWeights::Fp8, b, n, k)
        .expect("plan");
    plan.ring.mma_sync = mma_sync;
    let (dx, dw, ds) = (upload(g, &x), upload(g, &w), upload(g, &s));
    let mut ws =
        GemvScratch::new(&g.stream, plan.workspace_len(), plan.counters_len()).expect("scratch");
    let got: Vec<f32> = if bf16_out {
        let mut y = upload(g, &vec![dsv4_kernels::bf16::NAN; b * n]);
        g.launch_gemv_fp8(
            &g.stream,
            &plan,
            &dx,
            &dw,
            &ds,
            GemvOut::bf16(&mut y, &g.stream),
            &mut ws,
        )
        .expect("launch");
        download(g, &y).iter().map(|v| v.to_f32()).collect()
    } else {
        let mut y = upload(g, &vec![f32::NAN; b * n]);
        g.launch_gemv_fp8(
            &g.stream,
            &plan,
            &dx,
            &dw,
            &ds,
            GemvOut::f32(&mut y, &g.stream),
            &mut ws,
        )
        .expect("launch");
        download(g, &y)
    };
    // The scale of the f32 accumulation error: sum |x*w|.
    let absum = reference::fp8_gemv_abs(&x, &w, &s, b, n, k);
    let what = format!(
        "fp8 gemv {path:?} (mma.sync {mma_sync}) b={b} n={n} k={k} splits={} bf16_out={bf16_out}",
        plan.splits
    );
    let worst = assert_within(&what, &got, &want, &absum, bf16_out);
    println!(
        "{what}: rel_l2 {:.2e}, worst/bound {worst:.3}",
        rel_l2(&got, &want)
    );
    let cnt = download(g, &ws.cnt);
    assert!(
        cnt.iter().all(|&c| c == 0),
        "split-K counters left non-zero"
    );
}

#[test]
fn fp8_gemv_matches_reference() {
    let Some(g) = gpu() else { return };
    for (i, shape) in SHAPES.iter().enumerate() {
        for path in paths_for(shape.0) {
            run_case(&g, 100 + i as u64, *shape, false, path);
        }
    }
    run_case(&g, 200, (5, 384, 1024), true, (GemvPath::Skinny, false));
    run_case(&g, 201, (40, 384, 1024), true, (GemvPath::Ring, false));
    run_case(&g, 202, (40, 384, 1024), true, (GemvPath::Ring, true));
}

/// bf16 weights: split and unsplit plans, awkward N and K (K % 64 != 0), both output types, twice on the
/// same scratch (the second launch relies on the counters the first reset), against f64 on the CPU.
#[test]
fn bf16_gemv_matches_reference() {
    let Some(ctx) = gpu() else { return };
    let g = &ctx;
    for (i, (b, n, k), (path, mma_sync)) in [
        (1usize, 256usize, 4096usize),
        (7, 77, 264),
        (64, 1000, 1032),
        (9, 4100, 512),
        (16, 333, 1000),
        (30, 130, 4104),
    ]
    .iter()
    .enumerate()
    .flat_map(|(i, &c)| paths_for(c.0).into_iter().map(move |p| (i, c, p)))
    {
        let mut r = rng(300 + i as u64);
        let x = rand_bf16(&mut r, b * k);
        let w = rand_bf16(&mut r, n * k);
        let mut plan = g
            .gemv_plan_on(path, GemvWeights::Bf16, b, n, k)
            .expect("plan");
        plan.ring.mma_sync = mma_sync;
        let (dx, dw) = (upload(g, &x), upload(g, &w));
        let mut ws = GemvScratch::new(&g.stream, plan.workspace_len(), plan.counters_len())
            .expect("scratch");
        let bf16_out = i % 2 == 1;
        let mut yf = upload(g, &vec![f32::NAN; b * n]);
        let mut yb = upload(g, &vec![dsv4_kernels::bf16::NAN; b * n]);
        for _ in 0..2 {
            let out = if bf16_out {
                GemvOut::bf16(&mut yb, &g.stream)
            } else {
                GemvOut::f32(&mut yf, &g.stream)
            };
            g.launch_gemv_bf16(&g.stream, &plan, &dx, &dw, out, &mut ws)
                .expect("launch");
        }
        let got: Vec<f32> = if bf16_out {
            download(g, &yb).iter().map(|v| v.to_f32()).collect()
        } else {
            download(g, &yf)
        };
        let (mut want, mut mag) = (vec![0f32; b * n], vec![0f32; b * n]);
        for bi in 0..b {
            for row in 0..n {
                let (mut acc, mut m) = (0f64, 0f64);
                for j in 0..k {
                    let t = x[bi * k + j].to_f64() * w[row * k + j].to_f64();
                    acc += t;
                    m += t.abs();
                }
                want[bi * n + row] = acc as f32;
                mag[bi * n + row] = m as f32;
            }
        }
        let what = format!(
            "bf16 gemv {path:?} (mma.sync {mma_sync}) b={b} n={n} k={k} splits={} bf16_out={bf16_out}",
            plan.splits
        );
        let worst = assert_within(&what, &got, &want, &mag, bf16_out);
        println!("{what}: worst/bound {worst:.3}");
        assert!(download(g, &ws.cnt).iter().all(|&c| c == 0));
    }
}

#[test]
fn gemv_rejects_bad_shapes() {
    let Some(g) = gpu() else { return };
    let fp8 = GemvWeights::Fp8;
    assert!(g.gemv_plan(fp8, 0, 128, 128).is_err());
    assert!(g.gemv_plan(fp8, 65, 128, 128).is_err());
    assert!(g.gemv_plan(fp8, 1, 128, 100).is_err());
    assert!(g.gemv_plan(GemvWeights::Bf16, 1, 128, 100).is_err());
    // The ring takes 1..=64 rows too.
    assert!(g.gemv_plan_on(GemvPath::Ring, fp8, 1, 128, 128).is_ok());
    assert!(g.gemv_plan_on(GemvPath::Ring, fp8, 65, 128, 128).is_err());
}

/// Within a kernel family a row's bits depend neither on the batch nor on the other rows: launches of
/// shrinking batches on one scratch (the ring's wgmma kernels: 64, 33, 17, 9, 8, 3, 1 rows, one per column
/// bucket and more; its mma.sync kernels: 64, 33, 17, 9, 1 with both row tilings; gemv.cu: 64, 17, 8, 3, 1)
/// give the 64-row launch's bits for their first rows, on awkward shapes (split and unsplit, K not a multiple
/// of the step, N not a multiple of 16), FP8 and bf16.
#[test]
fn gemv_rows_are_batch_invariant_within_a_family() {
    let Some(g) = gpu() else { return };
    let (fp8, bf) = (GemvWeights::Fp8, GemvWeights::Bf16);
    let shapes = [
        (fp8, 300, 1040),
        (fp8, 1000, 4096),
        (fp8, 77, 272),
        (fp8, 8320, 256),
        (bf, 4100, 512),
        (bf, 77, 264),
    ];
    let families = [
        (
            (GemvPath::Ring, false),
            &[64usize, 33, 17, 9, 8, 3, 1][..],
            &[0usize][..],
        ),
        (
            (GemvPath::Ring, true),
            &[64usize, 33, 17, 9, 1][..],
            &[1usize, 2][..],
        ),
        (
            (GemvPath::Skinny, false),
            &[64usize, 17, 8, 3, 1][..],
            &[0usize][..],
        ),
    ];
    for (i, &(wt, n, k)) in shapes.iter().enumerate() {
        let mut r = rng(500 + i as u64);
        let dx = upload(&g, &rand_bf16(&mut r, 64 * k));
        let dw8 = upload(&g, &rand_e4m3(&mut r, n * k));
        let ds = upload(
            &g,
            &rand_exponents(&mut r, n.div_ceil(128) * k.div_ceil(128), 100, 134),
        );
        let dwb = upload(&g, &rand_bf16(&mut r, n * k));
        for &((path, mma_sync), batches, mts) in &families {
            let plan64 = g.gemv_plan_on(path, wt, 64, n, k).expect("plan");
            let mut ws = GemvScratch::new(&g.stream, plan64.workspace_len(), plan64.counters_len())
                .expect("scratch");
            let mut base: Option<Vec<f32>> = None;
            // Every batch alone (no batch tiles) and, where it divides into them, in tiles of 8 and 16 rows.
            let runs = batches.iter().flat_map(|&b| [(b, 0), (b, 8), (b, 16)]);
            for (b, tile_rows) in runs.filter(|&(b, t)| t == 0 || (b % t == 0 && b > t)) {
                for &mt in mts {
                    let mut plan = g.gemv_plan_on(path, wt, b, n, k).expect("plan");
                    assert_eq!(plan.splits, plan64.splits, "the split must not depend on B");
                    plan.ring.mt = mt;
                    plan.ring.mma_sync = mma_sync;
                    plan.ring.tile_rows = Some(tile_rows);
                    let mut y = upload(&g, &vec![f32::NAN; b * n]);
                    let out = GemvOut::f32(&mut y, &g.stream);
                    match wt {
                        GemvWeights::Fp8 => {
                            g.launch_gemv_fp8(&g.stream, &plan, &dx, &dw8, &ds, out, &mut ws)
                        }
                        GemvWeights::Bf16 => {
                            g.launch_gemv_bf16(&g.stream, &plan, &dx, &dwb, out, &mut ws)
                        }
                    }
                    .expect("launch");
                    let got = download(&g, &y);
                    let want = base.get_or_insert_with(|| got.clone());
                    let what = format!(
                        "{path:?} (mma.sync {mma_sync}) {wt:?} n={n} k={k} b={b} mt={mt} tiles of {tile_rows} vs B=64"
                    );
                    assert_same_bits(&got, &want[..b * n], &what);
                }
            }
            println!(
                "{path:?} (mma.sync {mma_sync}) {wt:?} n={n} k={k} splits={}: {batches:?} bit-identical",
                plan64.splits
            );
        }
    }
}
