//! The attention block's kernels at shapes the tiny model never reaches (its K is 32..64, so nothing splits):
//! the grouped FP8 GEMV with in-kernel split-K against single-matrix launches (bit-exact), the tensor-core
//! bf16 GEMV against f64 on the CPU, and `attn_row_prep` cut into pieces against the CPU fake quant.
//! Skips without a GPU.
use dsv4_engine::reference::quant::fake_quant_fp8;
use dsv4_kernels::attn::*;
use dsv4_kernels::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use dsv4_kernels::{
    bf16, gemv_cnt_len, gemv_splits, gemv_ws_len, GemvOut, GemvParams, GemvPath, GemvScratch,
    GemvWeights, Gpu, GpuContext,
};

fn gpu() -> Option<GpuContext> {
    match Gpu::probe() {
        Ok(Some(_)) => Some(GpuContext::new(0).expect("GPU context")),
        other => {
            eprintln!("SKIP gpu_attention_gemv: no usable GPU ({other:?})");
            None
        }
    }
}

fn rnd(i: usize, seed: usize) -> f32 {
    let z = (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)).wrapping_mul(2246822519);
    ((z >> 8) % 2001) as f32 / 1000.0 - 1.0
}

fn addr<T>(ctx: &GpuContext, b: &CudaSlice<T>) -> u64 {
    b.device_ptr(&ctx.stream).0
}

fn addr_mut<T>(ctx: &GpuContext, b: &mut CudaSlice<T>) -> u64 {
    b.device_ptr_mut(&ctx.stream).0
}

/// Grouped FP8 GEMV (3 groups of different N) == each group launched alone with the same split, bit for bit.
#[test]
fn grouped_fp8_gemv_matches_fp8_gemv() {
    let Some(ctx) = gpu() else { return };
    let s = &ctx.stream;
    let sms = ctx.info.sm_count as usize;
    let k = 4096;
    let ns = [1024usize, 512, 100];
    for b in [1usize, 5, 64] {
        let x: Vec<bf16> = (0..b * k).map(|i| bf16::from_f32(rnd(i, 1))).collect();
        let xd = s.clone_htod(&x).expect("x");
        let mut p = GemvParams {
            b: b as i32,
            k: k as i32,
            nmax: 1024,
            ..Default::default()
        };
        let mut ws_ref = GemvScratch::new(s, 64 * 64 * 1024, 64).expect("ws");
        let (mut ws, mut cnt) = (
            s.alloc_zeros::<f32>(64 * 64 * 1024).expect("ws"),
            s.alloc_zeros::<u32>(3 * 32).expect("cnt"),
        );
        let mut keep = Vec::new();
        let mut refs = Vec::new();
        let mut splits_alone = Vec::new();
        for (g, &n) in ns.iter().enumerate() {
            let w: Vec<u8> = (0..n * k)
                .map(|i| {
                    let r = (rnd(i, 10 + g) * 1000.0) as i32;
                    ((r & 0x80) | (0x20 + (r & 0x3f))) as u8
                })
                .collect();
            let sc: Vec<u8> = (0..n.div_ceil(128) * 32)
                .map(|i| 120 + (i % 7) as u8)
                .collect();
            let (wd, sd) = (s.clone_htod(&w).expect("w"), s.clone_htod(&sc).expect("s"));
            let mut want = s.alloc_zeros::<f32>(b * n).expect("want");
            let plan = ctx.gemv_plan(GemvWeights::Fp8, b, n, k).expect("plan");
            splits_alone.push(plan.splits);
            ctx.launch_gemv_fp8(
                s,
                &plan,
                &xd,
                &wd,
                &sd,
                GemvOut::f32(&mut want, s),
                &mut ws_ref,
            )
            .expect("single gemv");
            let mut got = s.alloc_zeros::<f32>(b * n).expect("got");
            (p.x[g], p.w[g], p.s[g], p.out[g]) = (
                addr(&ctx, &xd),
                addr(&ctx, &wd),
                addr(&ctx, &sd),
                addr_mut(&ctx, &mut got),
            );
            p.n[g] = n as i32;
            refs.push(want);
            keep.push((wd, sd, got));
        }
        let tiles = ns.iter().map(|n| n.div_ceil(32)).sum();
        let path = GemvPath::for_rows(b);
        let splits = gemv_splits(sms, tiles, k, GemvWeights::Fp8, path);
        assert!(splits > 1, "the test must exercise split-K");
        // Same split count alone and grouped: the same summation order, so the same bits.
        assert!(
            splits_alone.iter().all(|&a| a == splits),
            "{splits_alone:?} vs {splits}"
        );
        p.ws = addr_mut(&ctx, &mut ws);
        p.cnt = addr_mut(&ctx, &mut cnt);
        for _ in 0..2 {
            // Twice: the second launch relies on the counters the first one reset.
            // SAFETY: every group's buffers were allocated above with the shapes in p; ws/cnt lengths passed.
            unsafe {
                ctx.launch_gemv_grouped(
                    s,
                    GemvWeights::Fp8,
                    3,
                    splits,
                    path,
                    &p,
                    ws.len(),
                    cnt.len(),
                )
            }
            .expect("grouped");
        }
        for (g, want) in refs.iter().enumerate() {
            let (w, gv) = (
                s.clone_dtoh(want).expect("dtoh"),
                s.clone_dtoh(&keep[g].2).expect("dtoh"),
            );
            let same = w.iter().zip(&gv).all(|(a, c)| a.to_bits() == c.to_bits());
            println!("fp8 grouped B {b} group {g} N {}: bit-exact {same}", ns[g]);
            assert!(same, "B {b} group {g}");
        }
        assert!(s.clone_dtoh(&cnt).expect("cnt").iter().all(|&c| c == 0));
    }
}

/// Tensor-core bf16 GEMV (split and unsplit) against f64 on the CPU.
#[test]
fn bf16_gemv_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    let s = &ctx.stream;
    let sms = ctx.info.sm_count as usize;
    for (n, k) in [(2624usize, 4096usize), (1024, 4096), (77, 264)] {
        for b in [1usize, 9, 64] {
            let x: Vec<bf16> = (0..b * k).map(|i| bf16::from_f32(rnd(i, 3))).collect();
            let w: Vec<bf16> = (0..n * k)
                .map(|i| bf16::from_f32(rnd(i, 4) * 0.1))
                .collect();
            let (xd, wd) = (s.clone_htod(&x).expect("x"), s.clone_htod(&w).expect("w"));
            let mut y = s.alloc_zeros::<f32>(b * n).expect("y");
            let path = GemvPath::for_rows(b);
            let splits = gemv_splits(sms, n.div_ceil(32), k, GemvWeights::Bf16, path);
            let mut ws = s
                .alloc_zeros::<f32>(gemv_ws_len(1, splits, b, n).max(1))
                .expect("ws");
            let mut cnt = s.alloc_zeros::<u32>(gemv_cnt_len(1, n)).expect("cnt");
            let mut p = GemvParams {
                b: b as i32,
                k: k as i32,
                nmax: n as i32,
                ws: addr_mut(&ctx, &mut ws),
                cnt: addr_mut(&ctx, &mut cnt),
                ..Default::default()
            };
            (p.x[0], p.w[0], p.out[0], p.n[0]) = (
                addr(&ctx, &xd),
                addr(&ctx, &wd),
                addr_mut(&ctx, &mut y),
                n as i32,
            );
            // SAFETY: x b*k, w n*k bf16, y b*n f32, ws/cnt sized by the same functions the launcher checks.
            unsafe {
                ctx.launch_gemv_grouped(
                    s,
                    GemvWeights::Bf16,
                    1,
                    splits,
                    path,
                    &p,
                    ws.len(),
                    cnt.len(),
                )
            }
            .expect("bf16 gemv");
            let got = s.clone_dtoh(&y).expect("dtoh");
            let mut worst = 0f64;
            for bi in 0..b {
                for r in 0..n {
                    let (mut acc, mut mag) = (0f64, 0f64);
                    for c in 0..k {
                        let t = x[bi * k + c].to_f64() * w[r * k + c].to_f64();
                        acc += t;
                        mag += t.abs();
                    }
                    let e = (got[bi * n + r] as f64 - acc).abs() / (1e-5 * mag).max(1e-30);
                    worst = worst.max(e);
                }
            }
            println!("bf16 N {n} K {k} B {b} splits {splits}: worst error {worst:.3} of the bound");
            assert!(worst <= 1.0, "N {n} K {k} B {b}");
        }
    }
}

/// row_prep without a norm, cut into 1024-wide pieces: regroup + Q8 fake quant equal the CPU's.
#[test]
fn row_prep_pieces_match_cpu_quant() {
    let Some(ctx) = gpu() else { return };
    let s = &ctx.stream;
    let (groups, rows, width) = (8usize, 3usize, 1024usize);
    let x: Vec<f32> = (0..groups * rows * width)
        .map(|i| rnd(i, 5) * (1 + i % 13) as f32)
        .collect();
    let xd = s.clone_htod(&x).expect("x");
    let mut out = s.alloc_zeros::<bf16>(rows * groups * width).expect("out");
    let p = AttnRowPrep {
        x: addr(&ctx, &xd),
        out: addr_mut(&ctx, &mut out),
        x_f32: 1,
        groups: groups as i32,
        rows: rows as i32,
        width: width as i32,
        quant_blk: 128,
        ..Default::default()
    };
    // SAFETY: x holds groups*rows*width f32, out rows*groups*width bf16.
    unsafe { ctx.launch_attn_row_prep(s, &p) }.expect("row_prep");
    let got = s.clone_dtoh(&out).expect("dtoh");
    for r in 0..rows {
        let mut v: Vec<f32> = (0..groups * width)
            .map(|i| x[((i / width) * rows + r) * width + i % width])
            .collect();
        fake_quant_fp8(&mut v, 128);
        let row = &got[r * groups * width..(r + 1) * groups * width];
        let bad = v
            .iter()
            .zip(row)
            .filter(|(a, b)| bf16::from_f32(**a) != **b)
            .count();
        assert_eq!(bad, 0, "row {r}: {bad} values differ");
    }
}
