//! Times each kernel at the model's real sizes with CUDA events and prints achieved GB/s next to a
//! device-to-device copy measured in the same run. `cargo run --release -p dsv4-kernels --example kbench`
//! (`kbench fp4 [B,..]`: routed experts only; `kbench pf [M,..]`: the dense FP8 prefill GEMMs, see kbench_pf;
//! `kbench pfexp [M,..]`: the prefill's routed FP4 experts, kbench_pf/experts.rs; `kbench pfattn [M,..]`: the
//! prefill attention kernels, kbench_pf/attn.rs; `kbench hc [M,..]`: the prefill's mHC launches,
//! kbench_pf/hc.rs; `kbench launch [N]`: the cost of one dependent launch, kbench_pf/launch.rs).
use std::error::Error;

use dsv4_kernels::cudarc::driver::{sys, CudaSlice, DeviceRepr};
use dsv4_kernels::{
    bf16, gemv_cnt_len, gemv_splits, gemv_ws_len, GemvOut, GemvParams, GemvPath, GemvScratch,
    GemvWeights, Gpu, GpuContext, RingTune, GEMV_GROUPS, GEMV_ROW_TILE,
};

#[path = "kbench_pf/fp4.rs"]
mod fp4;
#[path = "kbench_pf/hc.rs"]
mod hc;
#[path = "kbench_pf/launch.rs"]
mod launch;
#[path = "kbench_pf/mod.rs"]
mod pf;
#[path = "kbench_pf/attn.rs"]
mod pfattn;
#[path = "kbench_pf/experts.rs"]
mod pfexp;
#[path = "kbench_pf/q8.rs"]
mod q8;

type R<T> = Result<T, Box<dyn Error>>;

/// Median milliseconds per call of `f(i)` over 7 timed batches of `iters` calls, after a warm-up.
fn time_ms(g: &GpuContext, iters: usize, mut f: impl FnMut(usize) -> R<()>) -> R<f64> {
    for i in 0..3 {
        f(i)?;
    }
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (a, b) = (g.ctx.new_event(flags)?, g.ctx.new_event(flags)?);
    let mut v = Vec::new();
    for _ in 0..7 {
        a.record(&g.stream)?;
        for i in 0..iters {
            f(i)?;
        }
        b.record(&g.stream)?;
        b.synchronize()?;
        v.push(f64::from(a.elapsed_ms(&b)?) / iters as f64);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[3])
}

fn filled<T: DeviceRepr + Copy>(g: &GpuContext, n: usize, v: T) -> R<CudaSlice<T>> {
    Ok(g.stream.clone_htod(&vec![v; n])?)
}

/// Pseudo-random bytes (not zeros: zeros can run faster than real data).
fn noise(g: &GpuContext, n: usize, seed: u32, mask: u8) -> R<CudaSlice<u8>> {
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    let v: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as u8) & mask
        })
        .collect();
    Ok(g.stream.clone_htod(&v)?)
}

fn copy_gbs(g: &GpuContext) -> R<f64> {
    let n = 1usize << 30;
    let src = noise(g, n, 1, 0xff)?;
    let mut dst = filled(g, n, 0u8)?;
    let ms = time_ms(g, 5, |_| Ok(g.stream.memcpy_dtod(&src, &mut dst)?))?;
    Ok(2.0 * n as f64 / ms / 1e6)
}

fn bench_fp8(g: &GpuContext, name: &str, n: usize, k: usize, copy: f64) -> R<()> {
    // Enough weight copies to exceed the 60 MB L2, rotated between calls.
    let copies = (256 << 20) / (n * k) + 1;
    let ws: Vec<CudaSlice<u8>> = (0..copies)
        .map(|i| noise(g, n * k, i as u32 + 7, 0x77))
        .collect::<R<_>>()?;
    let sc = noise(g, n.div_ceil(128) * k.div_ceil(128), 3, 0x0f)?;
    for b in [1usize, 8, 64] {
        let plan = g.gemv_plan(GemvWeights::Fp8, b, n, k)?;
        let x = filled(g, b * k, bf16::from_f32(0.5))?;
        let mut y = filled(g, b * n, bf16::ZERO)?;
        let mut wsp = GemvScratch::new(&g.stream, plan.workspace_len(), plan.counters_len())?;
        let ms = time_ms(g, 20, |i| {
            let out = GemvOut::bf16(&mut y, &g.stream);
            Ok(g.launch_gemv_fp8(&g.stream, &plan, &x, &ws[i % copies], &sc, out, &mut wsp)?)
        })?;
        let bytes = (n * k + 2 * b * (k + n)) as f64;
        let gbs = bytes / ms / 1e6;
        println!(
            "| gemv fp8 {name:<8} | {n}x{k} | {b:>2} | {:>3} | {:>8.2} | {gbs:>7.0} | {:>5.1}% |",
            plan.splits,
            ms * 1e3,
            100.0 * gbs / copy
        );
    }
    Ok(())
}

/// The model's grouped GEMV launches (name, format, K, rows of each group), as the decode step issues them.
const MODEL_GEMVS: [(&str, GemvWeights, usize, &[usize]); 9] = [
    ("wq_a+wkv", GemvWeights::Fp8, 4096, &[1024, 512]),
    ("wq_b+iwq_b", GemvWeights::Fp8, 1024, &[32768, 8192]),
    ("wo_a x8", GemvWeights::Fp8, 4096, &[1024; 8]),
    ("wo_b", GemvWeights::Fp8, 8192, &[4096]),
    ("sh w1+w3", GemvWeights::Fp8, 4096, &[2048, 2048]),
    ("sh w2", GemvWeights::Fp8, 2048, &[4096]),
    ("gate bf16", GemvWeights::Bf16, 4096, &[256]),
    ("lin csa bf16", GemvWeights::Bf16, 4096, &[2624]),
    ("lin hca bf16", GemvWeights::Bf16, 4096, &[1024]),
];

/// The launches `kbench gemv` times for one batch: the planned one (the engine's default), plus its split
/// neighbours (`gemv-sweep`), or (`gemv-ab`) every kernel family: gemv.cu, the mma.sync ring, and the wgmma
/// ring at each ring depth and at half / twice the planned split.
fn gemv_variants(
    g: &GpuContext,
    (wt, k, tiles): (GemvWeights, usize, usize),
    b: usize,
    mode: &str,
) -> Vec<(String, GemvPath, RingTune, usize)> {
    let sms = g.info.sm_count as usize;
    let ksteps = k.div_ceil(if wt == GemvWeights::Fp8 { 128 } else { 64 });
    let path = GemvPath::for_rows(b);
    let plan = gemv_splits(sms, tiles, k, wt, path);
    let tune = RingTune::default();
    let mut v = vec![("planned".to_string(), path, tune, plan)];
    if mode == "gemv-sweep" {
        for c in [1, plan / 2, plan * 2, plan * 4] {
            if c >= 1 && c <= ksteps && c != plan {
                v.push((format!("splits {c}"), path, tune, c));
            }
        }
    }
    if mode == "gemv-q8" {
        v.truncate(1);
    }
    if mode == "gemv-ab" {
        let ring = gemv_splits(sms, tiles, k, wt, GemvPath::Ring);
        let skinny = gemv_splits(sms, tiles, k, wt, GemvPath::Skinny);
        v = vec![("gemv.cu".to_string(), GemvPath::Skinny, tune, skinny)];
        let mma = RingTune {
            mma_sync: true,
            ..tune
        };
        v.push(("ring mma.sync".into(), GemvPath::Ring, mma, ring));
        if let Some(kern) = g.wg_ring(wt, b) {
            v.push((
                format!("ring wg d{}", kern.depth),
                GemvPath::Ring,
                tune,
                ring,
            ));
            for d in (2..=kern.depth_max).filter(|&d| d != kern.depth) {
                let t = RingTune { depth: d, ..tune };
                v.push((format!("ring wg d{d}"), GemvPath::Ring, t, ring));
            }
            for c in [ring / 2, ring * 2] {
                if c >= 1 && c <= ksteps.min(8) && c != ring {
                    v.push((format!("ring wg s{c}"), GemvPath::Ring, tune, c));
                }
            }
        }
    }
    v
}

/// One grouped launch of the model (all groups of `ns` rows over `k`) at each batch, weights rotated out of
/// L2, timed back to back between events (so the launch floor is included, as in the step's graph).
fn bench_model_gemv(
    g: &GpuContext,
    (name, wt, k, ns): (&str, GemvWeights, usize, &[usize]),
    batches: &[usize],
    copy: f64,
    mode: &str,
) -> R<()> {
    let esz = if wt == GemvWeights::Fp8 { 1 } else { 2 };
    let wbytes: usize = ns.iter().map(|n| n * k * esz).sum();
    let copies = (256 << 20) / wbytes + 1;
    // One buffer per group and copy: [copy][group].
    let ws: Vec<Vec<CudaSlice<u8>>> = (0..copies)
        .map(|c| {
            ns.iter()
                .enumerate()
                .map(|(i, n)| noise(g, n * k * esz, (c * 8 + i) as u32 + 7, 0x37))
                .collect::<R<_>>()
        })
        .collect::<R<_>>()?;
    let sc: Vec<CudaSlice<u8>> = ns
        .iter()
        .map(|n| noise(g, n.div_ceil(128) * k.div_ceil(128), 3, 0x0f))
        .collect::<R<_>>()?;
    let tiles: usize = ns.iter().map(|n| n.div_ceil(GEMV_ROW_TILE)).sum();
    let nmax = ns.iter().copied().max().unwrap_or(1);
    for &b in batches {
        let x = filled(g, b * k, bf16::from_f32(0.5))?;
        let mut ys: Vec<CudaSlice<f32>> = ns
            .iter()
            .map(|n| filled(g, b * n, 0f32))
            .collect::<R<_>>()?;
        let cands = gemv_variants(g, (wt, k, tiles), b, mode);
        // The q8 rows (kbench_pf/q8.rs) time up to the ring's most splits, 8.
        let smax = cands.iter().map(|c| c.3).max().unwrap_or(1).max(8);
        let (wl, cl) = (
            gemv_ws_len(ns.len(), smax, b, nmax),
            gemv_cnt_len(GEMV_GROUPS, nmax),
        );
        let mut scr = GemvScratch::new(&g.stream, wl, cl)?;
        let mut p = GemvParams {
            b: b as i32,
            k: k as i32,
            nmax: nmax as i32,
            ..Default::default()
        };
        p.ws = ptr_of(&mut scr.ws, g);
        p.cnt = ptr_of(&mut scr.cnt, g);
        for (i, n) in ns.iter().enumerate() {
            p.n[i] = *n as i32;
            p.x[i] = ptr_of_ro(&x, g);
            p.s[i] = ptr_of_ro(&sc[i], g);
            p.out[i] = ptr_of(&mut ys[i], g);
        }
        for (label, path, tune, splits) in cands {
            let ms = time_ms(g, 20, |it| {
                let mut q = p;
                for (i, w) in ws[it % copies].iter().enumerate() {
                    q.w[i] = ptr_of_ro(w, g);
                }
                // SAFETY: every buffer above holds the sizes the params name; the scratch is sized for the
                // largest split timed.
                Ok(unsafe {
                    g.launch_gemv_grouped_tuned(
                        &g.stream,
                        wt,
                        ns.len(),
                        splits,
                        (path, tune),
                        &q,
                        wl,
                        cl,
                    )
                }?)
            })?;
            let bytes = (wbytes + 2 * b * k + 4 * b * ns.iter().sum::<usize>()) as f64;
            let gbs = bytes / ms / 1e6;
            println!(
                "| gemv {name:<12} | {nmax}x{k} x{} | {b:>2} | {label} | {splits:>3} | {:>8.2} | {gbs:>7.0} | {:>5.1}% |",
                ns.len(),
                ms * 1e3,
                100.0 * gbs / copy
            );
        }
        if wt == GemvWeights::Fp8 && (mode == "gemv-q8" || mode == "gemv-ab") {
            let case = q8::Q8Case {
                name,
                ns,
                ws: &ws,
                p,
                scratch: (wl, cl),
                x: &x,
                wbytes,
            };
            q8::bench(g, &case, b, copy)?;
        }
    }
    Ok(())
}

fn ptr_of_ro<T>(v: &CudaSlice<T>, g: &GpuContext) -> u64 {
    use dsv4_kernels::cudarc::driver::DevicePtr;
    v.device_ptr(&g.stream).0
}

fn ptr_of<T>(v: &mut CudaSlice<T>, g: &GpuContext) -> u64 {
    use dsv4_kernels::cudarc::driver::DevicePtrMut;
    v.device_ptr_mut(&g.stream).0
}

fn bench_small(g: &GpuContext) -> R<()> {
    let (rows, d) = (64usize, 4096usize);
    let x = filled(g, rows * d, bf16::from_f32(0.75))?;
    let w = filled(g, d, 1.0f32)?;
    let mut y = filled(g, rows * d, bf16::ZERO)?;
    let ms = time_ms(g, 50, |_| {
        Ok(g.launch_rmsnorm(&g.stream, rows, d, 1e-6, &x, &w, &mut y)?)
    })?;
    println!("rmsnorm 64x4096: {:.2} us", ms * 1e3);
    let ms = time_ms(g, 50, |_| {
        Ok(g.launch_rmsnorm(&g.stream, 1, d, 1e-6, &x, &w, &mut y)?)
    })?;
    println!("rmsnorm 1x4096: {:.2} us", ms * 1e3);
    let mut q = filled(g, rows * d, 0u8)?;
    let mut s = filled(g, rows * d / 128, 0f32)?;
    let ms = time_ms(g, 50, |_| {
        Ok(g.launch_act_quant(&g.stream, rows, d, 128, &x, &mut q, &mut s)?)
    })?;
    println!("act_quant 64x4096: {:.2} us", ms * 1e3);
    Ok(())
}

fn main() -> R<()> {
    let Some(info) = Gpu::probe()? else {
        println!(
            "kbench: no GPU ({})",
            Gpu::probe_reason(0)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        );
        return Ok(());
    };
    let g = GpuContext::new(0)?;
    println!(
        "kbench on {} (cc {}.{}, {} SMs), module {:?}",
        info.name, info.cc.0, info.cc.1, info.sm_count, g.source
    );
    for (i, f) in g.kernels.fp4_expert.iter().enumerate() {
        let blocks = f.occupancy_max_active_blocks_per_multiprocessor(128, 0, None)?;
        println!("fp4_expert_mt{}: {blocks} blocks of 128 per SM", i + 1);
    }
    // `kbench pf [M,M..]`: the dense FP8 prefill GEMMs only (default M = 1024, 8192).
    if std::env::args().nth(1).is_some_and(|a| a == "pf") {
        let rows: Vec<usize> = match std::env::args().nth(2) {
            Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
            None => vec![1024, 8192],
        };
        return pf::bench(&g, &rows);
    }
    // `kbench pfexp [M,M..]`: the routed FP4 experts of a prefill of M tokens (default 1024, 8192).
    if std::env::args().nth(1).is_some_and(|a| a == "pfexp") {
        let rows: Vec<usize> = match std::env::args().nth(2) {
            Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
            None => vec![1024, 8192],
        };
        return pfexp::bench(&g, &rows);
    }
    // `kbench pfattn [M,M..]`: the prefill attention kernels (default 1024, 8192); `pfattn-once M`: one launch.
    // `kbench hc [M,M..]`: the prefill's mHC launches (default M = 1024, 8192), see kbench_pf/hc.rs.
    let arg = |i| std::env::args().nth(i);
    let rows_arg = || -> R<Vec<usize>> {
        Ok(match arg(2) {
            Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
            None => vec![1024, 8192],
        })
    };
    match arg(1).as_deref() {
        Some("pfattn") => return pfattn::bench(&g, &rows_arg()?),
        Some("pfattn-once") => return pfattn::once(&g, arg(2).unwrap_or_default().parse()?),
        Some("hc") => return hc::bench(&g, &rows_arg()?),
        Some("launch") => return launch::bench(&g, arg(2).map_or(Ok(1000), |v| v.parse())?),
        Some("fp4prof") => {
            let b = arg(2).map_or(Ok(vec![1, 8]), |l| l.split(',').map(str::parse).collect())?;
            return fp4::prof(&g, &b);
        }
        _ => {}
    }
    let copy = copy_gbs(&g)?;
    println!("device-to-device copy: {copy:.0} GB/s (read + write)\n");
    // `kbench fp4 [B,B..]`: the routed-expert kernel only (at the listed batches; default 1, 8, 64).
    // `kbench gemv [B,B..]`: the model's grouped GEMV launches only (default batches 1, 8, 16); `gemv-sweep`
    // also times 1, half, twice and four times the planned K splits; `gemv-ab` every kernel family and ring
    // depth (see gemv_variants); `gemv-q8` the planned launch and the FP8-activation kernels (kbench_pf/q8.rs).
    let mode = std::env::args().nth(1).unwrap_or_default();
    let only_fp4 = mode == "fp4";
    let batches: Vec<usize> = match std::env::args().nth(2) {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None if mode.starts_with("gemv") => vec![1, 8, 16],
        None => vec![1, 8, 64],
    };
    if mode.starts_with("gemv") {
        let k = &g.kernels.gemv;
        let occ = |f: &dsv4_kernels::cudarc::driver::CudaFunction| {
            f.occupancy_max_active_blocks_per_multiprocessor(256, 0, None)
                .unwrap_or(0)
        };
        println!(
            "gemv.cu blocks of 256 per SM: fp8 {:?} bf16 {:?}",
            k.fp8.iter().map(occ).collect::<Vec<_>>(),
            k.bf16.iter().map(occ).collect::<Vec<_>>()
        );
        for wt in [GemvWeights::Fp8, GemvWeights::Bf16] {
            let wg: Vec<String> = [8usize, 16, 32, 64]
                .iter()
                .map(|&b| match g.wg_ring(wt, b) {
                    Some(k) => format!("d{} {}/SM", k.depth, k.occupancy),
                    None => "-".into(),
                })
                .collect();
            println!("wgmma ring {wt:?} (nt1, nt2, nt4, nt8): {wg:?}");
        }
        println!("| kernel | N x K x groups | B | launch | splits | us | GB/s | of copy |\n|---|---|---|---|---|---|---|---|");
        for m in MODEL_GEMVS {
            bench_model_gemv(&g, m, &batches, copy, &mode)?;
        }
        return Ok(());
    }
    if !only_fp4 {
        println!(
            "| kernel | N x K | B | splits | us | GB/s | of copy |\n|---|---|---|---|---|---|---|"
        );
    }
    for (name, n, k) in [
        ("wq_b", 32768, 1024),
        ("wo_b", 4096, 8192),
        ("wq_a", 1024, 4096),
        ("wkv", 512, 4096),
        ("shared", 2048, 4096),
    ] {
        if !only_fp4 {
            bench_fp8(&g, name, n, k, copy)?;
        }
    }
    fp4::bench(&g, copy, &batches)?;
    if !only_fp4 {
        bench_small(&g)?;
    }
    Ok(())
}
