//! The Hopper prefill GEMMs (prefill_wgmma.cu) against the CPU reference `fp8_gemv`, with the pf_gemm tests'
//! tolerance, on rows not a multiple of 128, N tails, K tails, several groups and bf16 output:
//! - bf16 variants after pf_fp8_to_bf16 (the engine's path): random bf16 x, FP8 weights;
//! - the FP8 variant (e4m3 x e4m3) on the bf16 activations it stands for (code x power-of-two scale, exact in
//!   bf16), also after act_quant_bf16 on the GPU. Ignored: Hopper's FP8 accumulation misses the tolerance
//!   (kernels/BENCH_NOTES.md "Prefill wgmma"); `--ignored` prints how far.
//!
//! SKIP off sm_90a fatbin builds.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::{PfDequant, PfWgmma, PF_WGMMA_VARIANTS};
use dsv4_kernels::{bf16, reference, GpuContext};
use rand::rngs::StdRng;

use crate::common::*;
use crate::prefill_gemm::{bound_ratio, bytemuck_u16, dp, fp8_values, sum_abs};

/// The context when it can run the wgmma kernels, else None after printing SKIP.
fn wgmma_gpu() -> Option<GpuContext> {
    let g = gpu()?;
    if !g.has_wgmma() {
        eprintln!(
            "SKIP: pf_wgmma needs cc 9.0 and the nvcc fatbin (cc {:?}, {:?})",
            g.info.cc, g.source
        );
        return None;
    }
    Some(g)
}

/// Activations as the GEMM reads them: e4m3 codes [m, k], f32 scales [m, ceil(k/128)], and the bf16 values
/// code * scale (exact) the reference multiplies.
struct Acts {
    q: Vec<u8>,
    s: Vec<f32>,
    x: Vec<bf16>,
}

/// Random codes (every finite e4m3, subnormals too) with scales 2^-8 .. 2^4 per (row, 128-block).
fn rand_acts(r: &mut StdRng, m: usize, k: usize) -> Acts {
    let kb = k.div_ceil(128);
    let q = rand_e4m3(r, m * k);
    let s: Vec<f32> = rand_exponents(r, m * kb, 119, 131)
        .into_iter()
        .map(reference::formats::ue8m0)
        .collect();
    let x = (0..m * k)
        .map(|i| {
            let v = reference::formats::e4m3_to_f32(q[i]) * s[(i / k) * kb + (i % k) / 128];
            bf16::from_f32(v)
        })
        .collect();
    Acts { q, s, x }
}

struct Group {
    n: usize,
    w: Vec<u8>,
    s: Vec<u8>,
    dw: CudaSlice<u8>,
    ds: CudaSlice<u8>,
    /// The weights dequantised by pf_fp8_to_bf16 (bf16 variants).
    wbf: Option<CudaSlice<u16>>,
    out: CudaSlice<f32>,
}

fn group(g: &GpuContext, r: &mut StdRng, m: usize, n: usize, k: usize) -> Group {
    let w = rand_e4m3(r, n * k);
    let s = rand_exponents(r, n.div_ceil(128) * k.div_ceil(128), 100, 134);
    Group {
        n,
        dw: upload(g, &w),
        ds: upload(g, &s),
        out: upload(g, &vec![f32::NAN; m * n]),
        wbf: None,
        w,
        s,
    }
}

/// Dequantises every group's weights with one pf_fp8_to_bf16 launch.
fn dequant(g: &GpuContext, groups: &mut [Group], k: usize) {
    let mut p = PfDequant {
        k: k as i32,
        ..Default::default()
    };
    for (i, gr) in groups.iter_mut().enumerate() {
        let wbf: CudaSlice<u16> = upload(g, &vec![0xffffu16; gr.n * k]);
        (p.w[i], p.s[i], p.out[i], p.n[i]) =
            (dp(g, &gr.dw), dp(g, &gr.ds), dp(g, &wbf), gr.n as i32);
        gr.wbf = Some(wbf);
    }
    // SAFETY: each group's dw / ds hold n*k e4m3 bytes and their scales, wbf n*k bf16.
    unsafe { g.launch_pf_fp8_to_bf16(&g.stream, groups.len(), &p) }.expect("dequant");
}

/// What every group of one case shares: the bf16 x the reference multiplies, the device addresses of what
/// the kernel reads for it (x, and for FP8 its scales), the shape and the output type.
struct Shared<'a> {
    x: &'a [bf16],
    dx: (u64, u64),
    m: usize,
    k: usize,
    bf16_out: bool,
}

/// Runs `variant` over the groups sharing x and returns, per group, the worst error / bound against the
/// reference, where, and rel_l2.
fn run(
    g: &GpuContext,
    variant: usize,
    c: &Shared<'_>,
    groups: &mut [Group],
) -> Vec<(f32, usize, f64)> {
    let (x, dx, m, k, bf16_out) = (c.x, c.dx, c.m, c.k, c.bf16_out);
    let mut p = PfWgmma {
        m: m as i32,
        k: k as i32,
        out_bf16: i32::from(bf16_out),
        ..Default::default()
    };
    for (i, gr) in groups.iter_mut().enumerate() {
        g.stream
            .memcpy_htod(&vec![f32::NAN; m * gr.n], &mut gr.out)
            .expect("reset");
        (p.x[i], p.xs[i], p.s[i]) = (dx.0, dx.1, dp(g, &gr.ds));
        p.w[i] = match &gr.wbf {
            Some(b) => dp(g, b),
            None => dp(g, &gr.dw),
        };
        p.out[i] = dp(g, &gr.out);
        p.n[i] = gr.n as i32;
    }
    // SAFETY: every group's x codes hold m*k bytes with m*ceil(k/128) scales, w/s the n*k weights and
    // their scales, out m*n f32 (bf16 output uses the first half).
    unsafe { g.launch_pf_wgmma(&g.stream, variant, groups.len(), &p) }.expect("launch");
    groups
        .iter()
        .map(|gr| {
            let raw = download(g, &gr.out);
            let got: Vec<f32> = if bf16_out {
                bytemuck_u16(&raw)[..m * gr.n]
                    .iter()
                    .map(|&b| bf16::from_bits(b).to_f32())
                    .collect()
            } else {
                raw
            };
            let want = reference::fp8_gemv(x, &gr.w, &gr.s, m, gr.n, k);
            let absum = sum_abs(x, &fp8_values(&gr.w, &gr.s, gr.n, k), m, gr.n, k);
            let (worst, at) = bound_ratio(&got, &want, &absum, bf16_out);
            (worst, at, rel_l2(&got, &want))
        })
        .collect()
}

/// Prints every variant's result for one case; returns the failures.
fn report(g: &GpuContext, name: &str, c: &Shared<'_>, groups: &mut [Group]) -> Vec<String> {
    let (m, k, bf16_out) = (c.m, c.k, c.bf16_out);
    let fp8 = groups[0].wbf.is_none();
    let mut bad = Vec::new();
    for (v, var) in PF_WGMMA_VARIANTS.iter().enumerate() {
        if !g.kernels.prefill.wgmma_fits[v] || var.fp8 != fp8 {
            continue;
        }
        for (gi, (worst, at, l2)) in run(g, v, c, groups).into_iter().enumerate() {
            let line = format!(
                "{} {name} m {m} n {} k {k} group {gi} bf16_out {bf16_out}: \
                 rel_l2 {l2:.2e}, worst/bound {worst:.3} at {at}",
                var.name, groups[gi].n
            );
            println!("{line}");
            if worst > 1.0 {
                bad.push(line);
            }
        }
    }
    bad
}

/// (m, n per group, k, bf16 output): one row, N / K tails, K below one 128-block, 8 groups, bf16 output.
const CASES: [(usize, &[usize], usize, bool); 8] = [
    (1, &[130], 64, false),
    (3, &[300, 17], 1040, false),
    (77, &[129], 272, false),
    (130, &[256, 512, 8], 32, false),
    (257, &[1000], 1024, false),
    (200, &[384, 128], 4096, false),
    (300, &[96, 200, 64, 8, 136, 257, 1, 128], 512, false),
    (33, &[200], 256, true),
];

/// Runs `case` on every CASES entry (its own seed from `seed`) and asserts no variant went over the bound.
fn each_case(
    seed: u64,
    mut case: impl FnMut(&mut StdRng, usize, &[usize], usize, bool) -> Vec<String>,
) {
    let mut bad = Vec::new();
    for (i, &(m, ns, k, bf16_out)) in CASES.iter().enumerate() {
        bad.extend(case(&mut rng(seed + i as u64), m, ns, k, bf16_out));
    }
    assert!(bad.is_empty(), "over the bound:\n{}", bad.join("\n"));
}

#[test]
fn pf_wgmma_bf16_matches_reference() {
    let Some(g) = wgmma_gpu() else { return };
    each_case(50, |r, m, ns, k, bf16_out| {
        let x = rand_bf16(r, m * k);
        let dx = upload(&g, &x);
        let none: CudaSlice<f32> = upload(&g, &[0f32]);
        let mut groups: Vec<Group> = ns.iter().map(|&n| group(&g, r, m, n, k)).collect();
        dequant(&g, &mut groups, k);
        let dx = (dp(&g, &dx), dp(&g, &none));
        let c = Shared {
            x: &x,
            dx,
            m,
            k,
            bf16_out,
        };
        report(&g, "bf16", &c, &mut groups)
    });
}

#[test]
#[ignore = "Hopper FP8 wgmma accumulation misses the pf_gemm tolerance (BENCH_NOTES Prefill wgmma)"]
fn pf_wgmma_fp8_matches_reference() {
    let Some(g) = wgmma_gpu() else { return };
    each_case(70, |r, m, ns, k, bf16_out| {
        let a = rand_acts(r, m, k);
        let (dq, dsc) = (upload(&g, &a.q), upload(&g, &a.s));
        let mut groups: Vec<Group> = ns.iter().map(|&n| group(&g, r, m, n, k)).collect();
        let c = Shared {
            x: &a.x,
            dx: (dp(&g, &dq), dp(&g, &dsc)),
            m,
            k,
            bf16_out,
        };
        report(&g, "codes", &c, &mut groups)
    });
}

/// The engine's path: x already fake-quantised in bf16 (act_quant deq), re-quantised on the GPU by
/// act_quant_bf16 into codes + scales, then the GEMM.
#[test]
#[ignore = "Hopper FP8 wgmma accumulation misses the pf_gemm tolerance (BENCH_NOTES Prefill wgmma)"]
fn pf_wgmma_fp8_after_act_quant_matches_reference() {
    let Some(g) = wgmma_gpu() else { return };
    let mut bad = Vec::new();
    for (i, &(m, n, k)) in [(129usize, 520usize, 1024usize), (64, 256, 4096)]
        .iter()
        .enumerate()
    {
        let mut r = rng(90 + i as u64);
        let x = reference::act_quant(&rand_bf16(&mut r, m * k), 128).deq;
        let dx = upload(&g, &x);
        let mut dq: CudaSlice<u8> = upload(&g, &vec![0u8; m * k]);
        let mut dsc: CudaSlice<f32> = upload(&g, &vec![0f32; m * k / 128]);
        g.launch_act_quant(&g.stream, m, k, 128, &dx, &mut dq, &mut dsc)
            .expect("act_quant");
        let mut groups = vec![group(&g, &mut r, m, n, k)];
        let c = Shared {
            x: &x,
            dx: (dp(&g, &dq), dp(&g, &dsc)),
            m,
            k,
            bf16_out: false,
        };
        bad.extend(report(&g, "act_quant", &c, &mut groups));
    }
    assert!(bad.is_empty(), "over the bound:\n{}", bad.join("\n"));
}
