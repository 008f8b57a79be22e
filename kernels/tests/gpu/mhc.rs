//! mHC kernels against the CPU reference (reference::mhc): HCPre/HCHead + RMSNorm, with and without the
//! previous mixer's HCPost fused in (the fused launch must give the same bits as HCPost then HCPre), and
//! the attention mixer's FP8 copy (the same bits as attn_row_prep's x quant of the output).
use dsv4_kernels::attn::AttnRowPrep;
use dsv4_kernels::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use dsv4_kernels::reference::formats::e4m3_to_f32;
use dsv4_kernels::reference::mhc::{hc_post, hc_pre, HcRef};
use dsv4_kernels::{bf16, GpuContext, HcCodes, HcPost, HcPostF, HcPre, HC_MIX};
use rand::rngs::StdRng;
use rand::Rng;

use crate::common::*;

/// Routed experts per row: more than the fused kernel's batch of 8 loads, so it takes two batches.
const TOPK: usize = 10;
/// Rows and D: rows 1 / 3 / 17 / 64 (every mix-group split), 65 (a prefill call's row loop with its prefetches
/// past the last row), 300 / 1100 / 8192 (from 256 rows, HCPre without a fused HCPost and HCPost take the
/// many-row kernels of mhc_wide.cu: a partial last row tile, chunk lanes with 1 to 4 chunks or a partial last
/// chunk; the fused call keeps the decode kernels, so fused against unfused compares the two forms' bits), D a
/// multiple of 32, of 8 only, and 4096.
const SHAPES: [(usize, usize); 13] = [
    (300, 4096),
    (1100, 1160),
    (8192, 72),
    (65, 264),
    (300, 200),
    (1100, 72),
    (1, 4096),
    (3, 1000),
    (17, 200),
    (64, 264),
    (1, 200),
    (3, 4096),
    (17, 1000),
];

fn uniform(r: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

/// Host inputs of one case: streams, mixer parameters, the previous mixer's coefficients and the
/// sub-block outputs (bf16 f and the MoE's f32 routed + shared).
struct Case {
    rows: usize,
    d: usize,
    m: usize,
    x: Vec<bf16>,
    func: Vec<f32>,
    base: Vec<f32>,
    scale: Vec<f32>,
    norm_w: Vec<f32>,
    mix: Vec<f32>,
    f: Vec<bf16>,
    routed: Vec<f32>,
    shared: Vec<f32>,
}

impl Case {
    fn new(seed: u64, rows: usize, d: usize, head: bool) -> Case {
        let mut r = rng(seed);
        let m = if head { 4 } else { HC_MIX };
        let mut mix = Vec::new();
        for _ in 0..rows {
            mix.extend(uniform(&mut r, 4, 0.0, 2.0));
            mix.extend(uniform(&mut r, 16, 0.0, 0.5));
            mix.extend([0.0; HC_MIX - 20]);
        }
        Case {
            rows,
            d,
            m,
            x: rand_bf16(&mut r, rows * 4 * d),
            func: uniform(&mut r, m * 4 * d, -0.02, 0.02),
            base: uniform(&mut r, m, -1.0, 1.0),
            scale: uniform(&mut r, 3, 0.5, 1.5),
            norm_w: uniform(&mut r, d, 0.5, 1.5),
            mix,
            f: rand_bf16(&mut r, rows * d),
            routed: uniform(&mut r, rows * TOPK * d, -1.0, 1.0),
            shared: uniform(&mut r, rows * d, -1.0, 1.0),
        }
    }

    fn params(&self, yq_bf16: bool) -> HcPre {
        HcPre {
            rows: self.rows,
            d: self.d,
            norm_eps: 1e-6,
            hc_eps: 1e-6,
            sinkhorn_iters: 20,
            head: self.m == 4,
            yq_bf16,
        }
    }

    fn reference(&self) -> HcRef<'_> {
        HcRef {
            func: &self.func,
            base: &self.base,
            scale: &self.scale,
            norm_w: &self.norm_w,
            eps: 1e-6,
            hc_eps: 1e-6,
            iters: 20,
        }
    }

    /// The same case cut to its first `n` rows (the same parameters, the same per-row inputs).
    fn first_rows(&self, n: usize) -> Case {
        let d = self.d;
        Case {
            rows: n,
            d,
            m: self.m,
            x: self.x[..n * 4 * d].to_vec(),
            func: self.func.clone(),
            base: self.base.clone(),
            scale: self.scale.clone(),
            norm_w: self.norm_w.clone(),
            mix: self.mix[..n * HC_MIX].to_vec(),
            f: self.f[..n * d].to_vec(),
            routed: self.routed[..n * TOPK * d].to_vec(),
            shared: self.shared[..n * d].to_vec(),
        }
    }

    /// The sub-block output f (f32 values) of `moe`: bf16(sum_k routed + shared) or the bf16 f.
    fn f_ref(&self, moe: bool) -> Vec<f32> {
        if !moe {
            return self.f.iter().map(|v| v.to_f32()).collect();
        }
        (0..self.rows * self.d)
            .map(|i| {
                let (row, c) = (i / self.d, i % self.d);
                let mut s = 0f32;
                for k in 0..TOPK {
                    s += self.routed[(row * TOPK + k) * self.d + c];
                }
                bf16::from_f32(s + self.shared[i]).to_f32()
            })
            .collect()
    }
}

/// Device outputs of one HCPre launch: streams after it, mix, y, yq.
struct Out {
    x: Vec<bf16>,
    mix: Vec<f32>,
    y: Vec<bf16>,
    yq: Vec<bf16>,
    /// yq's e4m3 codes and block scales (D % 128 == 0 only).
    codes: Option<(Vec<u8>, Vec<f32>)>,
}

/// Runs the case on the GPU: HCPost (`moe` picks its f; None: no HCPost) unfused (`fused == false`: its own
/// launch first) or fused into the HCPre, then HCPre with the FP8 copy (`yq_bf16` picks its source).
fn run(g: &GpuContext, c: &Case, post: Option<bool>, fused: bool, yq_bf16: bool) -> Out {
    let s = &g.stream;
    let (rows, d) = (c.rows, c.d);
    let mut x = upload(g, &c.x);
    let (func, base, scale, norm_w) = (
        upload(g, &c.func),
        upload(g, &c.base),
        upload(g, &c.scale),
        upload(g, &c.norm_w),
    );
    let mut mix = upload(g, &c.mix);
    let (f, routed, shared) = (upload(g, &c.f), upload(g, &c.routed), upload(g, &c.shared));
    let mut ws: CudaSlice<f32> =
        upload(g, &vec![f32::NAN; dsv4_kernels::hc_workspace_len(rows, d)]);
    let mut y = upload(g, &vec![bf16::NAN; rows * d]);
    let mut yq = upload(g, &vec![bf16::NAN; rows * d]);
    let mut scratch = upload(g, &vec![bf16::NAN; rows * 4 * d]);
    let mut codes = upload(g, &vec![0xffu8; rows * d]);
    let mut scales = upload(g, &vec![f32::NAN; (rows * d).div_ceil(128)]);
    let with_codes = d.is_multiple_of(128);
    let src = post.map(|moe| match moe {
        true => HcPostF::Moe {
            routed: &routed,
            shared: &shared,
            topk: TOPK,
        },
        false => HcPostF::Bf16(&f),
    });
    if !fused {
        match post {
            Some(true) => g.launch_hc_post_moe(s, rows, d, TOPK, &mut x, &mix, &routed, &shared),
            Some(false) => g.launch_hc_post(s, rows, d, &mut x, &mix, &f),
            None => Ok(()),
        }
        .expect("hc_post");
    }
    let p = c.params(yq_bf16);
    let fused_post = match fused {
        true => src.map(|f| HcPost {
            f,
            scratch: &mut scratch,
        }),
        false => None,
    };
    g.launch_hc_pre(
        s,
        &p,
        &mut x,
        &func,
        &base,
        &scale,
        &norm_w,
        &mut ws,
        &mut mix,
        &mut y,
        Some(&mut yq),
        with_codes.then_some(HcCodes {
            codes: &mut codes,
            scales: &mut scales,
        }),
        fused_post,
    )
    .expect("hc_pre");
    Out {
        x: download(g, &x),
        mix: download(g, &mix),
        y: download(g, &y),
        yq: download(g, &yq),
        codes: with_codes.then(|| (download(g, &codes), download(g, &scales))),
    }
}

fn same_bits(a: &[bf16], b: &[bf16]) -> bool {
    a.iter().zip(b).all(|(u, v)| u.to_bits() == v.to_bits())
}

/// Elements of `got` more than `ulps` bf16 ulps (at most 2^-7 relative each; below 1e-3 as at 1e-3) from
/// `want`, or not finite.
fn beyond_ulps(got: &[bf16], want: &[f32], ulps: f32) -> usize {
    got.iter()
        .zip(want)
        .filter(|(a, b)| {
            let a = a.to_f32();
            !a.is_finite() || (a - *b).abs() > ulps * b.abs().max(1e-3) / 128.0
        })
        .count()
}

/// Checks one case's GPU outputs against the CPU reference of HCPost (if any) then HCPre.
fn check_reference(c: &Case, post: Option<bool>, got: &Out, what: &str) {
    let mut x = c.x.clone();
    if let Some(moe) = post {
        hc_post(&mut x, &c.mix, &c.f_ref(moe), c.d);
    }
    // HCPre from the GPU's streams: a 1-ulp difference of the HCPost (allowed below) would move the mixes
    // by ~1e-4 and y by more than its rounding, which says nothing about the HCPre.
    let want = hc_pre(&c.reference(), &got.x, c.d);
    // HCPost: one rounding to bf16 of a 5-term sum (the GPU fuses multiply-adds): at most 1 ulp apart.
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let bad_x = beyond_ulps(&got.x, &xf, 1.0);
    // y: the mixer dots are summed in another order (f32), so pre and the norm scale differ in their last
    // bits; the collapse is rounded to bf16 before the norm, which can then move one ulp, and the
    // store another.
    let bad_y = beyond_ulps(&got.y, &want.y, 2.0);
    let mix_err = if c.m == 4 {
        0.0
    } else {
        // The kernel writes post[4] and comb[16] of each row's 24.
        let got20 = got.mix.chunks(HC_MIX).flat_map(|row| &row[..20]);
        got20
            .zip(&want.mix)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
    };
    println!(
        "{what} rows={} d={} m={}: x {bad_x} beyond 1 ulp, y {bad_y} beyond 2 ulps, mix max err {mix_err:.2e}",
        c.rows, c.d, c.m
    );
    assert_eq!(bad_x, 0, "{what}: streams after HCPost");
    assert_eq!(bad_y, 0, "{what}: normalised output");
    assert!(mix_err < 1e-4, "{what}: mix");
}

#[test]
fn hc_pre_fused_post_matches_unfused_and_reference() {
    let Some(g) = gpu() else { return };
    for (i, &(rows, d)) in SHAPES.iter().enumerate() {
        for head in [false, true] {
            let c = Case::new(900 + i as u64 * 2 + u64::from(head), rows, d, head);
            let plain = run(&g, &c, None, false, false);
            check_reference(&c, None, &plain, "hc_pre");
            for moe in [false, true] {
                let unfused = run(&g, &c, Some(moe), false, false);
                let fused = run(&g, &c, Some(moe), true, false);
                let what = if moe {
                    "post(moe)+pre"
                } else {
                    "post(bf16)+pre"
                };
                check_reference(&c, Some(moe), &fused, what);
                assert!(
                    same_bits(&fused.x, &unfused.x),
                    "{what}: fused streams differ"
                );
                assert!(same_bits(&fused.y, &unfused.y), "{what}: fused y differs");
                assert!(
                    same_bits(&fused.yq, &unfused.yq),
                    "{what}: fused yq differs"
                );
                let mix_same = fused
                    .mix
                    .iter()
                    .zip(&unfused.mix)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(mix_same, "{what}: fused mix differs");
            }
        }
    }
}

/// A row's HCPre (with and without a fused HCPost, block mixer and HC head) gives the same bits whatever the
/// batch it runs in: every mix split and row blocking the launcher picks by the row count sums the same
/// expressions (mhc.cu, mhc_dot4), so a token's numerics do not depend on who else is in the step.
#[test]
fn hc_pre_gives_a_row_the_same_bits_at_every_batch() {
    let Some(g) = gpu() else { return };
    for head in [false, true] {
        let full = Case::new(990 + u64::from(head), 64, 1000, head);
        for post in [None, Some(true), Some(false)] {
            let all = run(&g, &full, post, post.is_some(), false);
            for n in [1, 2, 3, 5, 8, 17, 33, 63] {
                let part = run(&g, &full.first_rows(n), post, post.is_some(), false);
                let what = format!("head {head} post {post:?}: {n} rows against 64");
                let (d, nd) = (full.d, 4 * full.d);
                assert!(same_bits(&part.y, &all.y[..n * d]), "{what}: y differs");
                assert!(same_bits(&part.yq, &all.yq[..n * d]), "{what}: yq differs");
                assert!(
                    same_bits(&part.x, &all.x[..n * nd]),
                    "{what}: streams differ"
                );
                let mix_same = part.mix[..n * HC_MIX]
                    .iter()
                    .zip(&all.mix)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(mix_same, "{what}: mix differs");
            }
        }
    }
}

/// attn_row_prep's x quant (FP8 blocks of 128) of `y` `[rows, d]`.
fn row_prep_quant(g: &GpuContext, y: &[bf16], rows: usize, d: usize) -> Vec<bf16> {
    let s = &g.stream;
    let x = upload(g, y);
    let mut out = upload(g, &vec![bf16::NAN; rows * d]);
    let p = AttnRowPrep {
        x: x.device_ptr(s).0,
        out: out.device_ptr_mut(s).0,
        groups: 1,
        rows: rows as i32,
        width: d as i32,
        quant_blk: 128,
        ..Default::default()
    };
    // SAFETY: x holds rows x d bf16, out rows x d; no norm.
    unsafe { g.launch_attn_row_prep(s, &p) }.expect("row prep");
    download(g, &out)
}

#[test]
fn hc_pre_attention_quant_matches_row_prep() {
    let Some(g) = gpu() else { return };
    for (i, &(rows, d)) in SHAPES.iter().enumerate() {
        let c = Case::new(950 + i as u64, rows, d, false);
        let got = run(&g, &c, Some(true), true, true);
        let want = row_prep_quant(&g, &got.y, rows, d);
        // The CPU reference too: act_quant per row (blocks of 128, a shorter last block).
        let cpu: Vec<bf16> = got
            .y
            .chunks(d)
            .flat_map(|row| dsv4_kernels::reference::act_quant(row, 128).deq)
            .collect();
        let exact = same_bits(&got.yq, &want) && same_bits(&got.yq, &cpu);
        println!(
            "attn quant rows={rows} d={d}: bit-exact with attn_row_prep and act_quant: {exact}"
        );
        assert!(
            exact,
            "rows {rows} d {d}: FP8 copy differs from attn_row_prep"
        );
    }
}

/// The e4m3 codes and scales an HCPre writes beside yq (D % 128 == 0) are yq's: code * scale = yq bit for bit,
/// and each scale is act_quant's for its block of the fake quantisation's source (y's bf16 values for the
/// attention's copy, the f32 normalised values for the FFN's), at one row, decode batches and the many-row kernels.
#[test]
fn hc_pre_codes_are_the_fake_quantised_output() {
    let Some(g) = gpu() else { return };
    let shapes = [
        (1usize, 4096usize),
        (3, 256),
        (17, 1152),
        (64, 4096),
        (300, 4096),
    ];
    for (i, &(rows, d)) in shapes.iter().enumerate() {
        let c = Case::new(970 + i as u64, rows, d, false);
        for yq_bf16 in [true, false] {
            for (post, fused) in [(None, false), (Some(true), true)] {
                let got = run(&g, &c, post, fused, yq_bf16);
                let (codes, scales) = got.codes.as_ref().expect("codes at D % 128 == 0");
                let deq: Vec<bf16> = codes
                    .iter()
                    .enumerate()
                    .map(|(j, &q)| bf16::from_f32(e4m3_to_f32(q) * scales[j / 128]))
                    .collect();
                let what = format!("rows {rows} d {d} yq_bf16 {yq_bf16} post {post:?}");
                assert!(
                    same_bits(&deq, &got.yq),
                    "{what}: code * scale differs from yq"
                );
                if yq_bf16 {
                    let want: Vec<f32> = got
                        .y
                        .chunks(d)
                        .flat_map(|row| dsv4_kernels::reference::act_quant(row, 128).scales)
                        .collect();
                    let same = want
                        .iter()
                        .zip(scales)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{what}: scales differ from act_quant's");
                }
                let pow2 = scales.iter().all(|s| s.to_bits() & 0x007f_ffff == 0);
                assert!(pow2, "{what}: a scale is not a power of two");
                println!("{what}: codes x scales = yq, bit for bit");
            }
        }
    }
}
