//! fp4_swiglu_down (the routed w2 making the SwiGLU of its slots itself) against moe_swiglu followed by the w2
//! launch: the same outputs bit for bit, with groups of one slot (batch 1) and of many (passes of a few
//! columns), official numerics or bf16 rounding, with and without the clamp and the routing weights; and the
//! shapes it refuses.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{
    bf16, fp4_swiglu_down_fits, moe_group_meta_len, ExpertShape, Fp4Mat, GemvOut, GpuContext,
    SwigluIn, FP4_SWIGLU_DOWN_SHAPE,
};
use rand::Rng;

use crate::common::*;
use crate::expert::rand_ids;

/// The model's w2 for `e` experts, w1 / w3 outputs of `rows * topk` slots, routing weights and the grouping.
struct Case {
    shape: ExpertShape,
    g: CudaSlice<f32>,
    u: CudaSlice<f32>,
    wt: CudaSlice<f32>,
    w: CudaSlice<u8>,
    s: CudaSlice<u8>,
    meta: CudaSlice<i32>,
}

fn make_case(gc: &GpuContext, seed: u64, rows: usize, topk: usize, e: usize) -> Case {
    let mut r = rng(seed);
    let (n, k) = FP4_SWIGLU_DOWN_SHAPE;
    let shape = expert_shape((rows, topk, e, n, k, true));
    let slots = rows * topk;
    // Wide enough that the clamp (limit 7) bites and the 128-blocks' scales differ.
    let mut vals = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| r.random_range(-12.0f32..12.0) * if i % 384 < 128 { 1e-3 } else { 1.0 })
            .collect()
    };
    let (g, u) = (vals(slots * k), vals(slots * k));
    let wt: Vec<f32> = (0..slots).map(|_| r.random_range(0.05f32..2.5)).collect();
    let ids = upload(gc, &rand_ids(&mut r, rows, topk, e));
    let mut meta = upload(gc, &vec![0i32; moe_group_meta_len(slots)]);
    gc.launch_moe_group(&gc.stream, &shape, &ids, &mut meta)
        .expect("moe_group");
    Case {
        shape,
        g: upload(gc, &g),
        u: upload(gc, &u),
        wt: upload(gc, &wt),
        w: upload_fp4(gc, &rand_bytes(&mut r, e * n * k / 2), e, n, k),
        s: upload_fp4_scales(
            gc,
            &rand_exponents(&mut r, e * n * k / 32, 110, 128),
            e,
            n,
            k,
        ),
        meta,
    }
}

/// w2's output [slots, N] by one path, into a buffer of NaNs first.
fn run(
    gc: &GpuContext,
    c: &Case,
    limit: f32,
    quant: bool,
    weighted: bool,
    fused: bool,
) -> Vec<f32> {
    let (st, sh) = (&gc.stream, &c.shape);
    let slots = sh.b * sh.topk;
    let mut y: CudaSlice<f32> = upload(gc, &vec![f32::NAN; slots * sh.n]);
    let wt = weighted.then_some(&c.wt);
    let out = GemvOut::f32(&mut y, st);
    if fused {
        let sw = SwigluIn {
            g: &c.g,
            u: &c.u,
            wt,
            limit,
            quant,
        };
        let m = Fp4Mat {
            w: &c.w,
            scale: &c.s,
            out,
        };
        gc.launch_fp4_swiglu_down(st, sh, sw, m, &c.meta)
            .expect("fused launch");
    } else {
        let mut h: CudaSlice<bf16> = upload(gc, &vec![bf16::NAN; slots * sh.k]);
        gc.launch_moe_swiglu(st, slots, sh.k, limit, quant, &c.g, &c.u, wt, &mut h)
            .expect("swiglu");
        gc.launch_fp4_expert(st, sh, &h, &c.w, &c.s, &c.meta, out)
            .expect("w2");
    }
    download(gc, &y)
}

/// Batch 1 (top-6 of 23 experts: groups of one slot), 3 tokens of top-6 over 8 experts (groups of 1-3: passes
/// with one and two columns), 9 tokens choosing the same 4 experts (groups of 9: four full passes and a last of
/// one); each with official numerics and bf16 rounding, clamp or none, routing weights or none; a second fused
/// launch on the same buffers gives the same bits again.
#[test]
fn fp4_swiglu_down_matches_swiglu_then_w2() {
    let Some(gc) = gpu() else { return };
    for (i, (rows, topk, e)) in [(1, 6, 23), (3, 6, 8), (9, 4, 4)].into_iter().enumerate() {
        let c = make_case(&gc, 700 + i as u64, rows, topk, e);
        assert!(fp4_swiglu_down_fits(&c.shape), "{:?}", c.shape);
        for (limit, quant, weighted) in [
            (7.0, true, true),
            (0.0, true, true),
            (7.0, false, true),
            (7.0, true, false),
        ] {
            let want = run(&gc, &c, limit, quant, weighted, false);
            assert!(want.iter().all(|v| v.is_finite()), "reference has NaNs");
            for round in 0..2 {
                let got = run(&gc, &c, limit, quant, weighted, true);
                let what = format!(
                    "rows {rows} top-{topk} of {e}, limit {limit} quant {quant} weighted {weighted}, round {round}"
                );
                assert_same_bits(&got, &want, &what);
            }
        }
    }
}

/// What the fused kernel does not take: another matrix shape, x per token (w1 / w3), a batch past 64.
#[test]
fn fp4_swiglu_down_refuses_other_shapes() {
    let (n, k) = FP4_SWIGLU_DOWN_SHAPE;
    assert!(fp4_swiglu_down_fits(&expert_shape((1, 6, 256, n, k, true))));
    assert!(fp4_swiglu_down_fits(&expert_shape((
        64, 8, 256, n, k, true
    ))));
    assert!(!fp4_swiglu_down_fits(&expert_shape((
        1, 6, 256, n, k, false
    ))));
    assert!(!fp4_swiglu_down_fits(&expert_shape((
        1,
        6,
        256,
        n / 2,
        k,
        true
    ))));
    assert!(!fp4_swiglu_down_fits(&expert_shape((
        1,
        6,
        256,
        n,
        k + 128,
        true
    ))));
    assert!(!fp4_swiglu_down_fits(&expert_shape((
        65, 6, 256, n, k, true
    ))));
}
