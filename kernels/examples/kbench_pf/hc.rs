//! `kbench hc [M,..]`: the prefill's mHC launches at M rows (default 1024, 8192): HCPre of a block mixer (partial
//! sums + finish; without and with the FP8 copy) and HCPost (attention output, MoE output of 6 experts), with a
//! checksum of every output. Run it twice, once with `DSV4_HC_TILE_MIN=1000000000` (the decode kernels), to time
//! the row-count variants against each other and see that their bits agree (the checksums must match).
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, hc_workspace_len, GpuContext, HcPre, HC_MIX};

use super::{filled, time_ms, R};

const D: usize = 4096;
const TOPK: usize = 6;
/// hc_mix_tile24's dynamic shared memory (ops::mhc TILE_SMEM): two stages of 128 rows x 128 bf16 and 24 x 128 f32.
const TILE_SMEM: usize = 2 * (128 * 128 * 2 + 24 * 128 * 4);

/// Deterministic pseudo-random values in [-amp, amp).
fn rand_f32(n: usize, seed: u32, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 * amp - amp
        })
        .collect()
}

fn up<T: dsv4_kernels::cudarc::driver::DeviceRepr + Copy>(
    g: &GpuContext,
    v: &[T],
) -> R<CudaSlice<T>> {
    Ok(g.stream.clone_htod(v)?)
}

/// FNV-1a of a device buffer's element bits (after the stream's work).
fn fnv(bits: impl Iterator<Item = u32>) -> u64 {
    bits.fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn sum_f32(g: &GpuContext, b: &CudaSlice<f32>) -> R<u64> {
    Ok(fnv(g.stream.clone_dtoh(b)?.iter().map(|v| v.to_bits())))
}

fn sum_bf16(g: &GpuContext, b: &CudaSlice<bf16>) -> R<u64> {
    Ok(fnv(g
        .stream
        .clone_dtoh(b)?
        .iter()
        .map(|v| u32::from(v.to_bits()))))
}

/// Times and checksums the mHC launches at each row count.
pub fn bench(g: &GpuContext, rows: &[usize]) -> R<()> {
    let tile_min = std::env::var("DSV4_HC_TILE_MIN").unwrap_or_else(|_| "default".into());
    let w = &g.kernels.runner.hc_wide;
    println!(
        "blocks per SM: hc_mix_tile24 {}, hc_finish24_wide {}, hc_finish24 {}, hc_post8 {}",
        w.tile
            .occupancy_max_active_blocks_per_multiprocessor(256, TILE_SMEM, None)?,
        w.finish
            .occupancy_max_active_blocks_per_multiprocessor(288, 0, None)?,
        g.kernels.runner.hc_finish[0]
            .occupancy_max_active_blocks_per_multiprocessor(288, 0, None)?,
        w.post
            .occupancy_max_active_blocks_per_multiprocessor(256, 0, None)?
    );
    println!(
        "DSV4_HC_TILE_MIN={tile_min}\n| op | rows | us | GB/s | checksum |\n|---|---|---|---|---|"
    );
    for &m in rows {
        bench_rows(g, m)?;
    }
    Ok(())
}

fn bench_rows(g: &GpuContext, m: usize) -> R<()> {
    let s = &g.stream;
    let nd = 4 * D;
    let x0: Vec<bf16> = rand_f32(m * nd, 1, 1.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let mut x = up(g, &x0)?;
    let func = up(g, &rand_f32(HC_MIX * nd, 2, 0.02))?;
    let base = up(g, &rand_f32(HC_MIX, 3, 1.0))?;
    let scale = up(g, &[0.9f32, 1.1, 1.3])?;
    let norm_w = up(
        g,
        &rand_f32(D, 4, 0.5)
            .iter()
            .map(|v| v + 1.0)
            .collect::<Vec<_>>(),
    )?;
    let mut ws = filled(g, hc_workspace_len(m, D), 0f32)?;
    let mut mix = up(
        g,
        &rand_f32(m * HC_MIX, 5, 0.5)
            .iter()
            .map(|v| v + 0.5)
            .collect::<Vec<_>>(),
    )?;
    let mut y = filled(g, m * D, bf16::ZERO)?;
    let mut yq = filled(g, m * D, bf16::ZERO)?;
    let f: Vec<bf16> = rand_f32(m * D, 6, 1.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let f = up(g, &f)?;
    let routed = up(g, &rand_f32(m * TOPK * D, 7, 1.0))?;
    let shared = up(g, &rand_f32(m * D, 8, 1.0))?;
    let p = |yq_bf16| HcPre {
        rows: m,
        d: D,
        norm_eps: 1e-6,
        hc_eps: 1e-6,
        sinkhorn_iters: 20,
        head: false,
        yq_bf16,
    };
    // Checksums first, from the initial streams: HCPre (FP8 copy of f32), HCPre (attention: no copy), HCPost
    // of each kind.
    let (pf, pa) = (p(false), p(true));
    g.launch_hc_pre(
        s,
        &pf,
        &mut x,
        &func,
        &base,
        &scale,
        &norm_w,
        &mut ws,
        &mut mix,
        &mut y,
        Some(&mut yq),
        None,
        None,
    )?;
    let pre_sums = [sum_bf16(g, &y)?, sum_bf16(g, &yq)?, sum_f32(g, &mix)?];
    g.launch_hc_pre(
        s, &pa, &mut x, &func, &base, &scale, &norm_w, &mut ws, &mut mix, &mut y, None, None, None,
    )?;
    let attn_sum = sum_bf16(g, &y)?;
    g.launch_hc_post(s, m, D, &mut x, &mix, &f)?;
    let post_sum = sum_bf16(g, &x)?;
    g.launch_hc_post_moe(s, m, D, TOPK, &mut x, &mix, &routed, &shared)?;
    let moe_sum = sum_bf16(g, &x)?;
    let streams = (m * nd * 2) as f64;
    let ms = time_ms(g, 10, |_| {
        let yq = Some(&mut yq);
        Ok(g.launch_hc_pre(
            s, &pf, &mut x, &func, &base, &scale, &norm_w, &mut ws, &mut mix, &mut y, yq, None,
            None,
        )?)
    })?;
    let gb = |bytes: f64, ms: f64| bytes / ms / 1e6;
    let row = |op: &str, ms: f64, bytes: f64, sums: String| {
        println!(
            "| {op} | {m} | {:.1} | {:.0} | {sums} |",
            ms * 1e3,
            gb(bytes, ms)
        );
    };
    let hex = |v: &[u64]| {
        v.iter()
            .map(|h| format!("{h:016x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    row(
        "hc_pre ffn (+fp8 copy)",
        ms,
        streams * 2.0 + (m * D * 4) as f64,
        hex(&pre_sums),
    );
    let ms = time_ms(g, 10, |_| {
        Ok(g.launch_hc_pre(
            s, &pa, &mut x, &func, &base, &scale, &norm_w, &mut ws, &mut mix, &mut y, None, None,
            None,
        )?)
    })?;
    row(
        "hc_pre attn",
        ms,
        streams * 2.0 + (m * D * 2) as f64,
        hex(&[attn_sum]),
    );
    let ms = time_ms(g, 10, |_| Ok(g.launch_hc_post(s, m, D, &mut x, &mix, &f)?))?;
    row(
        "hc_post attn",
        ms,
        streams * 2.0 + (m * D * 2) as f64,
        hex(&[post_sum]),
    );
    let ms = time_ms(g, 10, |_| {
        Ok(g.launch_hc_post_moe(s, m, D, TOPK, &mut x, &mix, &routed, &shared)?)
    })?;
    row(
        "hc_post moe",
        ms,
        streams * 2.0 + (m * D * 4 * (TOPK + 1)) as f64,
        hex(&[moe_sum]),
    );
    Ok(())
}
