use dsv4_kernels::reference;
use dsv4_kernels::{
    gemv_cnt_len, gemv_ws_len, GemvParams, GemvQ8X, GpuContext, Q8Kernel, FP8X_MAX_ROWS,
    GEMV_Q8_BLOCK, GEMV_ROW_TILE,
};

use dsv4_kernels::bf16;
use dsv4_kernels::reference::formats::{e4m3_to_f32, f32_to_e4m3};
use rand::rngs::StdRng;
use rand::Rng;

use crate::common::*;

/// (batch, rows of each group, K): one to three groups of unequal rows (N not a multiple of 128 or 32), K from
/// one block to the model's 8192, a batch in every 8-column bucket (1, 2, 3-4 and 5-8 tiles of 8), partial
/// 8-column tiles at 1, 5 and 8 rows.
const SHAPES: [(usize, &[usize], usize); 10] = [
    (1, &[300], 1024),
    (5, &[33, 4100], 640),
    (8, &[2000, 31], 8192),
    (9, &[77, 200], 128),
    (16, &[1100], 1152),
    (17, &[129], 2048),
    (33, &[1000, 129, 64], 4096),
    (57, &[200], 8192),
    (64, &[640, 1536], 1024),
    (40, &[4096], 384),
];

/// The error bound of one output: 2^-9 * sum |x * w| plus half a bf16 ulp for a bf16 output. Hopper's FP8
/// tensor-core sums are not IEEE f32 (DeepSeek-V3 3.3.2: about 14 bits kept inside the MMA, hence its promotion
/// to f32 every 128 products, which this kernel and the official runtime's FP8 GEMM do): on these inputs the H200
/// gave errors up to 2^-10.9 of that sum (a 2^-12 bound failed at 2.2x). The exact-input cases check every
/// index, scale and split bit for bit; a wrong block or column costs O(sum / sqrt(128)), far above this bound.
fn bound(want: f32, absum: f32, bf16_out: bool) -> f32 {
    let rnd = if bf16_out {
        want.abs() * 2f32.powi(-8)
    } else {
        0.0
    };
    absum * 2f32.powi(-9) + rnd + 1e-30
}

/// Random inputs: x act_quant'ed from random bf16, random e4m3 weights over every code, block scales 2^-17..2^7.
fn random_inputs(r: &mut StdRng, b: usize, ns: &[usize], k: usize) -> Inputs {
    let x = rand_bf16(r, b * k);
    let weights = ns
        .iter()
        .map(|&n| {
            let w = rand_e4m3(r, n * k);
            (w, rand_exponents(r, n.div_ceil(128) * k / 128, 110, 134))
        })
        .collect();
    Inputs {
        x: reference::act_quant(&x, GEMV_Q8_BLOCK),
        weights,
    }
}

/// Inputs whose sums are exact in any order and in the tensor core's FP8 sums: integer codes in [-4, 4] for x
/// and w, x scales 1 or 2, weight block scales 2^-3..2^3 (every partial sum an integer multiple of 2^-3 below
/// 2^16). The kernel must then match the reference bit for bit.
fn exact_inputs(r: &mut StdRng, b: usize, ns: &[usize], k: usize) -> Inputs {
    let code = |r: &mut StdRng| f32_to_e4m3(r.random_range(-4i32..=4) as f32);
    let q: Vec<u8> = (0..b * k).map(|_| code(r)).collect();
    let scales: Vec<f32> = (0..b * k / 128)
        .map(|_| f32::from(r.random_range(1u8..=2)))
        .collect();
    let deq = q
        .iter()
        .enumerate()
        .map(|(i, &c)| bf16::from_f32(e4m3_to_f32(c) * scales[i / 128]))
        .collect();
    let weights = ns
        .iter()
        .map(|&n| {
            let w = (0..n * k).map(|_| code(r)).collect();
            (w, rand_exponents(r, n.div_ceil(128) * k / 128, 124, 130))
        })
        .collect();
    Inputs {
        x: reference::ActQuant { q, scales, deq },
        weights,
    }
}

/// x (codes, scales and their exact bf16 values) and each group's weights and block scales.
struct Inputs {
    x: reference::ActQuant,
    weights: Vec<(Vec<u8>, Vec<u8>)>,
}

/// One launch of the GEMV on `kernel` and `inp`, twice on the same scratch (the second relies on the counters
/// the first reset); each group's outputs as f32.
fn launch(
    g: &GpuContext,
    kernel: Q8Kernel,
    (b, ns, k): (usize, &[usize], usize),
    inp: &Inputs,
    (splits, bf16_out): (usize, bool),
) -> Vec<Vec<f32>> {
    let aq = &inp.x;
    let nmax = ns.iter().copied().max().unwrap_or(1);
    let (wl, cl) = (
        gemv_ws_len(ns.len(), splits, b, nmax),
        gemv_cnt_len(ns.len(), nmax),
    );
    let mut ws = upload(g, &vec![0f32; wl.max(1)]);
    let mut cnt = upload(g, &vec![0u32; cl.max(1)]);
    let (mut xq, mut xs) = (upload(g, &aq.q), upload(g, &aq.scales));
    let mut p = GemvParams {
        b: b as i32,
        k: k as i32,
        nmax: nmax as i32,
        out_bf16: i32::from(bf16_out),
        ..Default::default()
    };
    let mut q = GemvQ8X::default();
    let mut dev = Vec::new();
    for (i, &n) in ns.iter().enumerate() {
        let (w, s) = &inp.weights[i];
        let (dw, ds) = (upload(g, w), upload(g, s));
        let yf = upload(g, &vec![f32::NAN; b * n]);
        let yb = upload(g, &vec![dsv4_kernels::bf16::NAN; b * n]);
        (p.w[i], p.s[i], p.n[i]) = (dev_ptr(g, &dw), dev_ptr(g, &ds), n as i32);
        q.xq[i] = dev_ptr_mut(g, &mut xq);
        q.xs[i] = dev_ptr_mut(g, &mut xs);
        dev.push((dw, ds, yf, yb));
    }
    for (i, d) in dev.iter_mut().enumerate() {
        p.out[i] = if bf16_out {
            dev_ptr_mut(g, &mut d.3)
        } else {
            dev_ptr_mut(g, &mut d.2)
        };
    }
    (p.ws, p.cnt) = (dev_ptr_mut(g, &mut ws), dev_ptr_mut(g, &mut cnt));
    for _ in 0..2 {
        // SAFETY: xq / xs hold b*k codes and b*k/128 scales; each group's weights, scales and outputs hold
        // n*k, ceil(n/128)*k/128 and b*n elements; ws / cnt hold wl / cl.
        unsafe { g.launch_gemv_q8(&g.stream, kernel, (ns.len(), splits), &p, &q, wl, cl) }
            .expect("launch");
    }
    assert!(
        download(g, &cnt).iter().all(|&c| c == 0),
        "split-K counters left non-zero"
    );
    dev.iter()
        .map(|d| {
            if bf16_out {
                download(g, &d.3).iter().map(|v| v.to_f32()).collect()
            } else {
                download(g, &d.2)
            }
        })
        .collect()
}

/// [`launch`] against the f64 reference on x's exact values. Returns the worst error over its bound (0 when
/// `exact`: then every output must match bit for bit).
fn run_case(
    g: &GpuContext,
    kernel: Q8Kernel,
    (b, ns, k): (usize, &[usize], usize),
    inp: &Inputs,
    (splits, bf16_out, exact): (usize, bool, bool),
) -> f32 {
    let aq = &inp.x;
    let outs = launch(g, kernel, (b, ns, k), inp, (splits, bf16_out));
    let mut worst_all = 0f32;
    for (i, &n) in ns.iter().enumerate() {
        let (w, s) = &inp.weights[i];
        let want = reference::fp8_gemv(&aq.deq, w, s, b, n, k);
        let got = &outs[i];
        let what = format!(
            "{kernel:?} b={b} n={n} (group {i}) k={k} splits={splits} bf16_out={bf16_out} exact={exact}"
        );
        if exact {
            let want: Vec<f32> = if bf16_out {
                want.iter().map(|v| bf16::from_f32(*v).to_f32()).collect()
            } else {
                want
            };
            assert_same_bits(got, &want, &what);
            println!("{what}: same bits");
            continue;
        }
        let absum = reference::fp8_gemv_abs(&aq.deq, w, s, b, n, k);
        let (worst, at) = worst_ratio(got, &want, |j| bound(want[j], absum[j], bf16_out));
        println!(
            "{what}: rel_l2 {:.2e}, worst/bound {worst:.3} (element {at}: got {} want {}, sum|xw| {})",
            rel_l2(got, &want),
            got[at],
            want[at],
            absum[at]
        );
        worst_all = worst_all.max(worst);
    }
    worst_all
}

fn dev_ptr<T>(g: &GpuContext, b: &dsv4_kernels::cudarc::driver::CudaSlice<T>) -> u64 {
    use dsv4_kernels::cudarc::driver::DevicePtr;
    b.device_ptr(&g.stream).0
}

fn dev_ptr_mut<T>(g: &GpuContext, b: &mut dsv4_kernels::cudarc::driver::CudaSlice<T>) -> u64 {
    use dsv4_kernels::cudarc::driver::DevicePtrMut;
    b.device_ptr_mut(&g.stream).0
}

/// Most rows `kernel` takes.
fn max_rows(kernel: Q8Kernel) -> usize {
    match kernel {
        Q8Kernel::MmaSync => FP8X_MAX_ROWS,
        Q8Kernel::Wgmma => 64,
    }
}

/// The FP8-activation kernels that run on this device (none: the tests skip, saying why).
fn kernels_here(g: &GpuContext) -> Vec<Q8Kernel> {
    let mut v = Vec::new();
    if g.gemv_fp8x_runs() {
        v.push(Q8Kernel::MmaSync);
    }
    if g.wq8_ring(64).is_some() {
        v.push(Q8Kernel::Wgmma);
    } else {
        eprintln!(
            "SKIP (wgmma ring): gemv_wq8 runs only on sm_90a with the nvcc fatbin (this device: cc {:?})",
            g.info.cc
        );
    }
    if v.is_empty() {
        eprintln!("SKIP: no FP8-activation GEMV on cc {:?}", g.info.cc);
    }
    v
}

/// Both FP8-activation kernels on every shape at their planned split, one split and the most, both output
/// types.
#[test]
fn fp8_act_gemv_matches_reference() {
    let Some(g) = gpu() else { return };
    let sms = g.info.sm_count as usize;
    let mut worst = 0f32;
    for kernel in kernels_here(&g) {
        for (i, &(b, ns, k)) in SHAPES.iter().enumerate() {
            if b > max_rows(kernel) {
                continue;
            }
            let tiles: usize = ns.iter().map(|n| n.div_ceil(GEMV_ROW_TILE)).sum();
            let planned = kernel.splits(sms, tiles, k);
            let most = (k / 128).min(8);
            let most = 1 << most.ilog2();
            let mut splits = vec![planned, 1, most];
            splits.dedup();
            for (j, &s) in splits.iter().enumerate() {
                let mut r = rng(700 + (i * 4 + j) as u64);
                let out_bf16 = (i + j) % 2 == 1;
                let exact = exact_inputs(&mut r, b, ns, k);
                run_case(&g, kernel, (b, ns, k), &exact, (s, out_bf16, true));
                let random = random_inputs(&mut r, b, ns, k);
                let w = run_case(&g, kernel, (b, ns, k), &random, (s, out_bf16, false));
                worst = worst.max(w);
            }
        }
    }
    assert!(worst <= 1.0, "worst error {worst:.3} x the bound");
}

/// A row's outputs do not depend on the batch around it, on either kernel: the first rows of one input at 1 to 64
/// rows (every batch-tile width) give the same bits, as the engine's batch invariance needs.
#[test]
fn fp8_act_gemv_rows_independent_of_batch() {
    let Some(g) = gpu() else { return };
    let (ns, k): (&[usize], usize) = (&[640, 200], 2048);
    let mut r = rng(900);
    let full = random_inputs(&mut r, 64, ns, k);
    let tiles: usize = ns.iter().map(|n| n.div_ceil(GEMV_ROW_TILE)).sum();
    for kernel in kernels_here(&g) {
        let splits = kernel.splits(g.info.sm_count as usize, tiles, k);
        let mut first: Option<Vec<Vec<f32>>> = None;
        for b in [3usize, 8, 9, 16, 17, 40, 64] {
            if b > max_rows(kernel) {
                continue;
            }
            let inp = Inputs {
                x: reference::ActQuant {
                    q: full.x.q[..b * k].to_vec(),
                    scales: full.x.scales[..b * k / 128].to_vec(),
                    deq: full.x.deq[..b * k].to_vec(),
                },
                weights: full.weights.clone(),
            };
            let outs = launch(&g, kernel, (b, ns, k), &inp, (splits, false));
            let head: Vec<Vec<f32>> = outs
                .iter()
                .zip(ns)
                .map(|(o, &n)| o[..3 * n].to_vec())
                .collect();
            match &first {
                None => first = Some(head),
                Some(f) => {
                    for (gi, (a, want)) in head.iter().zip(f).enumerate() {
                        let what = format!("{kernel:?} group {gi}: batch {b} against batch 3");
                        assert_same_bits(a, want, &what);
                    }
                    println!("{kernel:?} rows 0-2 at batch {b}: the same bits as at batch 3");
                }
            }
        }
    }
}
