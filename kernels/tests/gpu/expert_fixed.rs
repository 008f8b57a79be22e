//! The fixed-size routed-expert kernels (`FP4_FIXED`: fp4_expert_mt2 with the model's w1 / w3 and w2 sizes
//! compiled in), which the launchers pick for those shapes: against the CPU reference, and bit for bit against
//! the generic kernel with the same K split.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{
    moe_group_meta_len, ExpertShape, Fp4Mat, Fp4Tune, GemvOut, GpuContext, FP4_FIXED,
};

use crate::common::*;
use crate::expert::{rand_ids, run_case};

/// Batch 1 (top-6 of 8 experts) and 9 tokens that all choose the same 4 experts (groups of 9: a full 8-token
/// pass, then a pass of one real column), for each fixed shape (w2 with x per slot, as the model runs it).
#[test]
fn fp4_expert_fixed_shapes_match_reference_and_generic() {
    let Some(g) = gpu() else { return };
    for (i, f) in FP4_FIXED.iter().enumerate() {
        let per_slot = f.n > f.k;
        for (j, (b, topk, experts)) in [(1, 6, 8), (9, 4, 4)].into_iter().enumerate() {
            let shape = expert_shape((b, topk, experts, f.n, f.k, per_slot));
            assert_eq!(
                Fp4Tune::for_shape(&shape).kw,
                f.kw,
                "{f:?}: not the default split"
            );
            let seed = 900 + 10 * i as u64 + j as u64;
            run_case(&g, seed, shape, &[None]);
            same_bits_as_generic(&g, seed + 100, &shape);
        }
    }
}

/// One and two matrices through the launchers (the fixed kernel) and through the generic kernel with 32- and
/// 16-row warps (the same K split, so the same sums in the same order): equal bits.
fn same_bits_as_generic(g: &GpuContext, seed: u64, shape: &ExpertShape) {
    let mut r = rng(seed);
    let (s, n, k, e) = (shape.b * shape.topk, shape.n, shape.k, shape.experts);
    let ids = upload(g, &rand_ids(&mut r, shape.b, shape.topk, e));
    let xrows = if shape.x_per_slot { s } else { shape.b };
    let x = upload(g, &rand_bf16(&mut r, xrows * k));
    let w: Vec<_> = (0..2)
        .map(|_| upload_fp4(g, &rand_bytes(&mut r, e * n * k / 2), e, n, k))
        .collect();
    let sc: Vec<_> = (0..2)
        .map(|_| {
            upload_fp4_scales(
                g,
                &rand_exponents(&mut r, e * n * k / 32, 100, 128),
                e,
                n,
                k,
            )
        })
        .collect();
    let mut meta: CudaSlice<i32> = upload(g, &vec![0i32; moe_group_meta_len(s)]);
    g.launch_moe_group(&g.stream, shape, &ids, &mut meta)
        .expect("moe_group");
    let tune = Fp4Tune::for_shape(shape);
    // run(kind, mats): kind 0 = the launchers, 1 = generic mt2, 2 = generic mt1, 3 = one matrix with the table
    // ready (weights issued before the wait).
    let run = |kind: usize, mats: usize| -> Vec<Vec<f32>> {
        let mut ys: Vec<CudaSlice<f32>> = (0..mats)
            .map(|_| upload(g, &vec![f32::NAN; s * n]))
            .collect();
        let mut outs = ys.iter_mut();
        let mut mat = |m: usize| {
            outs.next().map(|y| Fp4Mat {
                w: &w[m],
                scale: &sc[m],
                out: GemvOut::f32(y, &g.stream),
            })
        };
        let mats = [mat(0), mat(1)];
        let t = Fp4Tune {
            mt: if kind == 2 { 1 } else { 2 },
            ..tune
        };
        match (kind, mats) {
            (0, [Some(a), Some(b)]) => {
                g.launch_fp4_expert_pair(&g.stream, shape, &x, [a, b], &meta, None)
            }
            (0, [Some(a), None]) => {
                g.launch_fp4_expert(&g.stream, shape, &x, a.w, a.scale, &meta, a.out)
            }
            (3, [Some(a), None]) => g.launch_fp4_expert_table_ready(&g.stream, shape, &x, a, &meta),
            (_, mats) => g.launch_fp4_expert_generic(&g.stream, shape, &x, mats, &meta, t),
        }
        .expect("launch");
        ys.iter().map(|y| download(g, y)).collect()
    };
    for mats in [1, 2] {
        let fixed = run(0, mats);
        let kinds: &[usize] = if mats == 1 { &[1, 2, 3] } else { &[1, 2] };
        for &kind in kinds {
            for (m, (a, b)) in fixed.iter().zip(run(kind, mats)).enumerate() {
                let what =
                    format!("{shape:?}: fixed vs generic ({kind}), {mats} matrices, matrix {m}");
                assert_same_bits(a, &b, &what);
            }
        }
    }
}
