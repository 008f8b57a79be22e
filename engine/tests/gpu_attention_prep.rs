//! `attn_vec_prep` (RMS, RoPE, quantisation mode, bf16 store of q heads, kv rows and indexer queries)
//! against the CPU reference's ops on random vectors of awkward shapes, in one launch of up to three jobs and
//! in ring mode; and its two kernels (warp per vector for many rows, block per vector for few) against each
//! other, bit for bit. Skips without a GPU.
use dsv4_engine::reference::ops::rms_inv;
use dsv4_engine::reference::quant::{fake_quant_fp4, fake_quant_fp8, hadamard, pow2_ceil};
use dsv4_engine::reference::rope::Rope;
use dsv4_kernels::attn::{AttnVecPrep, VecPrepKernel, QUANT_HAD_Q4, QUANT_NONE, QUANT_Q8_NOPE};
use dsv4_kernels::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use dsv4_kernels::{bf16, Gpu, GpuContext};

const EPS: f32 = 1e-6;
const BASE: f64 = 10000.0;

/// One job of a launch: `nvec` vectors of `dim` channels per row.
#[derive(Clone, Copy, Debug)]
struct Shape {
    nvec: usize,
    dim: usize,
    rdim: usize,
    rms: bool,
    norm: bool,
    quant: i32,
    /// Ring rows per slot (ring mode), 0: row-major output.
    window: usize,
}

fn rnd(i: usize, seed: usize) -> f32 {
    let mut z = (i as u64 ^ ((seed as u64) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z ^= z >> 29;
    z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^= z >> 32;
    (z % 2_000_001) as f32 / 1_000_000.0 - 1.0
}

fn freqs(rdim: usize) -> Vec<f32> {
    (0..rdim / 2)
        .map(|i| BASE.powf(-((2 * i) as f64) / rdim as f64) as f32)
        .collect()
}

/// The CPU reference of one vector; also each channel's quantisation step bound (0: not quantised).
fn reference(sh: &Shape, x: &[f32], w: &[f32], pos: usize) -> (Vec<f32>, Vec<f32>) {
    let mut v = x.to_vec();
    if sh.rms {
        let inv = rms_inv(&v, EPS);
        for (i, e) in v.iter_mut().enumerate() {
            *e = if sh.norm { *e * inv * w[i] } else { *e * inv };
        }
    }
    if sh.rdim > 0 {
        Rope::new(sh.rdim, BASE, None).apply(&mut v, pos, false);
    }
    let mut step = vec![0.0f32; sh.dim];
    if sh.quant == QUANT_Q8_NOPE {
        let n = sh.dim - sh.rdim;
        block_steps(&v[..n], 64, 448.0, 1e-4, 0.125, &mut step[..n]);
        fake_quant_fp8(&mut v[..n], 64);
    } else if sh.quant == QUANT_HAD_Q4 {
        hadamard(&mut v);
        block_steps(&v, 32, 6.0, 6.0 * f32::MIN_POSITIVE, 0.5, &mut step);
        fake_quant_fp4(&mut v, 32);
    }
    (v, step)
}

/// The largest gap between neighbouring codes of each channel's block: `rel` of the block's largest code
/// magnitude (`maxv`) times its power-of-two scale.
fn block_steps(v: &[f32], blk: usize, maxv: f32, floor: f32, rel: f32, out: &mut [f32]) {
    for (chunk, o) in v.chunks(blk).zip(out.chunks_mut(blk)) {
        let amax = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let scale = pow2_ceil(amax.max(floor) / maxv);
        o.fill(rel * maxv * scale);
    }
}

struct Job {
    sh: Shape,
    x: Vec<f32>,
    w: Vec<f32>,
    x_dev: CudaSlice<f32>,
    w_dev: CudaSlice<f32>,
    f_dev: CudaSlice<f32>,
    out: CudaSlice<bf16>,
}

fn job(ctx: &GpuContext, sh: Shape, rows: usize, slots: usize, seed: usize) -> Job {
    let s = &ctx.stream;
    let x: Vec<f32> = (0..rows * sh.nvec * sh.dim)
        .map(|i| 2.0 * rnd(i, seed))
        .collect();
    let w: Vec<f32> = (0..sh.dim).map(|i| 1.0 + 0.5 * rnd(i, seed + 1)).collect();
    let out_len = if sh.window > 0 {
        slots * sh.window * sh.dim
    } else {
        rows * sh.nvec * sh.dim
    };
    Job {
        x_dev: s.clone_htod(&x).expect("htod"),
        w_dev: s.clone_htod(&w).expect("htod"),
        f_dev: s.clone_htod(&freqs(sh.rdim.max(2))).expect("htod"),
        out: s.alloc_zeros::<bf16>(out_len).expect("alloc"),
        sh,
        x,
        w,
    }
}

fn params(
    ctx: &GpuContext,
    j: &mut Job,
    pos: &CudaSlice<i32>,
    slots: &CudaSlice<i32>,
) -> AttnVecPrep {
    let s = &ctx.stream;
    AttnVecPrep {
        x: j.x_dev.device_ptr(s).0,
        norm_w: if j.sh.norm {
            j.w_dev.device_ptr(s).0
        } else {
            0
        },
        freqs: j.f_dev.device_ptr(s).0,
        slots: slots.device_ptr(s).0,
        positions: pos.device_ptr(s).0,
        out: j.out.device_ptr_mut(s).0,
        x_stride: (j.sh.nvec * j.sh.dim) as i32,
        dim: j.sh.dim as i32,
        rdim: j.sh.rdim as i32,
        rms: i32::from(j.sh.rms),
        quant: j.sh.quant,
        window: j.sh.window as i32,
        eps: EPS,
        ..Default::default()
    }
}

/// Compares a job's output with the reference: every channel within bf16 rounding (2^-7 relative), except
/// quantisation flips (the GPU sums the RMS in f32, the reference in f64, so a value within an ulp of a
/// rounding boundary may round the other way): each within one code step of its block, and rare.
fn check(
    ctx: &GpuContext,
    j: &Job,
    rows: usize,
    positions: &[i32],
    slots: &[i32],
) -> (usize, usize) {
    let got = ctx.stream.clone_dtoh(&j.out).expect("dtoh");
    let (sh, mut flips, mut quantised) = (&j.sh, 0, 0);
    for r in 0..rows {
        for v in 0..sh.nvec {
            let at = (r * sh.nvec + v) * sh.dim;
            let pos = positions[r] as usize;
            let (want, step) = reference(sh, &j.x[at..at + sh.dim], &j.w, pos);
            let dst = if sh.window > 0 {
                (slots[r] as usize * sh.window + pos % sh.window) * sh.dim
            } else {
                at
            };
            // RoPE's a cos - b sin may cancel: the GPU's fused multiply-add rounds once less than the
            // reference's two products, a difference of an ulp of the vector's largest values.
            let vmax = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            for c in 0..sh.dim {
                let (g, w) = (got[dst + c].to_f32(), want[c]);
                let err = (g - w).abs();
                quantised += usize::from(step[c] > 0.0);
                if err <= w.abs() * 2f32.powi(-7) + vmax * 2f32.powi(-22) {
                    continue;
                }
                assert!(
                    step[c] > 0.0 && err <= step[c],
                    "{sh:?} row {r} vec {v} ch {c}: gpu {g} cpu {w}"
                );
                flips += 1;
            }
        }
    }
    (flips, quantised)
}

fn gpu() -> Option<GpuContext> {
    if !matches!(Gpu::probe(), Ok(Some(_))) {
        eprintln!("SKIP gpu_attention_prep: no usable GPU");
        return None;
    }
    Some(GpuContext::new(0).expect("context"))
}

/// One launch of `shapes` over `rows` rows on `kind`, finished: the jobs (outputs still on the device), the
/// rows' positions and their ring slots.
fn launch(
    ctx: &GpuContext,
    shapes: &[Shape],
    rows: usize,
    seed: usize,
    kind: VecPrepKernel,
) -> (Vec<Job>, Vec<i32>, Vec<i32>) {
    let s = &ctx.stream;
    // Distinct ring rows per slot: each row its own slot (positions may collide modulo the window).
    let slots: Vec<i32> = (0..rows as i32).collect();
    let positions: Vec<i32> = (0..rows)
        .map(|r| ((rnd(r, seed + 7).abs() * 70_000.0) as i32) + r as i32)
        .collect();
    let (pos_dev, slot_dev) = (
        s.clone_htod(&positions).expect("htod"),
        s.clone_htod(&slots).expect("htod"),
    );
    let mut jobs: Vec<Job> = shapes
        .iter()
        .enumerate()
        .map(|(i, &sh)| job(ctx, sh, rows, rows, seed + 10 * i))
        .collect();
    let p: Vec<(usize, AttnVecPrep)> = jobs
        .iter_mut()
        .map(|j| (j.sh.nvec, params(ctx, j, &pos_dev, &slot_dev)))
        .collect();
    // SAFETY: each job's x holds rows x nvec x dim f32, out its rows x nvec x dim (or slots x window x dim)
    // bf16, freqs rdim/2 f32, norm_w dim f32; positions and slots hold `rows` ints.
    unsafe { ctx.launch_attn_vec_prep_on(s, rows, &p, kind) }.expect("launch");
    s.synchronize().expect("sync");
    (jobs, positions, slots)
}

fn run_launch(ctx: &GpuContext, shapes: &[Shape], rows: usize, seed: usize, kind: VecPrepKernel) {
    let (jobs, positions, slots) = launch(ctx, shapes, rows, seed, kind);
    for j in &jobs {
        let (flips, quantised) = check(ctx, j, rows, &positions, &slots);
        println!(
            "{kind:?} {:?} rows {rows}: {flips} flips of {quantised} quantised",
            j.sh
        );
        assert!(flips * 500 <= quantised.max(1), "{:?}: {flips} flips", j.sh);
    }
}

const fn shape(nvec: usize, dim: usize, rdim: usize, rms: bool, norm: bool, quant: i32) -> Shape {
    Shape {
        nvec,
        dim,
        rdim,
        rms,
        norm,
        quant,
        window: 0,
    }
}

/// The Flash shapes: q heads (weightless RMS, RoPE), the kv row (RMS with weights, RoPE, Q8 of the non-RoPE
/// channels), indexer queries (RoPE, Hadamard, Q4), in one launch as decode does; the kv row in ring mode;
/// then awkward ones: vector counts not a multiple of 4 per block, dims not a multiple of 32, a partial last
/// Q8 block, RoPE over every channel, no RoPE, small and large Hadamards.
fn launches() -> Vec<(Vec<Shape>, usize)> {
    let q = shape(64, 512, 64, true, false, QUANT_NONE);
    let kv = shape(1, 512, 64, true, true, QUANT_Q8_NOPE);
    let iq = shape(64, 128, 64, false, false, QUANT_HAD_Q4);
    vec![
        (vec![q, kv, iq], 37),
        (vec![q], 300),
        (vec![Shape { window: 5, ..kv }], 9),
        (
            vec![
                shape(13, 200, 40, true, true, QUANT_Q8_NOPE),
                shape(17, 96, 96, true, false, QUANT_NONE),
                shape(3, 330, 0, true, true, QUANT_Q8_NOPE),
            ],
            11,
        ),
        (
            vec![
                shape(5, 16, 8, false, false, QUANT_HAD_Q4),
                shape(33, 512, 64, true, false, QUANT_HAD_Q4),
                shape(2, 64, 0, false, false, QUANT_HAD_Q4),
            ],
            7,
        ),
    ]
}

#[test]
fn vec_prep_matches_reference() {
    let Some(ctx) = gpu() else { return };
    for kind in [VecPrepKernel::WarpPerVector, VecPrepKernel::BlockPerVector] {
        for (seed, (shapes, rows)) in launches().into_iter().enumerate() {
            run_launch(&ctx, &shapes, rows, seed, kind);
        }
    }
}

/// The outputs of one launch on `kind`, per job, as bf16 bits.
fn outputs(
    ctx: &GpuContext,
    shapes: &[Shape],
    rows: usize,
    seed: usize,
    kind: VecPrepKernel,
) -> Vec<Vec<u16>> {
    let (jobs, _, _) = launch(ctx, shapes, rows, seed, kind);
    jobs.iter()
        .map(|j| {
            let got = ctx.stream.clone_dtoh(&j.out).expect("dtoh");
            got.iter().map(|b| b.to_bits()).collect()
        })
        .collect()
}

#[test]
fn both_kernels_give_the_same_bits() {
    let Some(ctx) = gpu() else { return };
    for (seed, (shapes, rows)) in launches().into_iter().enumerate() {
        let wide = outputs(&ctx, &shapes, rows, seed, VecPrepKernel::WarpPerVector);
        let small = outputs(&ctx, &shapes, rows, seed, VecPrepKernel::BlockPerVector);
        for (sh, (a, b)) in shapes.iter().zip(wide.iter().zip(&small)) {
            let bad = a.iter().zip(b).filter(|(x, y)| x != y).count();
            println!("{sh:?} rows {rows}: {bad} of {} differ", a.len());
            assert_eq!(bad, 0, "{sh:?}");
        }
    }
}

/// The CPU reference of attn_row_prep without a norm: gather group-major `[groups, rows, width]` into rows,
/// then the FP8 fake quant in blocks of `blk` (0: none).
fn row_reference(x: &[f32], groups: usize, rows: usize, width: usize, blk: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for r in 0..rows {
        let mut row: Vec<f32> = (0..groups)
            .flat_map(|g| x[(g * rows + r) * width..][..width].iter().copied())
            .collect();
        if blk > 0 {
            fake_quant_fp8(&mut row, blk);
        }
        out.extend(row);
    }
    out
}

/// attn_row_prep without a norm, f32 and bf16 inputs, with and without the quantiser, on both kernels (the
/// warp-per-block one where the shape allows): bit for bit the CPU reference (no reduction order involved).
#[test]
fn row_prep_without_norm_is_the_reference_bits() {
    let Some(ctx) = gpu() else { return };
    let s = &ctx.stream;
    let shapes = [
        (3, 300, 256),
        (8, 129, 1024),
        (1, 131, 4096),
        (2, 200, 192),
        (8, 1, 1024),
        (8, 3, 1024),
        (1, 1, 4096),
    ];
    for (groups, rows, width) in shapes {
        let n = rows * groups * width;
        // Magnitudes over many binades, so the blocks' scales differ.
        let x: Vec<f32> = (0..n)
            .map(|i| rnd(i, 9) * 2f32.powi((i / 128 % 17) as i32 - 8))
            .collect();
        let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        let x_dev = s.clone_htod(&x).expect("htod");
        let xb_dev = s.clone_htod(&xb).expect("htod");
        for (x_f32, blk, wide) in [
            (1, 128, true),
            (0, 128, true),
            (1, 0, true),
            (1, 128, false),
        ] {
            let input: Vec<f32> = if x_f32 == 1 {
                x.clone()
            } else {
                xb.iter().map(|v| v.to_f32()).collect()
            };
            let want = row_reference(&input, groups, rows, width, blk);
            let mut out = s.alloc_zeros::<bf16>(n).expect("alloc");
            let p = dsv4_kernels::attn::AttnRowPrep {
                x: if x_f32 == 1 {
                    x_dev.device_ptr(s).0
                } else {
                    xb_dev.device_ptr(s).0
                },
                out: out.device_ptr_mut(s).0,
                x_f32,
                groups: groups as i32,
                rows: rows as i32,
                width: width as i32,
                quant_blk: blk as i32,
                ..Default::default()
            };
            // SAFETY: x holds groups x rows x width values of the declared type, out rows x groups x width bf16.
            unsafe { ctx.launch_attn_row_prep_on(s, &p, wide) }.expect("launch");
            let got = s.clone_dtoh(&out).expect("dtoh");
            let bad = got
                .iter()
                .zip(&want)
                .filter(|(g, w)| g.to_bits() != bf16::from_f32(**w).to_bits())
                .count();
            println!("row_prep {groups}x{rows}x{width} f32 {x_f32} blk {blk} wide {wide}: {bad} of {n} differ");
            assert_eq!(bad, 0);
        }
    }
}

/// attn_row_prep with a norm (the q_lora norm before wq_b) on both kernels, with and without the quantiser:
/// attn_row_norm_quant (a warp per 128-value block, `wide`) and the shared-row attn_row_prep give the same bits,
/// from one row (decode) to many, at widths up to the warp kernel's 2048.
#[test]
fn row_prep_with_norm_both_kernels_same_bits() {
    let Some(ctx) = gpu() else { return };
    let s = &ctx.stream;
    for (seed, (rows, width)) in [(1, 1024), (3, 1536), (8, 2048), (200, 512), (1, 128)]
        .into_iter()
        .enumerate()
    {
        let n = rows * width;
        let x: Vec<f32> = (0..n)
            .map(|i| rnd(i, 20 + seed) * 2f32.powi((i / 128 % 13) as i32 - 6))
            .collect();
        let w: Vec<f32> = (0..width).map(|i| 1.0 + 0.5 * rnd(i, 40 + seed)).collect();
        let x_dev = s.clone_htod(&x).expect("htod");
        let w_dev = s.clone_htod(&w).expect("htod");
        for blk in [128, 0] {
            let outs: Vec<Vec<u16>> = [true, false]
                .into_iter()
                .map(|wide| {
                    let mut out = s.alloc_zeros::<bf16>(n).expect("alloc");
                    let p = dsv4_kernels::attn::AttnRowPrep {
                        x: x_dev.device_ptr(s).0,
                        norm_w: w_dev.device_ptr(s).0,
                        out: out.device_ptr_mut(s).0,
                        x_f32: 1,
                        groups: 1,
                        rows: rows as i32,
                        width: width as i32,
                        quant_blk: blk,
                        eps: EPS,
                        ..Default::default()
                    };
                    // SAFETY: x holds rows x width f32, norm_w width f32, out rows x width bf16.
                    unsafe { ctx.launch_attn_row_prep_on(s, &p, wide) }.expect("launch");
                    let got = s.clone_dtoh(&out).expect("dtoh");
                    got.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            let bad = outs[0].iter().zip(&outs[1]).filter(|(a, b)| a != b).count();
            println!("row_prep norm {rows}x{width} blk {blk}: {bad} of {n} differ");
            assert_eq!(bad, 0, "{rows}x{width} blk {blk}");
            assert!(outs[0].iter().any(|&v| v != 0), "{rows}x{width}: all zero");
        }
    }
}

/// The FP8 codes and scales both warp-per-block kernels write beside their bf16 output (the FP8-activation
/// GEMV's input): code x scale is the bf16 output bit for bit, and each scale is the block's fake-quant scale
/// (for the norm-free kernel, from the reference's own amax).
#[test]
fn row_prep_codes_are_the_fake_quant() {
    let Some(ctx) = gpu() else { return };
    let s = &ctx.stream;
    let e4m3 = dsv4_kernels::reference::formats::e4m3_to_f32;
    // (groups, rows, width, norm): attn_row_quant regrouping, attn_row_norm_quant on the q_lora shape.
    for (seed, (groups, rows, width, norm)) in [
        (8, 3, 1024, false),
        (1, 17, 4096, false),
        (1, 5, 1024, true),
        (1, 33, 1536, true),
    ]
    .into_iter()
    .enumerate()
    {
        let n = groups * rows * width;
        let x: Vec<f32> = (0..n)
            .map(|i| rnd(i, 60 + seed) * 2f32.powi((i / 128 % 15) as i32 - 7))
            .collect();
        let w: Vec<f32> = (0..width).map(|i| 1.0 + 0.5 * rnd(i, 80 + seed)).collect();
        let (x_dev, w_dev) = (
            s.clone_htod(&x).expect("htod"),
            s.clone_htod(&w).expect("htod"),
        );
        let mut out = s.alloc_zeros::<bf16>(n).expect("alloc");
        let mut q8 = s.alloc_zeros::<u8>(n).expect("alloc");
        let mut sc = s.alloc_zeros::<f32>(n / 128).expect("alloc");
        let p = dsv4_kernels::attn::AttnRowPrep {
            x: x_dev.device_ptr(s).0,
            norm_w: if norm { w_dev.device_ptr(s).0 } else { 0 },
            out: out.device_ptr_mut(s).0,
            q8: q8.device_ptr_mut(s).0,
            q8_scales: sc.device_ptr_mut(s).0,
            x_f32: 1,
            groups: groups as i32,
            rows: rows as i32,
            width: width as i32,
            quant_blk: 128,
            eps: EPS,
        };
        assert!(
            ctx.row_prep_q8_ok(&p),
            "{groups}x{rows}x{width}: no code-writing kernel"
        );
        // SAFETY: x holds groups x rows x width f32, norm_w width f32, out / q8 n values, sc n / 128 scales.
        unsafe { ctx.launch_attn_row_prep(s, &p) }.expect("launch");
        let (got, codes, scales) = (
            s.clone_dtoh(&out).expect("dtoh"),
            s.clone_dtoh(&q8).expect("dtoh"),
            s.clone_dtoh(&sc).expect("dtoh"),
        );
        let bad = (0..n)
            .filter(|&i| {
                bf16::from_f32(e4m3(codes[i]) * scales[i / 128]).to_bits() != got[i].to_bits()
            })
            .count();
        println!("row_prep codes {groups}x{rows}x{width} norm {norm}: {bad} of {n} differ from the bf16 output");
        assert_eq!(bad, 0);
        if !norm {
            let raw = row_reference(&x, groups, rows, width, 0);
            for (b, blk) in raw.chunks(128).enumerate() {
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert_eq!(scales[b], pow2_ceil(amax.max(1e-4) / 448.0), "block {b}");
            }
        }
    }
}
