//! Prefill GEMMs (dense FP8 / bf16 grouped, FP4 routed experts gathered per expert) and the expert grouping
//! against the CPU references, on awkward shapes: one row, odd rows, N and K tails, many tokens per expert
//! (several row tiles) and experts with none.
use dsv4_kernels::cudarc::driver::{CudaSlice, DevicePtr};
use dsv4_kernels::prefill::{PfGemm, PfGroup, PfWeights};
use dsv4_kernels::{bf16, pf_max_tiles, reference, GpuContext};
use rand::Rng;

use crate::common::*;
use crate::expert::rand_ids;

pub fn dp<T>(g: &GpuContext, b: &CudaSlice<T>) -> u64 {
    b.device_ptr(&g.stream).0
}

/// Max |got - want| / (1e-5 sum|x w| + bf16 rounding of the output) and where; the tests pass when <= 1.
pub fn bound_ratio(got: &[f32], want: &[f32], absum: &[f32], bf16_out: bool) -> (f32, usize) {
    worst_ratio(got, want, |i| {
        let rnd = if bf16_out {
            want[i].abs() * 2f32.powi(-8)
        } else {
            0.0
        };
        1e-5 * absum[i] + rnd + 1e-30
    })
}

/// [`bound_ratio`] printed and asserted <= 1.
pub fn check(name: &str, got: &[f32], want: &[f32], absum: &[f32], bf16_out: bool) {
    let (worst, at) = bound_ratio(got, want, absum, bf16_out);
    println!(
        "{name}: rel_l2 {:.2e}, worst/bound {worst:.3} at {at}",
        rel_l2(got, want)
    );
    assert!(
        worst <= 1.0,
        "{name}: element {at} got {} want {}",
        got[at],
        want[at]
    );
}

pub fn sum_abs(x: &[bf16], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k)
                .map(|j| (x[r * k + j].to_f32() * w[c * k + j]).abs())
                .sum()
        })
        .collect()
}

pub fn fp8_values(w: &[u8], s: &[u8], n: usize, k: usize) -> Vec<f32> {
    let kb = k.div_ceil(128);
    (0..n * k)
        .map(|i| {
            let (r, j) = (i / k, i % k);
            reference::formats::e4m3_to_f32(w[i])
                * reference::formats::ue8m0(s[(r / 128) * kb + j / 128])
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
/// One dense launch with `ns.len()` groups sharing x (FP8 or bf16 weights), checked group by group.
fn dense_case(
    g: &GpuContext,
    seed: u64,
    m: usize,
    ns: &[usize],
    k: usize,
    wt: PfWeights,
    bm: usize,
    bf16_out: bool,
) {
    let mut r = rng(seed);
    let x = rand_bf16(&mut r, m * k);
    let dx = upload(g, &x);
    let mut p = PfGemm {
        m: m as i32,
        k: k as i32,
        out_bf16: i32::from(bf16_out),
        ..Default::default()
    };
    let mut keep = Vec::new();
    let mut wants = Vec::new();
    for (gi, &n) in ns.iter().enumerate() {
        let (wvals, dw, ds) = if wt == PfWeights::Fp8 {
            let w = rand_e4m3(&mut r, n * k);
            let s = rand_exponents(&mut r, n.div_ceil(128) * k.div_ceil(128), 100, 134);
            let want = reference::fp8_gemv(&x, &w, &s, m, n, k);
            wants.push(want);
            (fp8_values(&w, &s, n, k), upload(g, &w), upload(g, &s))
        } else {
            let w = rand_bf16(&mut r, n * k);
            wants.push(reference::prefill::bf16_gemm(&x, &w, m, n, k));
            let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
            (
                w.iter().map(|v| v.to_f32()).collect(),
                upload(g, &bytes),
                upload(g, &[0u8]),
            )
        };
        let out: CudaSlice<f32> = upload(g, &vec![f32::NAN; m * n]);
        p.x[gi] = dp(g, &dx);
        p.w[gi] = dp(g, &dw);
        p.s[gi] = dp(g, &ds);
        p.out[gi] = dp(g, &out);
        p.n[gi] = n as i32;
        keep.push((wvals, dw, ds, out));
    }
    // SAFETY: every group's x holds m*k bf16, w/s the n*k weights and scales, out m*n f32 (bf16 uses half).
    unsafe { g.launch_pf_gemm(&g.stream, wt, bm, ns.len(), m.div_ceil(bm), &p) }.expect("launch");
    for (gi, (wvals, _, _, out)) in keep.iter().enumerate() {
        let n = ns[gi];
        let raw = download(g, out);
        let got: Vec<f32> = if bf16_out {
            let bits: &[u16] = bytemuck_u16(&raw);
            bits[..m * n]
                .iter()
                .map(|&b| bf16::from_bits(b).to_f32())
                .collect()
        } else {
            raw
        };
        let name =
            format!("pf_gemm {wt:?} bm {bm} m {m} n {n} k {k} group {gi} bf16_out {bf16_out}");
        check(
            &name,
            &got,
            &wants[gi],
            &sum_abs(&x, wvals, m, n, k),
            bf16_out,
        );
    }
}

/// The u16 view of f32 storage a bf16 output was written into.
pub fn bytemuck_u16(v: &[f32]) -> &[u16] {
    // SAFETY: f32 and u16 are plain old data; the slice covers exactly the same bytes, alignment 4 >= 2.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u16>(), v.len() * 2) }
}

#[test]
fn pf_gemm_dense_matches_reference() {
    let Some(g) = gpu() else { return };
    let cases: [(usize, &[usize], usize); 7] = [
        (1, &[130], 64),
        (3, &[300, 17], 1040),
        (77, &[129], 272),
        (130, &[256, 512, 8], 32),
        (257, &[1000], 1024),
        (64, &[8], 48),
        (200, &[384, 128], 4096),
    ];
    for (i, (m, ns, k)) in cases.iter().enumerate() {
        for bm in [64, 128] {
            dense_case(&g, 10 + i as u64, *m, ns, *k, PfWeights::Fp8, bm, false);
            dense_case(&g, 30 + i as u64, *m, ns, *k, PfWeights::Bf16, bm, false);
        }
    }
    dense_case(&g, 50, 33, &[200], 256, PfWeights::Fp8, 128, true);
    dense_case(&g, 51, 65, &[96], 64, PfWeights::Bf16, 64, true);
}

/// sum_k |x[r(slot), k] * W[ids[slot], n, k]| per (slot, n) for FP4 experts (checkpoint-order weights `w`,
/// scales `sc`), the scale of the routed-expert tests' bound; `(topk, n, k)` as in `reference::fp4_expert`.
pub fn fp4_absum(
    x: &[bf16],
    w: &[u8],
    sc: &[u8],
    ids: &[i32],
    (topk, n, k): (usize, usize, usize),
    per_slot: bool,
) -> Vec<f32> {
    (0..ids.len() * n)
        .map(|i| {
            let (slot, row) = (i / n, i % n);
            let e = ids[slot] as usize;
            let xr = if per_slot { slot } else { slot / topk };
            (0..k)
                .map(|j| {
                    let base = (e * n + row) * k;
                    let byte = w[(base + j) / 2];
                    let nib = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                    let wv = reference::formats::e2m1_to_f32(nib)
                        * reference::formats::ue8m0(sc[base / 32 + j / 32]);
                    (x[xr * k + j].to_f32() * wv).abs()
                })
                .sum()
        })
        .collect()
}

/// pf_moe_group of `ids` into tiles of `bm` rows, checked against the grouping rules: (order, tiles, max tiles).
pub fn group(
    g: &GpuContext,
    ids: &[i32],
    experts: usize,
    bm: usize,
) -> (CudaSlice<i32>, CudaSlice<i32>, usize) {
    let s = ids.len();
    let max_tiles = pf_max_tiles(s, experts, bm);
    let did = upload(g, ids);
    let order: CudaSlice<i32> = upload(g, &vec![-1i32; s]);
    let tiles: CudaSlice<i32> = upload(g, &vec![-1i32; 1 + 3 * max_tiles]);
    let gp = PfGroup {
        ids: dp(g, &did),
        order: dp(g, &order),
        tiles: dp(g, &tiles),
        slots: s as i32,
        experts: experts as i32,
        bm: bm as i32,
        pad: 0,
    };
    // SAFETY: ids holds s ids < experts, order s ints, tiles 1 + 3 * max_tiles ints.
    unsafe { g.launch_pf_moe_group(&g.stream, &gp) }.expect("group");
    let (ho, ht) = (download(g, &order), download(g, &tiles));
    reference::prefill::check_moe_group(ids, &ho, &ht, bm).expect("grouping");
    (order, tiles, max_tiles)
}

#[allow(clippy::too_many_arguments)]
/// pf_moe_group, then the expert GEMM as w1 + w3 (two groups, x per token) and as w2 (x per slot).
fn expert_case(
    g: &GpuContext,
    seed: u64,
    b: usize,
    topk: usize,
    experts: usize,
    n: usize,
    k: usize,
    bm: usize,
) {
    let mut r = rng(seed);
    let s = b * topk;
    let ids = rand_ids(&mut r, b, topk, experts);
    let (order, tiles, max_tiles) = group(g, &ids, experts, bm);
    for per_slot in [false, true] {
        let xrows = if per_slot { s } else { b };
        let x = rand_bf16(&mut r, xrows * k);
        let dx = upload(g, &x);
        let mut p = expert_params(&tiles, &order, g, k, topk, per_slot);
        let groups = if per_slot { 1 } else { 2 };
        let keep = fp4_groups(g, &mut r, &mut p, groups, dp(g, &dx), (experts, n, k, s));
        // SAFETY: tiles/order from pf_moe_group with this bm; x holds xrows*k, w/s experts*n*k/2 and
        // experts*n*k/32 bytes, out s*n f32.
        unsafe { g.launch_pf_gemm(&g.stream, PfWeights::Fp4Expert, bm, groups, max_tiles, &p) }
            .expect("launch");
        for (gi, f) in keep.iter().enumerate() {
            let got = download(g, &f.out);
            let want = reference::fp4_expert(&x, &f.w, &f.sc, &ids, topk, experts, n, k, per_slot);
            let absum = fp4_absum(&x, &f.w, &f.sc, &ids, (topk, n, k), per_slot);
            let name = format!("pf_gemm_fp4_expert bm {bm} b {b} topk {topk} E {experts} n {n} k {k} slot-x {per_slot} g {gi}");
            check(&name, &got, &want, &absum, false);
        }
    }
}

/// The expert-mode PfGemm of tiles/order from pf_moe_group (groups still to fill).
pub fn expert_params(
    tiles: &CudaSlice<i32>,
    order: &CudaSlice<i32>,
    g: &GpuContext,
    k: usize,
    topk: usize,
    per_slot: bool,
) -> PfGemm {
    PfGemm {
        tiles: dp(g, tiles),
        order: dp(g, order),
        k: k as i32,
        topk: topk as i32,
        x_per_slot: i32::from(per_slot),
        ..Default::default()
    }
}

/// One group's random FP4 experts: checkpoint-order weights and scales, the output, and the device-layout
/// copies the launch reads through their addresses (kept alive here).
pub struct Fp4Group {
    pub w: Vec<u8>,
    pub sc: Vec<u8>,
    pub out: CudaSlice<f32>,
    _dev: (CudaSlice<u8>, CudaSlice<u8>),
}

/// Fills the first `groups` groups of `p` with x at `x`, random FP4 experts `(experts, n, k)` and NaN outputs of
/// `slots` rows.
pub fn fp4_groups(
    g: &GpuContext,
    r: &mut rand::rngs::StdRng,
    p: &mut PfGemm,
    groups: usize,
    x: u64,
    (experts, n, k, slots): (usize, usize, usize, usize),
) -> Vec<Fp4Group> {
    (0..groups)
        .map(|gi| {
            let w = rand_bytes(r, experts * n * k / 2);
            let sc = rand_exponents(r, experts * n * k / 32, 100, 128);
            let (dw, ds) = (
                upload_fp4(g, &w, experts, n, k),
                upload_fp4_scales(g, &sc, experts, n, k),
            );
            let out: CudaSlice<f32> = upload(g, &vec![f32::NAN; slots * n]);
            (p.x[gi], p.w[gi], p.s[gi], p.out[gi]) = (x, dp(g, &dw), dp(g, &ds), dp(g, &out));
            p.n[gi] = n as i32;
            Fp4Group {
                w,
                sc,
                out,
                _dev: (dw, ds),
            }
        })
        .collect()
}

#[test]
fn pf_gemm_experts_match_reference() {
    let Some(g) = gpu() else { return };
    // (tokens, topk, experts, n, k): one token; experts with none; 150+ rows per expert (several tiles).
    let cases = [
        (1, 2, 8, 64, 32),
        (5, 2, 40, 128, 64),
        (300, 2, 4, 96, 128),
        (77, 6, 16, 256, 256),
        (129, 3, 9, 160, 96),
    ];
    for (i, &(b, topk, e, n, k)) in cases.iter().enumerate() {
        for bm in [64, 128] {
            expert_case(&g, 70 + i as u64, b, topk, e, n, k, bm);
        }
    }
}

#[test]
fn pf_moe_group_handles_one_expert_and_many() {
    let Some(g) = gpu() else { return };
    let mut r = rng(90);
    for (s, experts, bm) in [(1, 1, 64), (1000, 1, 64), (4096, 1024, 128), (9, 300, 64)] {
        let ids: Vec<i32> = (0..s).map(|_| r.random_range(0..experts as i32)).collect();
        let max_tiles = pf_max_tiles(s, experts, bm);
        let did = upload(&g, &ids);
        let order: CudaSlice<i32> = upload(&g, &vec![-1i32; s]);
        let tiles: CudaSlice<i32> = upload(&g, &vec![-1i32; 1 + 3 * max_tiles]);
        let gp = PfGroup {
            ids: dp(&g, &did),
            order: dp(&g, &order),
            tiles: dp(&g, &tiles),
            slots: s as i32,
            experts: experts as i32,
            bm: bm as i32,
            pad: 0,
        };
        // SAFETY: as in expert_case.
        unsafe { g.launch_pf_moe_group(&g.stream, &gp) }.expect("group");
        let (ho, ht) = (download(&g, &order), download(&g, &tiles));
        reference::prefill::check_moe_group(&ids, &ho, &ht, bm).expect("grouping");
        assert!(ht[0] as usize <= max_tiles);
        println!(
            "pf_moe_group slots {s} experts {experts} bm {bm}: {} tiles",
            ht[0]
        );
    }
}
