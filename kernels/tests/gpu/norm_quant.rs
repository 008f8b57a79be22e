use dsv4_kernels::{bf16, reference, GpuContext};
use rand::Rng;

use crate::common::*;

#[test]
fn rmsnorm_matches_reference() {
    let Some(g) = gpu() else { return };
    for (i, (rows, d)) in [
        (1, 4096),
        (3, 4096),
        (5, 1000),
        (64, 4096),
        (2, 7),
        (4, 8200),
    ]
    .into_iter()
    .enumerate()
    {
        let mut r = rng(400 + i as u64);
        let x = rand_bf16(&mut r, rows * d);
        let w: Vec<f32> = (0..d).map(|_| r.random_range(0.5f32..1.5)).collect();
        let want = reference::rmsnorm(&x, &w, d, 1e-6);
        let (dx, dw) = (upload(&g, &x), upload(&g, &w));
        let mut y = upload(&g, &vec![bf16::NAN; rows * d]);
        g.launch_rmsnorm(&g.stream, rows, d, 1e-6, &dx, &dw, &mut y)
            .expect("launch");
        let got = download(&g, &y);
        // Summation order changes the f32 scale in its last bits: allow one bf16 ulp (2^-7 relative).
        let bad = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| {
                !a.to_f32().is_finite()
                    || (a.to_f32() - b.to_f32()).abs() > b.to_f32().abs() / 128.0
            })
            .count();
        let exact = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        println!(
            "rmsnorm rows={rows} d={d}: {exact}/{} bit-exact, {bad} beyond 1 ulp",
            got.len()
        );
        assert_eq!(bad, 0);
    }
}

/// bf16 values over a wide exponent range (e4m3 subnormals, saturation, ties), plus an all-zero block.
fn wide_bf16(r: &mut rand::rngs::StdRng, n: usize, block: usize) -> Vec<bf16> {
    let mut v: Vec<bf16> = (0..n)
        .map(|_| {
            let m: f32 = r.random_range(-1.0..1.0);
            bf16::from_f32(m * 2f32.powi(r.random_range(-24..12)))
        })
        .collect();
    if n >= 2 * block {
        v[block..2 * block].iter_mut().for_each(|x| *x = bf16::ZERO);
    }
    v
}

fn check_act_quant(g: &GpuContext, rows: usize, d: usize, block: usize, seed: u64) {
    let mut r = rng(seed);
    let x = wide_bf16(&mut r, rows * d, block);
    let want = reference::act_quant(&x, block);
    let dx = upload(g, &x);
    let mut q = upload(g, &vec![0xAAu8; rows * d]);
    let mut s = upload(g, &vec![f32::NAN; rows * d / block]);
    let mut deq = upload(g, &vec![bf16::NAN; rows * d]);
    g.launch_act_quant(&g.stream, rows, d, block, &dx, &mut q, &mut s)
        .expect("act_quant");
    g.launch_act_quant_fake(&g.stream, rows, d, block, &dx, &mut deq)
        .expect("act_quant_fake");
    let (gq, gs, gd) = (download(g, &q), download(g, &s), download(g, &deq));
    let qbad = gq.iter().zip(&want.q).filter(|(a, b)| a != b).count();
    let sbad = gs
        .iter()
        .zip(&want.scales)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let dbad = gd
        .iter()
        .zip(&want.deq)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    println!(
        "act_quant rows={rows} d={d} block={block}: mismatches q {qbad} scales {sbad} deq {dbad}"
    );
    if let Some(i) = (0..gq.len()).find(|&i| gq[i] != want.q[i]) {
        panic!(
            "q[{i}] = {:#04x}, want {:#04x} (x = {})",
            gq[i], want.q[i], x[i]
        );
    }
    assert_eq!((sbad, dbad), (0, 0));
}

#[test]
fn act_quant_bit_exact() {
    let Some(g) = gpu() else { return };
    for (i, (rows, d, block)) in [
        (1, 4096, 128),
        (3, 384, 128),
        (7, 448, 64),
        (64, 4096, 128),
        (2, 96, 32),
    ]
    .into_iter()
    .enumerate()
    {
        check_act_quant(&g, rows, d, block, 500 + i as u64);
    }
}

#[test]
fn nvrtc_fallback_compiles_and_runs() {
    if gpu().is_none() {
        return;
    }
    let g = GpuContext::new_nvrtc(0).expect("NVRTC context");
    println!("nvrtc module source: {:?}", g.source);
    check_act_quant(&g, 3, 512, 128, 600);
}
