//! `kbench pf`: the dense FP8 prefill GEMMs at the real prefill shapes, pf_gemm_fp8 (bf16 mma.sync after
//! converting the weights) against every pf_wgmma variant (the cp.async rings and the warp-specialised `ws`:
//! bf16 wgmma on weights dequantised by pf_fp8_to_bf16, timed apart), in TFLOP/s.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::{PfDequant, PfGemm, PfWeights, PfWgmma, PF_WGMMA_VARIANTS};
use dsv4_kernels::{bf16, GpuContext};

use super::{filled, noise, time_ms, R};

/// One launch's groups: (name, [n per group], k). Groups share x, as in the engine.
const SHAPES: [(&str, &[usize], usize); 6] = [
    ("wq_a+wkv", &[1024, 512], 4096),
    ("wq_b+iwq_b", &[32768, 8192], 1024),
    ("wo_a x8", &[1024; 8], 4096),
    ("wo_b", &[4096], 8192),
    ("shared w1+w3", &[2048, 2048], 4096),
    ("shared w2", &[4096], 2048),
];

fn dptr<T>(g: &GpuContext, b: &CudaSlice<T>) -> u64 {
    use dsv4_kernels::cudarc::driver::DevicePtr;
    b.device_ptr(&g.stream).0
}

/// Times pf_gemm_fp8 and each wgmma variant on `m` rows for every shape.
pub fn bench(g: &GpuContext, rows: &[usize]) -> R<()> {
    println!("| GEMM | M | N x K | kernel | us | TFLOP/s |\n|---|---|---|---|---|---|");
    for &m in rows {
        for (name, ns, k) in SHAPES {
            bench_shape(g, name, m, ns, k)?;
        }
    }
    Ok(())
}

fn bench_shape(g: &GpuContext, name: &str, m: usize, ns: &[usize], k: usize) -> R<()> {
    let x = filled(g, m * k, bf16::from_f32(0.5))?;
    let ws: Vec<CudaSlice<u8>> = ns
        .iter()
        .enumerate()
        .map(|(i, &n)| noise(g, n * k, 17 + i as u32, 0x77))
        .collect::<R<_>>()?;
    let ss: Vec<CudaSlice<u8>> = ns
        .iter()
        .map(|&n| filled(g, n.div_ceil(128) * k.div_ceil(128), 127u8))
        .collect::<R<_>>()?;
    let wbf: Vec<CudaSlice<u16>> = ns
        .iter()
        .map(|&n| filled(g, n * k, 0u16))
        .collect::<R<_>>()?;
    let outs: Vec<CudaSlice<f32>> = ns
        .iter()
        .map(|&n| filled(g, m * n, 0f32))
        .collect::<R<_>>()?;
    let flop = 2.0 * (m * k * ns.iter().sum::<usize>()) as f64;
    let shape = format!("{ns:?} x {k}");
    let line = |kernel: &str, ms: f64| {
        println!(
            "| {name} | {m} | {shape} | {kernel} | {:.1} | {:.0} |",
            ms * 1e3,
            flop / ms / 1e9
        );
    };

    let mut p = PfGemm {
        m: m as i32,
        k: k as i32,
        ..Default::default()
    };
    let mut q = PfWgmma {
        m: m as i32,
        k: k as i32,
        ..Default::default()
    };
    let mut d = PfDequant {
        k: k as i32,
        ..Default::default()
    };
    for (i, &n) in ns.iter().enumerate() {
        (p.x[i], p.w[i], p.s[i], p.out[i]) = (
            dptr(g, &x),
            dptr(g, &ws[i]),
            dptr(g, &ss[i]),
            dptr(g, &outs[i]),
        );
        p.n[i] = n as i32;
        (q.x[i], q.out[i], q.n[i]) = (p.x[i], p.out[i], n as i32);
        (d.w[i], d.s[i], d.out[i], d.n[i]) = (p.w[i], p.s[i], dptr(g, &wbf[i]), n as i32);
    }
    let bm = if m > 96 { 128 } else { 64 };
    let ms = time_ms(g, 3, |_| {
        // SAFETY: x holds m*k bf16, each weight n*k bytes with its scales, each output m*n f32.
        Ok(unsafe {
            g.launch_pf_gemm(&g.stream, PfWeights::Fp8, bm, ns.len(), m.div_ceil(bm), &p)
        }?)
    })?;
    line(&format!("pf_gemm_fp8 bm{bm}"), ms);
    let ms = time_ms(g, 3, |_| {
        // SAFETY: each weight holds n*k bytes with its scales, each wbf n*k bf16.
        Ok(unsafe { g.launch_pf_fp8_to_bf16(&g.stream, ns.len(), &d) }?)
    })?;
    println!(
        "| {name} | - | {shape} | pf_fp8_to_bf16 | {:.1} | - |",
        ms * 1e3
    );
    if !g.has_wgmma() {
        return Ok(());
    }
    for i in 0..ns.len() {
        q.w[i] = d.out[i];
    }
    for (v, var) in PF_WGMMA_VARIANTS.iter().enumerate() {
        if !g.kernels.prefill.wgmma_fits[v] {
            continue;
        }
        let ms = time_ms(g, 3, |_| {
            // SAFETY: x m*k bf16, each weight's bf16 copy n*k, each output m*n f32.
            Ok(unsafe { g.launch_pf_wgmma(&g.stream, v, ns.len(), &q) }?)
        })?;
        line(var.name, ms);
    }
    Ok(())
}
