//! Batched GPU prefill against the CPU reference on tiny FP8/FP4 checkpoints: the logits of EVERY prompt
//! position, prefilled in one call and in uneven chunks (both numerics, the GPU model tests' gates), and
//! decode after a batched prefill against decode after a token-by-token prefill (logits and the attention
//! state the prefill leaves). SKIPs (passes with a message) without a CUDA GPU.

mod gpu_model_util;

use dsv4_engine::api::Numerics;
use dsv4_engine::backend::{Backend, SeqId, Work};
use dsv4_engine::gpu::attention::AttnState;
use dsv4_engine::gpu::GpuBackend;
use dsv4_engine::model::checkpoint::Checkpoint;
use dsv4_engine::reference::{BatchItem, ForwardOptions, Model, SeqState};
use dsv4_kernels::bf16;
use gpu_model_util::*;

/// The gates of gpu_model.rs: reference numerics `check_reference_gate` (median cosine >= 0.999,
/// agreement >= 0.95 over the rows the rounding cannot decide);
/// official numerics median row max |dlogit| <= 1 and argmax agreement >= 0.7.
fn check(name: &str, numerics: Numerics, got: &[Vec<f32>], want: &[Vec<f32>]) {
    let (agree, median, min) = compare(got, want);
    let (dmed, _) = official_smoke(got, want);
    eprintln!(
        "{name} {numerics:?}: {} rows, argmax agreement {agree:.3}, median cosine {median:.6}, min {min:.6}, median max|dlogit| {dmed:.4}",
        got.len()
    );
    let missed: Vec<usize> = (0..got.len())
        .filter(|&r| argmax(&got[r]) != argmax(&want[r]))
        .collect();
    eprintln!("  rows whose argmax differs: {missed:?}");
    if numerics == Numerics::Reference {
        check_reference_gate(name, got, want);
    } else {
        assert!(dmed <= 1.0 && agree >= 0.7, "{name}: {dmed} / {agree}");
    }
}

/// The CPU reference after the prompt: its state and the logits of every prompt position.
fn cpu_prompt(case: &Case, numerics: Numerics) -> (SeqState, Vec<Vec<f32>>) {
    let ck = Checkpoint::open(&case.dir).expect("checkpoint");
    let model = Model::from_checkpoint(&ck, numerics).expect("model");
    let mut state = model.new_state();
    let mut batch = [BatchItem {
        state: &mut state,
        tokens: &case.prompt,
    }];
    let out = model.forward(&mut batch, ForwardOptions { all_logits: true });
    let v = model.cfg.vocab_size;
    let rows = out[0].logits.chunks(v).map(<[f32]>::to_vec).collect();
    (state, rows)
}

/// The GPU's logits of every prompt position: `(n, false)` prefills n tokens in one call, `(n, true)` feeds n
/// tokens as decode steps; the rest of the prompt is prefilled in one more call.
fn gpu_every_position(case: &Case, numerics: Numerics, steps: &[(usize, bool)]) -> Vec<Vec<f32>> {
    let mut b = gpu_backend(case, numerics, true);
    let seq = b.create_seq().expect("seq");
    let mut rows = Vec::new();
    let mut at = 0usize;
    for &(n, decode) in steps.iter().chain(std::iter::once(&(usize::MAX, false))) {
        let end = at.saturating_add(n).min(case.prompt.len());
        if decode {
            for t in &case.prompt[at..end] {
                let w = Work {
                    seq,
                    tokens: std::slice::from_ref(t),
                };
                rows.extend(b.forward(&[w]).expect("decode step"));
            }
        } else if end > at {
            rows.extend(
                b.prefill_logits(seq, &case.prompt[at..end])
                    .expect("prefill"),
            );
        }
        at = end;
    }
    assert_eq!(b.seq_len(seq).expect("len"), case.prompt.len());
    rows
}

fn cases(tmp: &std::path::Path) -> Vec<Case> {
    let mut v = vec![Case::synthetic(tmp, 150, 40)];
    match data_dir() {
        Some(d) => v.push(Case::golden(&d.join("tiny-v4-small"))),
        None => eprintln!("SKIP golden case: tests/data/tiny-v4-small not found"),
    }
    v
}

#[test]
fn prefill_every_position_matches_cpu_reference() {
    if !gpu_or_skip() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    for case in cases(tmp.path()) {
        for numerics in [Numerics::Reference, Numerics::Official] {
            let (_, want) = cpu_prompt(&case, numerics);
            let one = gpu_every_position(&case, numerics, &[]);
            check(&format!("{} one call", case.name), numerics, &one, &want);
            // Uneven: one token, a window boundary crossed mid-call, single tokens, a long tail.
            let uneven: Vec<(usize, bool)> = [1, 37, 5, 1, 90, 2].map(|n| (n, false)).to_vec();
            let got = gpu_every_position(&case, numerics, &uneven);
            check(
                &format!("{} uneven calls", case.name),
                numerics,
                &got,
                &want,
            );
            // Prefill continuing from decode steps and decode continuing from prefill.
            let mixed = [(20, false), (9, true), (41, false), (3, true), (30, false)];
            let got = gpu_every_position(&case, numerics, &mixed);
            check(
                &format!("{} prefill and decode mixed", case.name),
                numerics,
                &got,
                &want,
            );
        }
    }
}

/// Logits rows of `case` with the prompt fed one token per forward (decode steps), then the fed tokens.
fn token_by_token(b: &mut GpuBackend, case: &Case) -> (SeqId, Vec<Vec<f32>>) {
    let seq = b.create_seq().expect("seq");
    let mut last = Vec::new();
    for t in &case.prompt {
        last = b
            .forward(&[Work {
                seq,
                tokens: std::slice::from_ref(t),
            }])
            .expect("step");
    }
    (seq, last)
}

fn decode_rows(b: &mut GpuBackend, seq: SeqId, case: &Case, first: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
    let mut rows = first;
    for t in &case.fed {
        rows.extend(
            b.forward(&[Work {
                seq,
                tokens: std::slice::from_ref(t),
            }])
            .expect("decode"),
        );
    }
    rows
}

fn dl_bf16(b: &GpuBackend, s: &dsv4_kernels::cudarc::driver::CudaSlice<bf16>) -> Vec<f32> {
    let v = b.model().ctx.stream.clone_dtoh(s).expect("dtoh");
    v.iter().map(|x| x.to_f32()).collect()
}

fn dl_f32(b: &GpuBackend, s: &dsv4_kernels::cudarc::driver::CudaSlice<f32>) -> Vec<f32> {
    b.model().ctx.stream.clone_dtoh(s).expect("dtoh")
}

/// ||a - b|| / ||b|| over the finite elements; panics when a row (`width` values) was written by one path
/// only: -inf (an unwritten gamma) or an all-zero row (an unwritten cache entry or kappa row) in one of them.
fn state_diff(what: &str, a: &[f32], b: &[f32], width: usize) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (r, (x, y)) in a.chunks(width).zip(b.chunks(width)).enumerate() {
        let pattern = |v: &[f32]| {
            (
                v.iter().all(|&e| e == 0.0),
                v.iter().map(|e| e.is_finite()).collect::<Vec<_>>(),
            )
        };
        assert!(
            pattern(x) == pattern(y),
            "{what}: row {r} written by one path only"
        );
        for (&p, &q) in x.iter().zip(y).filter(|(p, _)| p.is_finite()) {
            num += f64::from(p - q).powi(2);
            den += f64::from(q).powi(2);
        }
    }
    (num / den.max(1e-30)).sqrt()
}

/// Every state array of one layer (name, row width for the written/unwritten pattern, values).
fn layer_arrays(b: &GpuBackend, s: &AttnState) -> Vec<(&'static str, usize, Vec<f32>)> {
    let mut v = vec![("ring", s.dim, dl_bf16(b, &s.ring))];
    for (name, c) in [("comp", &s.comp), ("index", &s.index)] {
        if let Some(c) = c {
            // State rows are 1 or 2 x dim wide: dim-wide pieces keep the written/unwritten pattern.
            v.push((name, c.dim, dl_bf16(b, &c.cache)));
            v.push(("comp state kv", c.dim, dl_f32(b, &c.kv)));
            v.push(("comp state gamma", c.dim, dl_f32(b, &c.sc)));
        }
    }
    v
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Compares the attention state of slot 0 after the prompt: batched against stepped (which rows are written
/// must agree exactly), and prints each one's distance to the CPU reference's caches. (The values are checked
/// tightly on identical layer inputs in gpu_prefill_attn.rs; here upstream rounding differences grow through
/// the layers, so only the written/unwritten pattern is asserted.)
fn compare_states(a: &GpuBackend, b: &GpuBackend, cpu: &SeqState) {
    for (l, (sa, sb)) in a.model().states.iter().zip(&b.model().states).enumerate() {
        let (xa, xb) = (layer_arrays(a, sa), layer_arrays(b, sb));
        for ((name, width, x), (_, _, y)) in xa.iter().zip(&xb) {
            let d = state_diff(&format!("layer {l} {name}"), x, y, *width);
            eprintln!("  layer {l} {name}: batched vs stepped rel L2 {d:.2e}");
        }
        let c = &cpu.layers[l];
        for (i, (name, want)) in [
            ("ring", &c.window),
            ("comp", &c.compressed),
            ("index", &c.index_keys),
        ]
        .into_iter()
        .enumerate()
        .filter(|(_, (_, w))| !w.is_empty())
        {
            let pick = |arrs: &[(&'static str, usize, Vec<f32>)]| -> Vec<f32> {
                let k = [0, 1, 4][i].min(arrs.len() - 1);
                arrs[k].2[..want.len()].to_vec()
            };
            let (ea, eb) = (rel(&pick(&xa), want), rel(&pick(&xb), want));
            eprintln!("  layer {l} {name} vs CPU: batched {ea:.2e}, stepped {eb:.2e}");
        }
    }
}

#[test]
fn decode_after_prefill_matches_token_by_token() {
    if !gpu_or_skip() {
        return;
    }
    let Some(dir) = data_dir() else {
        eprintln!("SKIP: tests/data/tiny-v4-small not found");
        return;
    };
    let case = Case::golden(&dir.join("tiny-v4-small"));
    for numerics in [Numerics::Reference, Numerics::Official] {
        let mut stepped = gpu_backend(&case, numerics, true);
        let (s1, first) = token_by_token(&mut stepped, &case);
        let mut batched = gpu_backend(&case, numerics, true);
        let s2 = batched.create_seq().expect("seq");
        let pre = batched
            .forward(&[Work {
                seq: s2,
                tokens: &case.prompt,
            }])
            .expect("prefill");
        eprintln!("{numerics:?}: attention state after the prompt");
        let (cpu, _) = cpu_prompt(&case, numerics);
        compare_states(&batched, &stepped, &cpu);
        let a = decode_rows(&mut batched, s2, &case, pre);
        let b = decode_rows(&mut stepped, s1, &case, first);
        let cpu_rows = run_cpu(&case, numerics);
        let (agree, median, _) = compare(&b, &cpu_rows);
        let (dmed, _) = official_smoke(&b, &cpu_rows);
        eprintln!("  for scale, decode after stepped prefill vs CPU: agreement {agree:.3}, median cosine {median:.6}, median max|dlogit| {dmed:.4}");
        check("decode after batched vs stepped prefill", numerics, &a, &b);
        check(
            "decode after batched prefill vs CPU",
            numerics,
            &a,
            &run_cpu(&case, numerics),
        );
    }
}
