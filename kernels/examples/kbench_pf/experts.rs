//! `kbench pfexp [M,..]`: the prefill's routed FP4 experts at the model's shapes (hidden 4096, intermediate
//! 2048, 256 experts, top-6 of pseudo-random routing over M tokens): pf_gemm_fp4_expert (bm 64 or 128 as the
//! engine picks) against pf_kperm + pf_wgmma_fp4_expert (tiles of up to 256 or 128 rows) or
//! pf_wgmma_fp4_expert_s (64, two blocks per SM), in TFLOP/s.
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::prefill::{PfGemm, PfGroup, PfKperm, PfWeights};
use dsv4_kernels::{bf16, pf_kperm_cols, pf_max_tiles, GpuContext, PF_WGMMA_FP4_BM};

use super::{filled, noise, time_ms, R};

const EXPERTS: usize = 256;
const TOPK: usize = 6;
const D: usize = 4096;
const I: usize = 2048;

fn dptr<T>(g: &GpuContext, b: &CudaSlice<T>) -> u64 {
    use dsv4_kernels::cudarc::driver::DevicePtr;
    b.device_ptr(&g.stream).0
}

/// `n` pseudo-random bytes: 64 MB of noise repeated (no zeros; generating GBs on the host takes too long).
fn big_noise(g: &GpuContext, n: usize, seed: u32) -> R<CudaSlice<u8>> {
    let chunk = n.min(64 << 20);
    let src = noise(g, chunk, seed, 0xff)?;
    let mut dst = g.stream.alloc_zeros::<u8>(n)?;
    let mut at = 0;
    while at < n {
        let len = chunk.min(n - at);
        g.stream
            .memcpy_dtod(&src.slice(0..len), &mut dst.slice_mut(at..at + len))?;
        at += len;
    }
    Ok(dst)
}

/// Distinct top-6 expert ids per token from a xorshift stream.
fn route(m: usize) -> Vec<i32> {
    let mut s = 0x9e37_79b9u32;
    let mut ids = Vec::with_capacity(m * TOPK);
    for _ in 0..m {
        let mut row: Vec<i32> = Vec::new();
        while row.len() < TOPK {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let e = (s % EXPERTS as u32) as i32;
            if !row.contains(&e) {
                row.push(e);
            }
        }
        ids.extend(row);
    }
    ids
}

/// The three expert matrices: (weights, scales) of w1, w3 ([E, I, D]) and w2 ([E, D, I]).
struct Bank {
    w: [CudaSlice<u8>; 3],
    s: [CudaSlice<u8>; 3],
}

/// Times the old and the new routed-expert GEMMs at every M in `rows`.
pub fn bench(g: &GpuContext, rows: &[usize]) -> R<()> {
    let n = EXPERTS * I * D;
    let bank = Bank {
        w: [
            big_noise(g, n / 2, 1)?,
            big_noise(g, n / 2, 2)?,
            big_noise(g, n / 2, 3)?,
        ],
        s: [
            filled(g, n / 32, 127u8)?,
            filled(g, n / 32, 127u8)?,
            filled(g, n / 32, 127u8)?,
        ],
    };
    println!("| GEMM | M | kernel | us | TFLOP/s |\n|---|---|---|---|---|");
    for &m in rows {
        bench_m(g, &bank, m)?;
    }
    Ok(())
}

/// pf_moe_group of `ids` into tiles of `bm`: (tiles, order, max tiles).
fn group(
    g: &GpuContext,
    ids: &CudaSlice<i32>,
    slots: usize,
    bm: usize,
) -> R<(CudaSlice<i32>, CudaSlice<i32>, usize)> {
    let max_tiles = pf_max_tiles(slots, EXPERTS, bm);
    let tiles = filled(g, 1 + 3 * max_tiles, 0i32)?;
    let order = filled(g, slots, 0i32)?;
    let p = PfGroup {
        ids: dptr(g, ids),
        order: dptr(g, &order),
        tiles: dptr(g, &tiles),
        slots: slots as i32,
        experts: EXPERTS as i32,
        bm: bm as i32,
        pad: 0,
    };
    // SAFETY: ids holds `slots` ids < EXPERTS, order `slots` ints, tiles 1 + 3 max_tiles ints.
    unsafe { g.launch_pf_moe_group(&g.stream, &p) }?;
    Ok((tiles, order, max_tiles))
}

/// Milliseconds of one expert GEMM launch of `p`: pf_gemm_fp4_expert with tiles of `bm` rows, or (None) the
/// wgmma kernel for tiles of `wbm` rows.
fn time_gemm(
    g: &GpuContext,
    p: &PfGemm,
    groups: usize,
    tiles: usize,
    bm: Option<usize>,
    wbm: usize,
) -> R<f64> {
    time_ms(g, 3, |_| {
        // SAFETY: bench_m fills p: x (K-permuted for the wgmma kernel) holds every row the tiles name, the
        // weights E x n x k/2 bytes with their scales, the outputs slots x n f32; tiles/order from pf_moe_group
        // with this bm (256 for the wgmma kernel).
        unsafe {
            match bm {
                Some(bm) => g.launch_pf_gemm(&g.stream, PfWeights::Fp4Expert, bm, groups, tiles, p),
                None => g.launch_pf_wgmma_fp4_expert(&g.stream, wbm, groups, tiles, p),
            }
        }?;
        Ok(())
    })
}

fn bench_m(g: &GpuContext, b: &Bank, m: usize) -> R<()> {
    let slots = m * TOPK;
    let ids = g.stream.clone_htod(&route(m))?;
    let x = filled(g, m * D, bf16::from_f32(0.5))?;
    let h = filled(g, slots * I, bf16::from_f32(0.25))?;
    let xp = filled(g, m * pf_kperm_cols(D), bf16::ZERO)?;
    let hp = filled(g, slots * pf_kperm_cols(I), bf16::ZERO)?;
    let (gu, uu, y) = (
        filled(g, slots * I, 0f32)?,
        filled(g, slots * I, 0f32)?,
        filled(g, slots * D, 0f32)?,
    );
    let up_flop = 2.0 * 2.0 * (slots * I * D) as f64;
    let line = |name: &str, kernel: &str, ms: f64, flop: f64| {
        let tf = if flop > 0.0 {
            format!("{:.0}", flop / ms / 1e9)
        } else {
            "-".into()
        };
        println!("| {name} | {m} | {kernel} | {:.1} | {tf} |", ms * 1e3);
    };
    // (x, weights index, out, n, k, x_per_slot) of w1 + w3 and of w2.
    let up = |p: &mut PfGemm, xa: u64| {
        for (gi, (wi, out)) in [(0, &gu), (1, &uu)].into_iter().enumerate() {
            (p.x[gi], p.w[gi], p.s[gi], p.out[gi], p.n[gi]) = (
                xa,
                dptr(g, &b.w[wi]),
                dptr(g, &b.s[wi]),
                dptr(g, out),
                I as i32,
            );
        }
        (p.k, p.x_per_slot) = (D as i32, 0);
    };
    let down = |p: &mut PfGemm, xa: u64| {
        (p.x[0], p.w[0], p.s[0], p.out[0], p.n[0]) = (
            xa,
            dptr(g, &b.w[2]),
            dptr(g, &b.s[2]),
            dptr(g, &y),
            D as i32,
        );
        (p.k, p.x_per_slot) = (I as i32, 1);
    };

    let old_bm = if slots >= 96 * EXPERTS { 128 } else { 64 };
    let (tiles, order, max_tiles) = group(g, &ids, slots, old_bm)?;
    let mut p = PfGemm {
        tiles: dptr(g, &tiles),
        order: dptr(g, &order),
        topk: TOPK as i32,
        ..Default::default()
    };
    up(&mut p, dptr(g, &x));
    let old_up = time_gemm(g, &p, 2, max_tiles, Some(old_bm), 0)?;
    line(
        "w1+w3",
        &format!("pf_gemm_fp4_expert bm{old_bm}"),
        old_up,
        up_flop,
    );
    down(&mut p, dptr(g, &h));
    let old_down = time_gemm(g, &p, 1, max_tiles, Some(old_bm), 0)?;
    line(
        "w2",
        &format!("pf_gemm_fp4_expert bm{old_bm}"),
        old_down,
        up_flop / 2.0,
    );
    if !g.has_wgmma() {
        return Ok(());
    }

    let perm = |src: &CudaSlice<bf16>, dst: &CudaSlice<bf16>, r: usize, k: usize| -> R<f64> {
        let q = PfKperm {
            x: dptr(g, src),
            out: dptr(g, dst),
            rows: r as i32,
            k: k as i32,
        };
        // SAFETY: src holds r x k bf16, dst r x pf_kperm_cols(k).
        time_ms(g, 3, |_| Ok(unsafe { g.launch_pf_kperm(&g.stream, &q) }?))
    };
    let kx = perm(&x, &xp, m, D)?;
    line("x -> x'", "pf_kperm", kx, 0.0);
    let kh = perm(&h, &hp, slots, I)?;
    line("h -> h'", "pf_kperm", kh, 0.0);
    line("routed (3 GEMMs)", "old", old_up + old_down, 1.5 * up_flop);
    // The wgmma kernels: tiles of 256 and 128 rows (pf_wgmma_fp4_expert), 64 (pf_wgmma_fp4_expert_s).
    for bm in [PF_WGMMA_FP4_BM, 128, 64] {
        let (tiles, order, max_tiles) = group(g, &ids, slots, bm)?;
        (p.tiles, p.order) = (dptr(g, &tiles), dptr(g, &order));
        up(&mut p, dptr(g, &xp));
        let new_up = time_gemm(g, &p, 2, max_tiles, None, bm)?;
        line(
            "w1+w3",
            &format!("pf_wgmma_fp4_expert bm{bm}"),
            new_up,
            up_flop,
        );
        down(&mut p, dptr(g, &hp));
        let new_down = time_gemm(g, &p, 1, max_tiles, None, bm)?;
        line(
            "w2",
            &format!("pf_wgmma_fp4_expert bm{bm}"),
            new_down,
            up_flop / 2.0,
        );
        let total = kx + new_up + kh + new_down;
        line(
            "routed (3 GEMMs)",
            &format!("new bm{bm} incl. 2 pf_kperm"),
            total,
            1.5 * up_flop,
        );
    }
    Ok(())
}
