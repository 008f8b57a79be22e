//! fp4_routed_up (the routed w1 / w3 pair routing its own rows) against moe_route_group followed by the pair
//! launch: the same ids, weights, group table and outputs, bit for bit, for top-k with and without a bias and
//! for hash routing, at every batch the fused kernel takes; and the shapes it refuses.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{
    fp4_routed_up_fits, moe_group_meta_len, ExpertShape, Fp4Mat, GemvOut, GpuContext, RouteBy,
    RouteShape, RoutedUpRoute, FP4_ROUTED_UP_ROWS, FP4_ROUTED_UP_SHAPE,
};
use rand::Rng;

use crate::common::*;
use crate::expert::rand_ids;

#[derive(Debug, Clone, Copy)]
enum By {
    TopK,
    TopKBias,
    Hash,
}

/// The model's expert matrices, `e` experts (few, so the weights stay small), their inputs and routing inputs.
struct Case {
    route: RouteShape,
    up: ExpertShape,
    logits: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    table: CudaSlice<i32>,
    tokens: CudaSlice<i32>,
    x: CudaSlice<dsv4_kernels::bf16>,
    w: Vec<CudaSlice<u8>>,
    s: Vec<CudaSlice<u8>>,
}

fn make_case(g: &GpuContext, seed: u64, rows: usize, e: usize, topk: usize) -> Case {
    let mut r = rng(seed);
    let (n, k) = FP4_ROUTED_UP_SHAPE;
    let route = RouteShape {
        rows,
        experts: e,
        topk,
        route_scale: 1.5,
    };
    let up = expert_shape((rows, topk, e, n, k, false));
    let logits: Vec<f32> = (0..rows * e)
        .map(|_| r.random_range(-6.0f32..6.0))
        .collect();
    let bias: Vec<f32> = (0..e).map(|_| r.random_range(-0.5f32..0.5)).collect();
    let vocab = 37;
    let table = rand_ids(&mut r, vocab, topk, e);
    let tokens: Vec<i32> = (0..rows).map(|_| r.random_range(0..vocab as i32)).collect();
    let w = (0..2)
        .map(|_| upload_fp4(g, &rand_bytes(&mut r, e * n * k / 2), e, n, k))
        .collect();
    let s = (0..2)
        .map(|_| {
            upload_fp4_scales(
                g,
                &rand_exponents(&mut r, e * n * k / 32, 110, 128),
                e,
                n,
                k,
            )
        })
        .collect();
    Case {
        route,
        up,
        logits: upload(g, &logits),
        bias: upload(g, &bias),
        table: upload(g, &table),
        tokens: upload(g, &tokens),
        x: upload(g, &rand_bf16(&mut r, rows * k)),
        w,
        s,
    }
}

/// ids, wts, meta and the two outputs of one path (fused or not), from buffers filled with junk first.
type Outputs = (Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>, Vec<f32>);

fn run(g: &GpuContext, c: &Case, by: By, fused: bool) -> Outputs {
    let slots = c.route.rows * c.route.topk;
    let (n, st) = (c.up.n, &g.stream);
    let mut ids = upload(g, &vec![-3i32; slots]);
    let mut wts = upload(g, &vec![f32::NAN; slots]);
    let mut meta = upload(g, &vec![-7i32; moe_group_meta_len(slots)]);
    let mut ys: Vec<CudaSlice<f32>> = (0..2)
        .map(|_| upload(g, &vec![f32::NAN; slots * n]))
        .collect();
    let route_by = || -> RouteBy<'_, CudaSlice<i32>, CudaSlice<f32>> {
        match by {
            By::TopK => RouteBy::TopK { bias: None },
            By::TopKBias => RouteBy::TopK {
                bias: Some(&c.bias),
            },
            By::Hash => RouteBy::Hash {
                tid2eid: &c.table,
                tokens: &c.tokens,
            },
        }
    };
    {
        let [y0, y1] = &mut ys[..] else {
            unreachable!("two outputs")
        };
        let mats = [
            Fp4Mat {
                w: &c.w[0],
                scale: &c.s[0],
                out: GemvOut::f32(y0, st),
            },
            Fp4Mat {
                w: &c.w[1],
                scale: &c.s[1],
                out: GemvOut::f32(y1, st),
            },
        ];
        if fused {
            let route = RoutedUpRoute {
                shape: c.route,
                logits: &c.logits,
                by: route_by(),
            };
            g.launch_fp4_routed_up(st, route, &mut ids, &mut wts, &mut meta, &c.up, &c.x, mats)
                .expect("fused launch");
        } else {
            g.launch_moe_route_group(
                st,
                &c.route,
                &c.logits,
                route_by(),
                &mut ids,
                &mut wts,
                &mut meta,
            )
            .expect("route_group");
            g.launch_fp4_expert_pair(st, &c.up, &c.x, mats, &meta, None)
                .expect("pair");
        }
    }
    let [y0, y1] = &ys[..] else {
        unreachable!("two outputs")
    };
    (
        download(g, &ids),
        download(g, &wts),
        download(g, &meta),
        download(g, y0),
        download(g, y1),
    )
}

/// Batches 1-4 (top-6: 6-24 slots, the most one warp groups), 23 experts (a count no tile divides), each way of
/// routing; a second fused launch on the same buffers gives the same bits again.
#[test]
fn fp4_routed_up_matches_route_group_then_pair() {
    let Some(g) = gpu() else { return };
    for rows in 1..=FP4_ROUTED_UP_ROWS {
        let c = make_case(&g, 300 + rows as u64, rows, 23, 6);
        assert!(fp4_routed_up_fits(&c.route, &c.up), "{:?}", c.route);
        for by in [By::TopK, By::TopKBias, By::Hash] {
            let want = run(&g, &c, by, false);
            for round in 0..2 {
                let got = run(&g, &c, by, true);
                let what = format!("rows {rows} {by:?} round {round}");
                assert_eq!(got.0, want.0, "{what}: ids");
                assert_same_bits(&got.1, &want.1, &format!("{what}: weights"));
                assert_eq!(got.2, want.2, "{what}: group table");
                assert_same_bits(&got.3, &want.3, &format!("{what}: w1"));
                assert_same_bits(&got.4, &want.4, &format!("{what}: w3"));
            }
        }
    }
}

/// What the fused kernel does not take: another matrix shape, more rows than its warps, more slots than one warp
/// groups, more experts than its score scratch, a batch the expert shape does not share.
#[test]
fn fp4_routed_up_refuses_other_shapes() {
    let (n, k) = FP4_ROUTED_UP_SHAPE;
    let route = |rows, experts, topk| RouteShape {
        rows,
        experts,
        topk,
        route_scale: 1.0,
    };
    let up = |rows, experts, topk, n, k| expert_shape((rows, topk, experts, n, k, false));
    assert!(fp4_routed_up_fits(&route(1, 256, 6), &up(1, 256, 6, n, k)));
    assert!(fp4_routed_up_fits(&route(4, 256, 8), &up(4, 256, 8, n, k)));
    assert!(!fp4_routed_up_fits(
        &route(1, 256, 6),
        &up(1, 256, 6, n, k / 2)
    ));
    assert!(!fp4_routed_up_fits(
        &route(1, 256, 6),
        &up(1, 256, 6, n + 32, k)
    ));
    assert!(!fp4_routed_up_fits(&route(5, 256, 6), &up(5, 256, 6, n, k)));
    assert!(!fp4_routed_up_fits(&route(4, 256, 9), &up(4, 256, 9, n, k)));
    assert!(!fp4_routed_up_fits(&route(1, 257, 6), &up(1, 257, 6, n, k)));
    assert!(!fp4_routed_up_fits(&route(2, 256, 6), &up(1, 256, 6, n, k)));
    let per_slot = expert_shape((1, 6, 256, n, k, true));
    assert!(!fp4_routed_up_fits(&route(1, 256, 6), &per_slot));
}
