use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, moe_group_meta_len, reference, ExpertShape, Fp4Mat, Fp4Tune, GemvOut};
use rand::Rng;

use crate::common::*;

/// topk distinct expert ids per token.
pub fn rand_ids(r: &mut rand::rngs::StdRng, b: usize, topk: usize, experts: usize) -> Vec<i32> {
    let mut ids = Vec::with_capacity(b * topk);
    for _ in 0..b {
        let mut chosen: Vec<i32> = Vec::new();
        while chosen.len() < topk {
            let e = r.random_range(0..experts as i32);
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        ids.extend(chosen);
    }
    ids
}

/// CPU grouping, the layout moe_group must produce.
fn group_ref(ids: &[i32], experts: usize) -> Vec<i32> {
    let s = ids.len();
    let mut meta = vec![0i32; moe_group_meta_len(s)];
    let mut g = 0usize;
    let mut start = 0usize;
    for e in 0..experts as i32 {
        let slots: Vec<i32> = (0..s as i32).filter(|&i| ids[i as usize] == e).collect();
        if slots.is_empty() {
            continue;
        }
        meta[1 + g] = e;
        meta[1 + s + g] = start as i32;
        for (j, sl) in slots.iter().enumerate() {
            meta[2 + 2 * s + start + j] = *sl;
        }
        start += slots.len();
        g += 1;
    }
    meta[0] = g as i32;
    meta[1 + s + g] = start as i32;
    meta
}

/// Checks the filled parts of a grouping `gm` of `ids` (moe_group's layout) against the CPU grouping;
/// returns the group count.
pub fn assert_grouping(gm: &[i32], ids: &[i32], experts: usize, what: &str) -> usize {
    let s = ids.len();
    let wm = group_ref(ids, experts);
    let ng = wm[0] as usize;
    let used = 2 + 2 * s + wm[1 + s + ng] as usize;
    assert_eq!(gm[0], wm[0], "{what}: group count");
    assert_eq!(gm[1..1 + ng], wm[1..1 + ng], "{what}: group experts");
    assert_eq!(
        gm[1 + s..2 + s + ng],
        wm[1 + s..2 + s + ng],
        "{what}: group starts"
    );
    assert_eq!(gm[2 + 2 * s..used], wm[2 + 2 * s..used], "{what}: slots");
    ng
}

/// Checks moe_group, then fp4_expert with the default tuning (None) and each tuning in `tunes`.
pub fn run_case(
    g: &dsv4_kernels::GpuContext,
    seed: u64,
    shape: ExpertShape,
    tunes: &[Option<Fp4Tune>],
) {
    let mut r = rng(seed);
    let (s, n, k, e) = (shape.b * shape.topk, shape.n, shape.k, shape.experts);
    let ids = rand_ids(&mut r, shape.b, shape.topk, e);
    let xrows = if shape.x_per_slot { s } else { shape.b };
    let x = rand_bf16(&mut r, xrows * k);
    let w = rand_bytes(&mut r, e * n * k / 2);
    let sc = rand_exponents(&mut r, e * n * k / 32, 100, 128);
    let want = reference::fp4_expert(&x, &w, &sc, &ids, shape.topk, e, n, k, shape.x_per_slot);

    let (dids, dx, dw, ds) = (
        upload(g, &ids),
        upload(g, &x),
        upload_fp4(g, &w, e, n, k),
        upload_fp4_scales(g, &sc, e, n, k),
    );
    let mut meta: CudaSlice<i32> = upload(g, &vec![-7i32; moe_group_meta_len(s)]);
    g.launch_moe_group(&g.stream, &shape, &dids, &mut meta)
        .expect("moe_group");
    let ng = assert_grouping(&download(g, &meta), &ids, e, "moe_group");

    let absum: Vec<f32> = (0..s * n)
        .map(|i| {
            let (slot, row) = (i / n, i % n);
            let xr = if shape.x_per_slot {
                slot
            } else {
                slot / shape.topk
            };
            let base = (ids[slot] as usize * n + row) * k;
            (0..k)
                .map(|j| {
                    let byte = w[(base + j) / 2];
                    let nib = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                    let wv = reference::formats::e2m1_to_f32(nib)
                        * reference::formats::ue8m0(sc[base / 32 + j / 32]);
                    (x[xr * k + j].to_f32() * wv).abs()
                })
                .sum()
        })
        .collect();
    for tune in tunes {
        // Poisoned output: every element must be written.
        let mut y = upload(g, &vec![f32::NAN; s * n]);
        let out = GemvOut::f32(&mut y, &g.stream);
        match tune {
            None => g.launch_fp4_expert(&g.stream, &shape, &dx, &dw, &ds, &meta, out),
            Some(t) => g.launch_fp4_expert_tuned(&g.stream, &shape, &dx, &dw, &ds, &meta, out, *t),
        }
        .expect("launch");
        let got = download(g, &y);
        check_out(&got, &want, &absum, &shape, ng, tune);
    }
}

fn check_out(
    got: &[f32],
    want: &[f32],
    absum: &[f32],
    shape: &ExpertShape,
    ng: usize,
    tune: &Option<Fp4Tune>,
) {
    let (worst, at) = worst_ratio(got, want, |i| 1e-5 * absum[i] + 1e-30);
    println!(
        "fp4_expert {shape:?} {tune:?} groups {ng}: rel_l2 {:.2e}, worst/bound {worst:.3}",
        rel_l2(got, want)
    );
    assert!(
        worst <= 1.0,
        "{shape:?} {tune:?}: element {at} got {} want {}",
        got[at],
        want[at]
    );
}

#[test]
fn fp4_expert_matches_reference() {
    let Some(g) = gpu() else { return };
    let cases = [
        (1, 6, 32, 96, 4096, false),
        (3, 6, 8, 50, 160, true),
        (8, 2, 4, 33, 256, false), // groups of up to 16 tokens: more than one n-tile pass at batch 8
        (64, 6, 64, 40, 512, false),
        (20, 6, 256, 64, 2048, true),
        (4, 6, 512, 160, 512, true),   // many experts, one token each
        (64, 6, 256, 800, 512, false), // batch 64 x top-6 of 256; kw 1 with a partial 128-row tile
    ];
    run_cases(&g, 300, &cases, &[None]);
}

/// The default tuning and every explicit variant (K split 1/2/4 x 16 or 32 rows per warp).
fn every_tune() -> Vec<Option<Fp4Tune>> {
    let mut tunes = vec![None];
    for kw in [1, 2, 4] {
        for mt in [1, 2] {
            tunes.push(Some(Fp4Tune { kw, mt }));
        }
    }
    tunes
}

/// [`run_case`] for each (b, topk, experts, n, k, x_per_slot) with seeds seed0, seed0 + 1, ...
fn run_cases(
    g: &dsv4_kernels::GpuContext,
    seed0: u64,
    cases: &[(usize, usize, usize, usize, usize, bool)],
    tunes: &[Option<Fp4Tune>],
) {
    for (i, &c) in cases.iter().enumerate() {
        run_case(g, seed0 + i as u64, expert_shape(c), tunes);
    }
}

/// Every kernel variant on a K with async scale words (1024: 8 chunks, so the rings wrap) and one without
/// (160: K % 128 != 0, a partial last chunk), groups wider than one n-tile.
#[test]
fn fp4_expert_every_variant() {
    let Some(g) = gpu() else { return };
    // The last two in 2 KB tiles (fp4_tiled): 16-row warps' rows and both full and partial blocks there too.
    let cases = [
        (8, 2, 4, 33, 1024, false),
        (3, 6, 8, 150, 160, true),
        (8, 2, 4, 96, 1024, false),
        (3, 6, 8, 160, 256, true),
    ];
    run_cases(&g, 400, &cases, &every_tune());
}

/// Small batches, where most of a group's 8 mma columns are padding (their x is never loaded, the B fragment
/// is zero): every variant at batch 1 (one token per group; K a multiple of 128 and not), batch 2 with every
/// expert chosen by both tokens, and 9 tokens on one expert (a full pass, then a pass of one real column).
#[test]
fn fp4_expert_small_batches_every_variant() {
    let Some(g) = gpu() else { return };
    let cases = [
        (1, 6, 8, 77, 4096, false),
        (1, 6, 8, 77, 1056, true),
        (2, 4, 4, 50, 224, false),
        (9, 1, 1, 40, 256, false),
        (1, 6, 8, 64, 512, false), // tiled
    ];
    run_cases(&g, 500, &cases, &every_tune());
}

/// The paired launch (w1 and w3 over the same x and grouping, grid z = 2) gives each matrix the same bits as
/// its single launch, for every tuning, on shapes with partial row tiles, K % 128 != 0 and multi-pass groups.
/// (The single launches are checked against the CPU reference above.)
#[test]
fn fp4_expert_pair_matches_single_launches() {
    let Some(g) = gpu() else { return };
    let cases = [
        (1, 6, 8, 77, 1056, false),
        (3, 6, 8, 150, 160, false),
        (9, 1, 1, 40, 256, false),
        (64, 6, 256, 40, 512, false),
    ];
    for (i, &c) in cases.iter().enumerate() {
        let shape = expert_shape(c);
        let (b, topk, experts, n, k) = (c.0, c.1, c.2, c.3, c.4);
        let mut r = rng(600 + i as u64);
        let s = b * topk;
        let ids = rand_ids(&mut r, b, topk, experts);
        let x = upload(&g, &rand_bf16(&mut r, b * k));
        let w: Vec<_> = (0..2)
            .map(|_| upload_fp4(&g, &rand_bytes(&mut r, experts * n * k / 2), experts, n, k))
            .collect();
        let sc: Vec<_> = (0..2)
            .map(|_| {
                let sc = rand_exponents(&mut r, experts * n * k / 32, 100, 128);
                upload_fp4_scales(&g, &sc, experts, n, k)
            })
            .collect();
        let dids = upload(&g, &ids);
        let mut meta: CudaSlice<i32> = upload(&g, &vec![0i32; moe_group_meta_len(s)]);
        g.launch_moe_group(&g.stream, &shape, &dids, &mut meta)
            .expect("moe_group");
        for tune in every_tune() {
            let t = tune.unwrap_or_else(|| Fp4Tune::for_shape(&shape));
            let mut single = Vec::new();
            for m in 0..2 {
                let mut y = upload(&g, &vec![f32::NAN; s * n]);
                let out = GemvOut::f32(&mut y, &g.stream);
                g.launch_fp4_expert_tuned(&g.stream, &shape, &x, &w[m], &sc[m], &meta, out, t)
                    .expect("single");
                single.push(download(&g, &y));
            }
            let mut ya = upload(&g, &vec![f32::NAN; s * n]);
            let mut yb = upload(&g, &vec![f32::NAN; s * n]);
            let mats = [
                Fp4Mat {
                    w: &w[0],
                    scale: &sc[0],
                    out: GemvOut::f32(&mut ya, &g.stream),
                },
                Fp4Mat {
                    w: &w[1],
                    scale: &sc[1],
                    out: GemvOut::f32(&mut yb, &g.stream),
                },
            ];
            g.launch_fp4_expert_pair(&g.stream, &shape, &x, mats, &meta, Some(t))
                .expect("pair");
            for (m, y) in [ya, yb].iter().enumerate() {
                let what = format!("{shape:?} {t:?} matrix {m}: pair vs single launch");
                assert_same_bits(&download(&g, y), &single[m], &what);
            }
        }
    }
}

/// A token's outputs do not depend on the other tokens of its group under a given tuning (the engine's
/// batch_of_three_equals_each_alone relies on it): one group of 11 tokens (two 8-wide mma tiles, the second
/// mostly padding) must give every token the bits of the same token alone, for every variant.
#[test]
fn fp4_expert_token_bits_do_not_depend_on_its_group() {
    let Some(g) = gpu() else { return };
    let (n, k, experts, b) = (72, 512, 2, 11);
    let mut r = rng(800);
    let rows = rand_bf16(&mut r, b * k);
    let w = upload_fp4(&g, &rand_bytes(&mut r, experts * n * k / 2), experts, n, k);
    let sc = rand_exponents(&mut r, experts * n * k / 32, 100, 128);
    let sc = upload_fp4_scales(&g, &sc, experts, n, k);
    let run = |x: &[bf16], t: Fp4Tune| {
        let b = x.len() / k;
        let shape = expert_shape((b, 1, experts, n, k, false));
        let mut meta: CudaSlice<i32> = upload(&g, &vec![0i32; moe_group_meta_len(b)]);
        // Every token chooses expert 1: one group holding the whole batch.
        g.launch_moe_group(&g.stream, &shape, &upload(&g, &vec![1i32; b]), &mut meta)
            .expect("moe_group");
        let mut y = upload(&g, &vec![f32::NAN; b * n]);
        let out = GemvOut::f32(&mut y, &g.stream);
        g.launch_fp4_expert_tuned(&g.stream, &shape, &upload(&g, x), &w, &sc, &meta, out, t)
            .expect("launch");
        download(&g, &y)
    };
    let shape1 = expert_shape((1, 1, experts, n, k, false));
    for tune in every_tune() {
        let t = tune.unwrap_or_else(|| Fp4Tune::for_shape(&shape1));
        let group = run(&rows, t);
        for (j, got) in group.chunks(n).enumerate() {
            let alone = run(&rows[j * k..(j + 1) * k], t);
            assert_same_bits(got, &alone, &format!("{t:?}: token {j} of {b} vs alone"));
        }
    }
}

/// The device-layout rewrite against its CPU twin: rows in tiles ([3, 96, 4096], [2, 64, 256]: fp4_tiled) and
/// as in the checkpoint (K % 128 != 0, N % 32 != 0, K past FP4_TILE_MAX_K); a buffer shorter than the shape
/// is refused.
#[test]
fn fp4_device_layout_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut r = rng(801);
    for (experts, n, k) in [
        (3, 96, 4096),
        (2, 64, 256),
        (3, 37, 384),
        (2, 32, 96),
        (1, 32, 8192),
    ] {
        let w = rand_bytes(&mut r, experts * n * k / 2);
        let mut want = w.clone();
        reference::formats::fp4_device_layout(&mut want, experts, n, k);
        let got = download(&g, &upload_fp4(&g, &w, experts, n, k));
        assert!(
            got == want,
            "fp4_to_device_layout differs from the CPU twin at {experts} x [{n}, {k}]"
        );
    }
    let w = rand_bytes(&mut r, 4 * 300);
    let mut short = upload(&g, &w);
    assert!(g
        .launch_fp4_to_device_layout(&g.stream, &mut short, 1, 32, 128)
        .is_err());
    // Scales: transposed words for K % 128 == 0 (awkward N), unchanged otherwise.
    for (experts, n, k) in [(3, 37, 384), (2, 19, 96), (1, 8, 4096)] {
        let sc = rand_bytes(&mut r, experts * n * k / 32);
        let want = reference::formats::fp4_scales_device_layout(&sc, experts, n, k);
        let got = download(&g, &upload_fp4_scales(&g, &sc, experts, n, k));
        assert!(got == want, "scale layout {experts} x [{n}, {k}]");
    }
}
