//! The device sampler (`sample_rows`, kernels/cuda/sample_filters.cu) against the host's
//! `sampler::pick`, which specifies it: for the same logits and the same draw (filters plus the
//! uniform number), the same token, on rows of awkward vocabulary sizes with ties, NaN and
//! infinities, every filter alone and together, greedy and sampled rows mixed in one launch.
//! Then the GPU backend's `forward_pick` (device sampling after the step) against `pick` on the
//! logits its `forward` returns for the same batch. Skips without a GPU.
mod gpu_model_util;

use dsv4_engine::api::Numerics;
use dsv4_engine::sampler::{pick, Draw, Rng};
use dsv4_kernels::{Gpu, GpuContext, SAMPLE_PARAMS_PER_ROW};
use gpu_model_util::{assert_device_picks_match, data_dir, gpu_backend, Case};

fn gpu() -> Option<GpuContext> {
    match Gpu::probe() {
        Ok(Some(_)) => Some(GpuContext::new(0).expect("GPU context")),
        other => {
            eprintln!("SKIP gpu_sampling: no usable GPU ({other:?})");
            None
        }
    }
}

/// Logits shaped like a model's (a few strong tokens over a wide tail), with exact ties: values
/// are quantised to 1/64 so many tokens share a weight.
fn logits(vocab: usize, rng: &mut Rng, tied: bool) -> Vec<f32> {
    (0..vocab)
        .map(|_| {
            let u = rng.next_f64() as f32;
            let l = if u > 0.999 {
                6.0 + 4.0 * u
            } else {
                4.0 * u - 2.0
            };
            if tied {
                (l * 64.0).round() / 64.0
            } else {
                l
            }
        })
        .collect()
}

/// Every combination of filters the product can send, plus greedy rows and wild values.
fn draws(rng: &mut Rng) -> Vec<Draw> {
    let mut out = Vec::new();
    for &temperature in &[0.0f32, 0.3, 1.0, 1.7] {
        for &top_k in &[0u32, 1, 5, 40, 1000] {
            for &top_p in &[1.0f32, 0.95, 0.5, 1e-6] {
                for &min_p in &[0.0f32, 0.05, 0.5] {
                    out.push(Draw {
                        temperature,
                        top_k,
                        top_p,
                        min_p,
                        uniform: rng.next_f64(),
                    });
                }
            }
        }
    }
    out.push(Draw {
        temperature: f32::NAN,
        ..Draw::GREEDY
    });
    out.push(Draw {
        temperature: 1e-40,
        uniform: 0.5,
        ..Draw::GREEDY
    });
    out.push(Draw {
        temperature: 1.0,
        top_p: 2.0,
        min_p: 7.0,
        uniform: 0.999_999,
        ..Draw::GREEDY
    });
    out
}

fn params(draws: &[Draw]) -> Vec<f64> {
    draws
        .iter()
        .flat_map(|d| {
            [
                f64::from(d.temperature),
                f64::from(d.top_k),
                f64::from(d.top_p),
                f64::from(d.min_p),
                d.uniform,
            ]
        })
        .collect()
}

/// Samples every (row, draw) pair on the device, one launch per batch of rows.
fn device_picks(ctx: &GpuContext, rows: &[Vec<f32>], draws: &[Draw]) -> Vec<i32> {
    let s = &ctx.stream;
    let vocab = rows[0].len();
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let p = params(draws);
    assert_eq!(p.len(), rows.len() * SAMPLE_PARAMS_PER_ROW);
    let ld = s.clone_htod(&flat).expect("logits");
    let pd = s.clone_htod(&p).expect("params");
    let mut scratch = s.alloc_zeros::<f32>(flat.len()).expect("scratch");
    let mut out = s.alloc_zeros::<i32>(rows.len()).expect("out");
    ctx.launch_sample_rows(s, rows.len(), vocab, &ld, &pd, &mut scratch, &mut out)
        .expect("launch");
    s.clone_dtoh(&out).expect("read")
}

fn check_vocab(ctx: &GpuContext, vocab: usize, tied: bool, seed: u64) {
    let mut rng = Rng::from_seed(seed);
    let draws = draws(&mut rng);
    let base: Vec<Vec<f32>> = (0..3).map(|_| logits(vocab, &mut rng, tied)).collect();
    let rows: Vec<Vec<f32>> = (0..draws.len())
        .map(|i| base[i % base.len()].clone())
        .collect();
    let got = device_picks(ctx, &rows, &draws);
    let mut differ = Vec::new();
    for (i, (row, d)) in rows.iter().zip(&draws).enumerate() {
        let want = pick(row, d);
        if got[i] as u32 != want {
            differ.push((i, *d, want, got[i]));
        }
    }
    assert!(
        differ.is_empty(),
        "vocab {vocab} tied {tied}: {} of {} picks differ, first: {:?}",
        differ.len(),
        draws.len(),
        differ.first()
    );
}

#[test]
fn device_picks_equal_host_picks() {
    let Some(ctx) = gpu() else { return };
    for (i, &vocab) in [1usize, 3, 1023, 1025, 4099, 129_280].iter().enumerate() {
        check_vocab(&ctx, vocab, false, 10 + i as u64);
        check_vocab(&ctx, vocab, true, 20 + i as u64);
    }
}

#[test]
fn many_uniforms_on_one_row_cover_the_distribution() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::from_seed(5);
    let row = logits(129_280, &mut rng, true);
    let draws: Vec<Draw> = (0..512)
        .map(|i| Draw {
            temperature: 0.8,
            top_k: if i % 2 == 0 { 0 } else { 64 },
            top_p: 0.9,
            min_p: 0.0,
            uniform: (i as f64 + 0.5) / 512.0,
        })
        .collect();
    let rows = vec![row.clone(); draws.len()];
    let got = device_picks(&ctx, &rows, &draws);
    let want: Vec<i32> = draws.iter().map(|d| pick(&row, d) as i32).collect();
    assert_eq!(got, want);
    let distinct: std::collections::HashSet<i32> = got.iter().copied().collect();
    assert!(
        distinct.len() > 8,
        "only {} distinct tokens",
        distinct.len()
    );
}

#[test]
fn degenerate_rows_fall_back_like_the_host() {
    let Some(ctx) = gpu() else { return };
    let d = Draw {
        temperature: 1.0,
        top_k: 5,
        top_p: 0.5,
        min_p: 0.5,
        uniform: 0.3,
    };
    let rows = [
        vec![f32::NAN, f32::NEG_INFINITY, 0.0],
        vec![f32::NEG_INFINITY; 3],
        vec![f32::NEG_INFINITY, 2.0, f32::NAN],
        vec![1.0, f32::INFINITY, 3.0],
        vec![f32::NAN; 3],
    ];
    for row in &rows {
        let got = device_picks(&ctx, std::slice::from_ref(row), &[d]);
        assert_eq!(got[0] as u32, pick(row, &d), "row {row:?}");
    }
}

/// Two backends fed the same tokens: one returns logits (picked on the host), the other picks on
/// the device; a mixed batch (sampled, greedy, filtered rows) over several decode steps.
#[test]
fn backend_device_picks_equal_host_picks_on_its_logits() {
    if gpu().is_none() {
        return;
    }
    let Some(data) = data_dir() else {
        eprintln!("SKIP: tests/data not found");
        return;
    };
    let case = Case::golden(&data.join("tiny-v4-small"));
    let mut host = gpu_backend(&case, Numerics::Official, true);
    let mut device = gpu_backend(&case, Numerics::Official, true);
    let first = vec![
        case.prompt[..40].to_vec(),
        case.prompt[40..47].to_vec(),
        case.prompt[60..61].to_vec(),
    ];
    let mut rng = Rng::from_seed(99);
    let mut draws = |_step: usize, row: usize| Draw {
        temperature: [1.0, 0.0, 0.7][row],
        top_k: [0, 0, 20][row],
        top_p: [1.0, 1.0, 0.9][row],
        min_p: [0.0, 0.0, 0.02][row],
        uniform: rng.next_f64(),
    };
    assert_device_picks_match(&mut host, &mut device, first, 6, &mut draws);
}
