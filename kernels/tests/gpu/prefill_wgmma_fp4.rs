//! The routed FP4 experts on wgmma (prefill_wgmma_fp4.cu, the engine's path: pf_moe_group with bm 256 or 64,
//! pf_kperm, pf_wgmma_fp4_expert or pf_wgmma_fp4_expert_s) against the CPU reference `fp4_expert` with the
//! pf_gemm tests' bound. Experts with 1, 7,
//! 33, 65, 200 and 260 rows (two tiles) and with none; every column-count instance (16 .. 256); N tails (not a
//! multiple of the 128-row block) and K tails (not a multiple of the 128-wide chunk, which also takes the
//! checkpoint scale layout); w1 + w3 as two groups (x per token), w2 (x per slot), f32 and bf16 output. pf_kperm
//! is compared with its CPU twin bit for bit. SKIP off sm_90a fatbin builds.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::PfKperm;
use dsv4_kernels::{
    bf16, pf_kperm_cols, reference, GpuContext, PF_WGMMA_FP4_BM, PF_WGMMA_FP4_SMALL_BM,
};
use rand::seq::SliceRandom;

use crate::common::*;
use crate::prefill_gemm::{
    bound_ratio, bytemuck_u16, dp, expert_params, fp4_absum, fp4_groups, group,
};
use crate::prefill_wgmma::wgmma_gpu;

/// One case: rows per expert (their sum a multiple of topk), output rows n, inner dim k.
struct Case {
    counts: &'static [usize],
    topk: usize,
    n: usize,
    k: usize,
}

/// Slot ids with exactly `counts[e]` slots of expert e, shuffled (slot i is token i / topk's).
fn ids_for(r: &mut rand::rngs::StdRng, counts: &[usize]) -> Vec<i32> {
    let mut ids: Vec<i32> = (0..counts.len())
        .flat_map(|e| std::iter::repeat_n(e as i32, counts[e]))
        .collect();
    ids.shuffle(r);
    ids
}

/// x permuted by pf_kperm, checked bit for bit against the CPU twin.
fn kperm(g: &GpuContext, x: &[bf16], rows: usize, k: usize) -> CudaSlice<bf16> {
    let dx = upload(g, x);
    let out: CudaSlice<bf16> = upload(g, &vec![bf16::NAN; rows * pf_kperm_cols(k)]);
    let p = PfKperm {
        x: dp(g, &dx),
        out: dp(g, &out),
        rows: rows as i32,
        k: k as i32,
    };
    // SAFETY: dx holds rows*k bf16, out rows*pf_kperm_cols(k).
    unsafe { g.launch_pf_kperm(&g.stream, &p) }.expect("kperm");
    let got: Vec<u16> = download(g, &out).iter().map(|v| v.to_bits()).collect();
    let want: Vec<u16> = reference::prefill::kperm(x, rows, k)
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert!(
        got == want,
        "pf_kperm rows {rows} k {k} differs from the CPU twin"
    );
    out
}

/// One expert GEMM launch on tiles of `bm` rows (w1 + w3 as two groups, or w2), each group checked against the
/// reference.
fn run(g: &GpuContext, seed: u64, c: &Case, bm: usize, per_slot: bool, bf16_out: bool) {
    let mut r = rng(seed);
    let (experts, n, k, topk) = (c.counts.len(), c.n, c.k, c.topk);
    let ids = ids_for(&mut r, c.counts);
    let s = ids.len();
    let (order, tiles, max_tiles) = group(g, &ids, experts, bm);
    let xrows = if per_slot { s } else { s / topk };
    let x = rand_bf16(&mut r, xrows * k);
    let xp = kperm(g, &x, xrows, k);
    let mut p = expert_params(&tiles, &order, g, k, topk, per_slot);
    p.out_bf16 = i32::from(bf16_out);
    let groups = if per_slot { 1 } else { 2 };
    let keep = fp4_groups(g, &mut r, &mut p, groups, dp(g, &xp), (experts, n, k, s));
    // SAFETY: tiles/order from pf_moe_group with this bm; xp holds xrows permuted rows, w/s experts*n*k/2 and
    // experts*n*k/32 bytes in the device layouts, out s*n f32 (bf16 output uses half).
    unsafe { g.launch_pf_wgmma_fp4_expert(&g.stream, bm, groups, max_tiles, &p) }.expect("launch");
    for (gi, f) in keep.iter().enumerate() {
        let raw = download(g, &f.out);
        let got: Vec<f32> = if bf16_out {
            bytemuck_u16(&raw)[..s * n]
                .iter()
                .map(|&b| bf16::from_bits(b).to_f32())
                .collect()
        } else {
            raw
        };
        let want = reference::fp4_expert(&x, &f.w, &f.sc, &ids, topk, experts, n, k, per_slot);
        let absum = fp4_absum(&x, &f.w, &f.sc, &ids, (topk, n, k), per_slot);
        let (worst, at) = bound_ratio(&got, &want, &absum, bf16_out);
        println!(
            "pf_wgmma_fp4_expert bm {bm} counts {:?} topk {topk} n {n} k {k} slot-x {per_slot} bf16 {bf16_out} \
             g {gi}: rel_l2 {:.2e}, worst/bound {worst:.3} at {at}",
            c.counts,
            rel_l2(&got, &want)
        );
        assert!(
            worst <= 1.0,
            "element {at} (slot {}, row {}) got {} want {}",
            at / n,
            at % n,
            got[at],
            want[at]
        );
    }
}

#[test]
fn pf_wgmma_fp4_expert_matches_reference() {
    let Some(g) = wgmma_gpu() else { return };
    let cases = [
        // 1, 7, 33, 65 and 200 rows and experts with none; N and K tails (K % 128 = 32: checkpoint scales).
        Case {
            counts: &[1, 0, 7, 65, 0, 200, 33, 0],
            topk: 2,
            n: 200,
            k: 160,
        },
        // 260 rows (tiles of 256 + 4), 16 and 17; N = 130 (a 2-row second block), device scale layout.
        Case {
            counts: &[260, 0, 16, 17, 3],
            topk: 4,
            n: 130,
            k: 256,
        },
        // One token; K = 32 (one group, a chunk mostly zero padding).
        Case {
            counts: &[1, 0, 2],
            topk: 3,
            n: 64,
            k: 32,
        },
        // The 48 .. 224-column instances.
        Case {
            counts: &[40, 64, 90, 128, 150, 190, 220],
            topk: 6,
            n: 256,
            k: 384,
        },
    ];
    // Both kernels: pf_wgmma_fp4_expert (tiles of 256 rows) and pf_wgmma_fp4_expert_s (64).
    for (i, c) in cases.iter().enumerate() {
        for bm in [PF_WGMMA_FP4_BM, PF_WGMMA_FP4_SMALL_BM] {
            for per_slot in [false, true] {
                run(&g, 200 + i as u64, c, bm, per_slot, false);
            }
        }
    }
    run(&g, 210, &cases[0], PF_WGMMA_FP4_BM, true, true);
    run(&g, 211, &cases[0], PF_WGMMA_FP4_SMALL_BM, true, true);
}
