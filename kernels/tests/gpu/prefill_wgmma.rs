//! The Hopper prefill GEMMs (prefill_wgmma.cu, prefill_wgmma_ws.cu) after pf_fp8_to_bf16 (the engine's path:
//! random bf16 x, FP8 weights) against the CPU reference `fp8_gemv`, with the pf_gemm tests' tolerance, on rows
//! not a multiple of 128, N tails, K tails, several groups, bf16 output and more tiles than SMs. SKIP off sm_90a
//! fatbin builds.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::{PfDequant, PfWgmma, PF_WGMMA_VARIANTS};
use dsv4_kernels::{bf16, reference, GpuContext};
use rand::rngs::StdRng;

use crate::common::*;
use crate::prefill_gemm::{bound_ratio, bytemuck_u16, dp, fp8_values, sum_abs};

/// The context when it can run the wgmma kernels, else None after printing SKIP.
pub fn wgmma_gpu() -> Option<GpuContext> {
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

struct Group {
    n: usize,
    w: Vec<u8>,
    s: Vec<u8>,
    dw: CudaSlice<u8>,
    ds: CudaSlice<u8>,
    /// The weights dequantised by pf_fp8_to_bf16.
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

/// What every group of one case shares: the bf16 x, its device address, the shape and the output type.
struct Shared<'a> {
    x: &'a [bf16],
    dx: u64,
    m: usize,
    k: usize,
    bf16_out: bool,
}

/// Per group: the reference output and sum |x w| (the bound's scale).
fn references(c: &Shared<'_>, groups: &[Group]) -> Vec<(Vec<f32>, Vec<f32>)> {
    groups
        .iter()
        .map(|gr| {
            let want = reference::fp8_gemv(c.x, &gr.w, &gr.s, c.m, gr.n, c.k);
            let absum = sum_abs(c.x, &fp8_values(&gr.w, &gr.s, gr.n, c.k), c.m, gr.n, c.k);
            (want, absum)
        })
        .collect()
}

/// Runs `variant` over the groups sharing x and returns, per group, the worst error / bound against the
/// reference `refs`, where, and rel_l2.
fn run(
    g: &GpuContext,
    variant: usize,
    c: &Shared<'_>,
    groups: &mut [Group],
    refs: &[(Vec<f32>, Vec<f32>)],
) -> Vec<(f32, usize, f64)> {
    let (dx, m, k, bf16_out) = (c.dx, c.m, c.k, c.bf16_out);
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
        p.x[i] = dx;
        p.w[i] = dp(g, gr.wbf.as_ref().expect("dequantised weights"));
        p.out[i] = dp(g, &gr.out);
        p.n[i] = gr.n as i32;
    }
    // SAFETY: x holds m*k bf16, every group's w its n*k dequantised bf16 weights, out m*n f32 (bf16 output
    // uses the first half).
    unsafe { g.launch_pf_wgmma(&g.stream, variant, groups.len(), &p) }.expect("launch");
    groups
        .iter()
        .zip(refs)
        .map(|(gr, (want, absum))| {
            let raw = download(g, &gr.out);
            let got: Vec<f32> = if bf16_out {
                bytemuck_u16(&raw)[..m * gr.n]
                    .iter()
                    .map(|&b| bf16::from_bits(b).to_f32())
                    .collect()
            } else {
                raw
            };
            let (worst, at) = bound_ratio(&got, want, absum, bf16_out);
            (worst, at, rel_l2(&got, want))
        })
        .collect()
}

/// Prints every variant's result for one case; returns the failures.
fn report(g: &GpuContext, name: &str, c: &Shared<'_>, groups: &mut [Group]) -> Vec<String> {
    let (m, k, bf16_out) = (c.m, c.k, c.bf16_out);
    let refs = references(c, groups);
    let mut bad = Vec::new();
    for (v, var) in PF_WGMMA_VARIANTS.iter().enumerate() {
        if !g.kernels.prefill.wgmma_fits[v] {
            continue;
        }
        for (gi, (worst, at, l2)) in run(g, v, c, groups, &refs).into_iter().enumerate() {
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

/// (m, n per group, k, bf16 output): one row, N / K tails, K below one 128-block, 8 groups, bf16 output (odd
/// N: unpaired stores). The last two give pf_wgmma_bf16_ws more 128 x 256 tiles than an H200 has SMs, so its
/// persistent blocks take several tiles each with the ring's stage and phase running on across them (K of 3
/// blocks against 4 stages), over full and partial super-columns of n tiles (n 4100: 17 tiles of 256).
const CASES: [(usize, &[usize], usize, bool); 10] = [
    (1, &[130], 64, false),
    (3, &[300, 17], 1040, false),
    (77, &[129], 272, false),
    (130, &[256, 512, 8], 32, false),
    (257, &[1000], 1024, false),
    (200, &[384, 128], 4096, false),
    (300, &[96, 200, 64, 8, 136, 257, 1, 128], 512, false),
    (33, &[200], 256, true),
    (1000, &[4100, 300], 144, false),
    (1100, &[4097, 301], 80, true),
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
        let mut groups: Vec<Group> = ns.iter().map(|&n| group(&g, r, m, n, k)).collect();
        dequant(&g, &mut groups, k);
        let dx = dp(&g, &dx);
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
