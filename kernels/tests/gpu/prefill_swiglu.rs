//! pf_swiglu_kperm (prefill_swiglu.cu) against the two launches it replaces (moe_swiglu, then pf_kperm of its
//! output) bit for bit, and against the CPU reference (`reference::prefill::swiglu`, then `kperm`). Awkward
//! shapes: 1 .. 1001 slots (none a multiple of the warp's 4 chunks or the block's 32), inter 32 .. 4096 with
//! tails (inter % 128 = 32, 96), both numerics, with and without per-slot weights and the clamp, values where
//! silu saturates, zeros, rows scaled over 2^-12 .. 2^8 (e4m3 subnormals inside a block) and rows of f32-subnormal
//! values.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::{PfKperm, PfSwiglu};
use dsv4_kernels::{bf16, pf_kperm_cols, reference, GpuContext};
use rand::Rng;

use crate::common::*;
use crate::prefill_gemm::dp;

/// One case: slots, inter, swiglu limit (0: none), FP8 fake quantisation, per-slot weights.
#[derive(Debug, Clone, Copy)]
struct Case {
    slots: usize,
    inter: usize,
    limit: f32,
    quant: bool,
    weighted: bool,
}

/// g and u [slots, inter]: uniform in [-12, 12], every 17th g at +-30 or +-100, every 29th u zero, each row's
/// u scaled by its own power of two; weights in [0.01, 3].
fn inputs(r: &mut rand::rngs::StdRng, c: &Case) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = c.slots * c.inter;
    let mut g: Vec<f32> = (0..n).map(|_| r.random_range(-12.0f32..12.0)).collect();
    let mut u: Vec<f32> = (0..n).map(|_| r.random_range(-12.0f32..12.0)).collect();
    for (i, v) in g.iter_mut().enumerate().filter(|(i, _)| i % 17 == 3) {
        *v = [30.0, -30.0, 100.0, -100.0][i % 4];
    }
    for (i, row) in u.chunks_mut(c.inter).enumerate() {
        // Every 5th row's h is f32-subnormal (bf16 subnormals in reference numerics).
        let f = 2f32.powi(if i % 5 == 4 {
            -136
        } else {
            r.random_range(-12..=8)
        });
        for (k, v) in row.iter_mut().enumerate() {
            *v = if (i + k) % 29 == 0 { 0.0 } else { *v * f };
        }
    }
    let wt = (0..c.slots).map(|_| r.random_range(0.01f32..3.0)).collect();
    (g, u, wt)
}

/// A case's inputs on the device: g, u and the weights (None: unweighted).
struct Inputs<'a> {
    g: &'a CudaSlice<f32>,
    u: &'a CudaSlice<f32>,
    w: Option<&'a CudaSlice<f32>>,
}

fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// moe_swiglu then pf_kperm (the path the fused kernel replaces).
fn two_launches(gpu: &GpuContext, c: &Case, d: &Inputs<'_>) -> Vec<u16> {
    let mut h: CudaSlice<bf16> = upload(gpu, &vec![bf16::NAN; c.slots * c.inter]);
    gpu.launch_moe_swiglu(
        &gpu.stream,
        c.slots,
        c.inter,
        c.limit,
        c.quant,
        d.g,
        d.u,
        d.w,
        &mut h,
    )
    .expect("moe_swiglu");
    let hp: CudaSlice<bf16> = upload(gpu, &vec![bf16::NAN; c.slots * pf_kperm_cols(c.inter)]);
    let p = PfKperm {
        x: dp(gpu, &h),
        out: dp(gpu, &hp),
        rows: c.slots as i32,
        k: c.inter as i32,
    };
    // SAFETY: h holds slots x inter bf16, hp slots x pf_kperm_cols(inter).
    unsafe { gpu.launch_pf_kperm(&gpu.stream, &p) }.expect("pf_kperm");
    bits(&download(gpu, &hp))
}

/// The fused kernel.
fn fused(gpu: &GpuContext, c: &Case, d: &Inputs<'_>) -> Vec<u16> {
    let out: CudaSlice<bf16> = upload(gpu, &vec![bf16::NAN; c.slots * pf_kperm_cols(c.inter)]);
    let p = PfSwiglu {
        g: dp(gpu, d.g),
        u: dp(gpu, d.u),
        wt: d.w.map_or(0, |w| dp(gpu, w)),
        out: dp(gpu, &out),
        slots: c.slots as i32,
        inter: c.inter as i32,
        limit: c.limit,
        quant: i32::from(c.quant),
    };
    // SAFETY: g, u hold slots x inter f32, wt slots f32 (or none), out slots x pf_kperm_cols(inter) bf16.
    unsafe { gpu.launch_pf_swiglu_kperm(&gpu.stream, &p) }.expect("pf_swiglu_kperm");
    bits(&download(gpu, &out))
}

/// The GPU bits against the CPU reference: the zero padding exactly; each value within one rounding step of
/// its format (bf16: 2^-7 relative, 2^-133 among subnormals; e4m3: 2^-3 relative, or a subnormal step 2^-9 at twice the block scale, in
/// case the block maximum rounded across a power of two), and rounding flips (GPU expf vs the CPU's exp) rare.
fn check_cpu(c: &Case, got: &[u16], g: &[f32], u: &[f32], wt: Option<&[f32]>) {
    let r = reference::prefill::swiglu(g, u, wt, c.inter, c.limit, c.quant);
    let want = bits(&reference::prefill::kperm(&r.h, c.slots, c.inter));
    let kp = pf_kperm_cols(c.inter);
    let (mut flips, mut worst) = (0usize, 0f32);
    for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
        if a == b {
            continue;
        }
        let (slot, col) = (i / kp, i % kp);
        assert!(
            col < c.inter,
            "{c:?}: padding at slot {slot} col {col} is {a:#06x}"
        );
        let (x, y) = (bf16::from_bits(a).to_f32(), bf16::from_bits(b).to_f32());
        let bound = if c.quant {
            let s = r.scales[slot * kp / 128 + col / 128];
            0.125 * x.abs().max(y.abs()) + 2.0 * s * 2f32.powi(-9)
        } else {
            2f32.powi(-7) * x.abs().max(y.abs()) + 2f32.powi(-133)
        };
        assert!(x.is_finite(), "{c:?}: element {i} is {x}");
        worst = worst.max((x - y).abs() / bound);
        flips += 1;
    }
    assert!(worst <= 1.0, "{c:?}: worst error / bound {worst}");
    assert!(
        flips * 1000 <= got.len(),
        "{c:?}: {flips} of {} values differ from the CPU",
        got.len()
    );
    if flips > 0 {
        eprintln!("{c:?}: {flips} rounding flips against the CPU, worst / bound {worst:.3}");
    }
}

#[test]
fn pf_swiglu_kperm_matches_the_two_launches_and_reference() {
    let Some(gpu) = gpu() else { return };
    let shapes = [
        (1, 32),
        (7, 96),
        (37, 160),
        (333, 544),
        (129, 2080),
        (1001, 2048),
        (5, 4096),
    ];
    let mut seed = 7000;
    for (slots, inter) in shapes {
        for (quant, weighted) in [(false, false), (false, true), (true, false), (true, true)] {
            seed += 1;
            let c = Case {
                slots,
                inter,
                limit: if seed % 2 == 0 { 7.0 } else { 0.0 },
                quant,
                weighted,
            };
            let mut r = rng(seed);
            let (g, u, wt) = inputs(&mut r, &c);
            let (dg, du, dw) = (upload(&gpu, &g), upload(&gpu, &u), upload(&gpu, &wt));
            let d = Inputs {
                g: &dg,
                u: &du,
                w: c.weighted.then_some(&dw),
            };
            let want = two_launches(&gpu, &c, &d);
            let got = fused(&gpu, &c, &d);
            let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert!(
                differ == 0,
                "{c:?}: {differ} values differ from moe_swiglu + pf_kperm"
            );
            check_cpu(&c, &got, &g, &u, c.weighted.then_some(&wt[..]));
        }
    }
}
