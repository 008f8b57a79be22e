//! The split kernels (cuda/split.cu) against their CPU references: exact, since they only add in a fixed
//! order or move values.
use dsv4_kernels::reference::split as refs;
use dsv4_kernels::{bf16, GpuContext};
use rand::Rng;

use crate::common::*;

fn rand_f32(r: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-3.0f32..3.0)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn rank_sum_matches_reference() {
    let Some(g) = gpu() else { return };
    for (i, (ranks, len, n)) in [
        (1, 5, 5),
        (2, 1000, 999),
        (3, 4097, 4097),
        (5, 77_777, 70_001),
        (8, 300, 300),
    ]
    .into_iter()
    .enumerate()
    {
        let mut r = rng(900 + i as u64);
        let mut want: Vec<Vec<f32>> = (0..ranks).map(|_| rand_f32(&mut r, len)).collect();
        let mut dev: Vec<_> = want.iter().map(|v| upload(&g, v)).collect();
        let mut refs_mut: Vec<_> = dev.iter_mut().collect();
        g.launch_rank_sum_f32(&g.stream, &mut refs_mut, n)
            .expect("launch");
        refs::rank_sum(&mut want, n);
        for (rank, (d, w)) in dev.iter().zip(&want).enumerate() {
            let got = download(&g, d);
            assert_eq!(bits(&got), bits(w), "ranks {ranks} n {n}: buffer {rank}");
        }
    }
}

#[test]
fn rank_sum_refuses_too_many_buffers() {
    let Some(g) = gpu() else { return };
    let mut dev: Vec<_> = (0..9).map(|_| upload(&g, &[1f32; 4])).collect();
    let mut refs_mut: Vec<_> = dev.iter_mut().collect();
    assert!(g.launch_rank_sum_f32(&g.stream, &mut refs_mut, 4).is_err());
}

#[test]
fn moe_localize_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut r = rng(910);
    for (slots, e0, e1) in [(1, 0, 8), (13, 3, 5), (384, 128, 256), (6, 0, 0)] {
        let ids: Vec<i32> = (0..slots).map(|_| r.random_range(0..256)).collect();
        let d_ids = upload(&g, &ids);
        let mut out = upload(&g, &vec![7i32; slots]);
        g.launch_moe_localize(&g.stream, slots, e0..e1, &d_ids, &mut out)
            .expect("launch");
        let want = refs::moe_localize(&ids, e0 as i32, e1 as i32);
        assert_eq!(
            download(&g, &out),
            want,
            "{slots} slots, experts {e0}..{e1}"
        );
    }
}

fn check_rank_sum_moe(
    g: &GpuContext,
    r: &mut rand::rngs::StdRng,
    rows: usize,
    topk: usize,
    d: usize,
    shared: bool,
) {
    let y = rand_f32(r, rows * topk * d);
    let local: Vec<i32> = (0..rows * topk)
        .map(|_| {
            if r.random_bool(0.5) {
                r.random_range(0..4)
            } else {
                -1
            }
        })
        .collect();
    let sh = shared.then(|| rand_f32(r, rows * d));
    let (dy, dl) = (upload(g, &y), upload(g, &local));
    let dsh = sh.as_ref().map(|v| upload(g, v));
    let mut out = upload(g, &vec![f32::NAN; rows * d]);
    g.launch_moe_rank_sum(&g.stream, rows, topk, d, &dy, &dl, dsh.as_ref(), &mut out)
        .expect("launch");
    let want = refs::moe_rank_sum(&y, &local, sh.as_deref(), rows, topk, d);
    assert_eq!(
        bits(&download(g, &out)),
        bits(&want),
        "rows {rows} topk {topk} d {d} shared {shared}"
    );
}

#[test]
fn moe_rank_sum_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut r = rng(920);
    for (rows, topk, d) in [(1, 6, 4096), (3, 2, 32), (64, 6, 1000), (5, 1, 257)] {
        for shared in [false, true] {
            check_rank_sum_moe(&g, &mut r, rows, topk, d, shared);
        }
    }
}

#[test]
fn gather_cols_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut r = rng(930);
    for (rows, width, c0, w) in [
        (1, 64, 32, 32),
        (3, 8192, 1024, 2048),
        (64, 300, 7, 293),
        (2, 16, 0, 0),
    ] {
        let x = rand_bf16(&mut r, rows * width);
        let dx = upload(&g, &x);
        let mut out = upload(&g, &vec![bf16::NAN; (rows * w).max(1)]);
        g.launch_gather_cols_bf16(&g.stream, rows, width, c0..c0 + w, &dx, &mut out)
            .expect("launch");
        let want = refs::gather_cols(&x, width, c0, w);
        let got = download(&g, &out);
        assert_eq!(
            &got[..rows * w],
            &want[..],
            "{rows} x {width}, cols {c0}+{w}"
        );
    }
}
