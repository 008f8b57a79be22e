//! The Hopper FP8 prefill GEMM (pf_wgmma_fp8_*, wgmma e4m3) against the CPU reference `fp8_gemv` on the
//! bf16 activations it stands for (e4m3 code x f32 power-of-two scale, exact in bf16), with the pf_gemm tests'
//! tolerance: rows not a multiple of 128, N tails, K tails, several groups, bf16 output, and the engine's
//! path (act_quant_bf16 on the GPU of an already fake-quantised x). SKIP off sm_90a fatbin builds.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::{PfWgmma, PF_WGMMA_VARIANTS};
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
        w,
        s,
    }
}

/// Runs `variant` over the groups sharing x (device codes `dq`, scales `dsc`) and returns, per group, the
/// worst error / bound against the reference.
#[allow(clippy::too_many_arguments)]
fn run(
    g: &GpuContext,
    variant: usize,
    x: &[bf16],
    dq: &CudaSlice<u8>,
    dsc: &CudaSlice<f32>,
    groups: &mut [Group],
    m: usize,
    k: usize,
    bf16_out: bool,
) -> Vec<(f32, usize, f64)> {
    let mut p = PfWgmma {
        m: m as i32,
        k: k as i32,
        out_bf16: i32::from(bf16_out),
        ..Default::default()
    };
    for (i, gr) in groups.iter_mut().enumerate() {
        g.stream.memcpy_htod(&vec![f32::NAN; m * gr.n], &mut gr.out).expect("reset");
        (p.xq[i], p.xs[i], p.w[i], p.s[i]) = (dp(g, dq), dp(g, dsc), dp(g, &gr.dw), dp(g, &gr.ds));
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
#[allow(clippy::too_many_arguments)]
fn report(
    g: &GpuContext,
    name: &str,
    x: &[bf16],
    dq: &CudaSlice<u8>,
    dsc: &CudaSlice<f32>,
    groups: &mut [Group],
    m: usize,
    k: usize,
    bf16_out: bool,
) -> Vec<String> {
    let mut bad = Vec::new();
    for (v, (stages, promote)) in PF_WGMMA_VARIANTS.iter().enumerate() {
        if !g.kernels.prefill.wgmma_fits[v] {
            continue;
        }
        for (gi, (worst, at, l2)) in run(g, v, x, dq, dsc, groups, m, k, bf16_out)
            .into_iter()
            .enumerate()
        {
            let line = format!(
                "pf_wgmma s{stages} k{promote} {name} m {m} n {} k {k} group {gi} bf16_out {bf16_out}: \
                 rel_l2 {l2:.2e}, worst/bound {worst:.3} at {at}",
                groups[gi].n
            );
            println!("{line}");
            if worst > 1.0 {
                bad.push(line);
            }
        }
    }
    bad
}

#[test]
fn pf_wgmma_matches_reference() {
    let Some(g) = wgmma_gpu() else { return };
    let cases: [(usize, &[usize], usize, bool); 8] = [
        (1, &[130], 128, false),
        (3, &[300, 17], 1040, false),
        (77, &[129], 272, false),
        (130, &[256, 512, 8], 32, false),
        (257, &[1000], 1024, false),
        (200, &[384, 128], 4096, false),
        (300, &[96, 200, 64, 8, 136, 257, 1, 128], 512, false),
        (33, &[200], 256, true),
    ];
    let mut bad = Vec::new();
    for (i, &(m, ns, k, bf16_out)) in cases.iter().enumerate() {
        let mut r = rng(70 + i as u64);
        let a = rand_acts(&mut r, m, k);
        let (dq, dsc) = (upload(&g, &a.q), upload(&g, &a.s));
        let mut groups: Vec<Group> = ns.iter().map(|&n| group(&g, &mut r, m, n, k)).collect();
        bad.extend(report(
            &g,
            "codes",
            &a.x,
            &dq,
            &dsc,
            &mut groups,
            m,
            k,
            bf16_out,
        ));
    }
    assert!(bad.is_empty(), "over the bound:\n{}", bad.join("\n"));
}

/// The engine's path: x already fake-quantised in bf16 (act_quant deq), re-quantised on the GPU by
/// act_quant_bf16 into codes + scales, then the GEMM.
#[test]
fn pf_wgmma_after_act_quant_matches_reference() {
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
        bad.extend(report(
            &g,
            "act_quant",
            &x,
            &dq,
            &dsc,
            &mut groups,
            m,
            k,
            false,
        ));
    }
    assert!(bad.is_empty(), "over the bound:\n{}", bad.join("\n"));
}
