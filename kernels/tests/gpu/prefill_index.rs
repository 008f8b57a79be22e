//! Prefill indexer scores (pf_index_score) against the CPU reference, on calls of several sequences, in row groups
//! as the runner scores a long call, and with every row paired with each of its neighbours.
use dsv4_kernels::attn::IndexScoreCore;
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::PfIndexScore;
use dsv4_kernels::reference::prefill::index_scores;
use rand::Rng;

use crate::common::*;
use crate::prefill_attn::{bits, rows_of};
use crate::prefill_gemm::dp;

#[test]
fn pf_index_scores_match_reference() {
    let Some(g) = gpu() else { return };
    for (seed, heads, dim, k) in [(1u64, 16usize, 64usize, 8usize), (2, 64, 128, 40)] {
        let mut r = rng(seed);
        let (ratio, cap) = (4, 400);
        let segs = [(0, 0, 300), (1, 1000, 7), (2, 3, 20)];
        let rows = rows_of(&segs);
        let n = rows.positions.len();
        let stride = heads + 3;
        let q = rand_bf16(&mut r, n * heads * dim);
        let wts: Vec<f32> = (0..n * stride)
            .map(|_| r.random_range(-1.0f32..1.0))
            .collect();
        let keys = rand_bf16(&mut r, 3 * cap * dim);
        let scale = ((heads * dim) as f32).powf(-0.5);
        let (dq, dw, dk) = (
            upload(&g, &bits(&q)),
            upload(&g, &wts),
            upload(&g, &bits(&keys)),
        );
        let (dsl, dpos) = (upload(&g, &rows.slots), upload(&g, &rows.positions));
        // Two row groups, as the runner scores a long call group by group; then the rows again from row 1, so
        // that every block pairs each row with its other neighbour: a row's bits must not depend on its partner.
        let mut first: Vec<Vec<f32>> = vec![Vec::new(); n];
        for (begin, len) in [(0usize, 150usize), (150, n - 150), (1, n - 1)] {
            let scores: CudaSlice<f32> = upload(&g, &vec![f32::NAN; len * cap]);
            let p = PfIndexScore {
                core: IndexScoreCore {
                    q: dp(&g, &dq),
                    wts: dp(&g, &dw),
                    keys: dp(&g, &dk),
                    slots: dp(&g, &dsl),
                    positions: dp(&g, &dpos),
                    scores: dp(&g, &scores),
                    wts_stride: stride as i32,
                    heads: heads as i32,
                    dim: dim as i32,
                    cap: cap as i32,
                    ratio: ratio as i32,
                    k: k as i32,
                },
                row_begin: begin as i32,
                scale,
                ..Default::default()
            };
            // SAFETY: q/wts/positions/slots cover every row, keys [3, cap, dim], scores len x cap.
            unsafe { g.launch_pf_index_score(&g.stream, 3, len, &p) }.expect("launch");
            let got = download(&g, &scores);
            let mut checked = 0;
            for i in 0..len {
                let rr = begin + i;
                let want = index_scores(
                    &rows, rr, &q, &wts, stride, &keys, heads, dim, cap, ratio, k, scale,
                );
                let gr = &got[i * cap..i * cap + want.len()];
                if begin == 1 {
                    let same = gr
                        .iter()
                        .zip(&first[rr])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "row {rr}: scores differ with another partner row");
                } else {
                    first[rr] = gr.to_vec();
                }
                let bound: f32 = 2e-5 * want.iter().map(|v| v.abs()).fold(1.0, f32::max);
                for (w, (a, b)) in gr.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= bound + 1e-5 * b.abs(),
                        "row {rr} entry {w}: got {a} want {b}"
                    );
                }
                checked += want.len();
            }
            println!(
                "pf_index_score heads {heads} dim {dim} rows {begin}..{}: {checked} scores checked",
                begin + len
            );
        }
    }
}
