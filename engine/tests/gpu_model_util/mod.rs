//! Shared helpers of the GPU model tests: cases (golden or synthetic checkpoint + teacher-forced
//! tokens), running them on the GPU backend and on the CPU reference, and row comparisons.
#![allow(dead_code)]

use dsv4_engine::api::Numerics;
use dsv4_engine::backend::{Backend, CpuBackend, Work};
use dsv4_engine::gpu::{GpuBackend, GpuOptions};
use dsv4_engine::model::checkpoint::Checkpoint;
use dsv4_engine::model::synth::{write_checkpoint, SplitMix64, SynthSpec};
use dsv4_engine::reference::Model;
use std::path::{Path, PathBuf};

/// Whether a CUDA GPU is present; prints why the test is skipped when not.
pub fn gpu_or_skip() -> bool {
    match dsv4_engine::gpu::probe_gpu() {
        dsv4_engine::gpu::GpuProbe::Available(_) => true,
        dsv4_engine::gpu::GpuProbe::Unavailable(why) => {
            eprintln!("SKIP: {why}");
            false
        }
    }
}

pub fn data_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("DSV4_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data"),
    };
    dir.exists().then_some(dir)
}

/// A checkpoint and the tokens to feed: `prompt` as one prefill, then `fed` one at a time.
#[derive(Clone)]
pub struct Case {
    pub name: String,
    pub dir: PathBuf,
    pub prompt: Vec<u32>,
    pub fed: Vec<u32>,
}

impl Case {
    pub fn golden(set: &Path) -> Case {
        let text =
            std::fs::read_to_string(set.join("golden/quant/tokens.json")).expect("tokens.json");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        let ids = |k: &str| -> Vec<u32> {
            v[k].as_array()
                .expect(k)
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect()
        };
        Case {
            name: "golden quant".into(),
            dir: set.join("quant"),
            prompt: ids("prompt_ids"),
            fed: ids("decode_fed_ids"),
        }
    }

    /// A synthetic FP8/FP4 checkpoint of other dimensions (hidden 256, 5 layers) in `dir`.
    pub fn synthetic(dir: &Path, prompt: usize, decode: usize) -> Case {
        let mut spec = SynthSpec::tiny_default().with_quantized(true);
        spec.seed = 7;
        write_checkpoint(dir, &spec).expect("synthetic checkpoint");
        let mut rng = SplitMix64::new(11);
        let mut ids = |n: usize| {
            (0..n)
                .map(|_| rng.below(spec.vocab_size as u64) as u32)
                .collect()
        };
        Case {
            name: "synthetic quant".into(),
            dir: dir.to_path_buf(),
            prompt: ids(prompt),
            fed: ids(decode),
        }
    }

    /// The same checkpoint and prompt, then `n` pseudo-random tokens fed one at a time.
    pub fn extended(&self, n: usize, vocab: usize) -> Case {
        let mut rng = SplitMix64::new(29);
        Case {
            name: format!("{} (+{n} steps)", self.name),
            dir: self.dir.clone(),
            prompt: self.prompt.clone(),
            fed: (0..n).map(|_| rng.below(vocab as u64) as u32).collect(),
        }
    }

    pub fn truncated(&self, prompt: usize, decode: usize) -> Case {
        Case {
            name: format!("{} (short)", self.name),
            dir: self.dir.clone(),
            prompt: self.prompt[..prompt].to_vec(),
            fed: self.fed[..decode].to_vec(),
        }
    }
}

pub fn gpu_backend(case: &Case, numerics: Numerics, graphs: bool) -> GpuBackend {
    gpu_backend_with_context(case, numerics, graphs, 2048)
}

pub fn gpu_backend_with_context(
    case: &Case,
    numerics: Numerics,
    graphs: bool,
    max_context: usize,
) -> GpuBackend {
    let opts = GpuOptions {
        numerics,
        max_seqs: 4,
        max_context,
        cuda_graphs: graphs,
        graph_buckets: vec![1, 2, 4],
    };
    GpuBackend::load(&case.dir, &opts).expect("GPU backend")
}

/// Logits rows: after the prompt, then after each fed token.
pub fn teacher_forced(b: &mut dyn Backend, case: &Case) -> Vec<Vec<f32>> {
    let seq = b.create_seq().expect("seq");
    let mut rows = b
        .forward(&[Work {
            seq,
            tokens: &case.prompt,
        }])
        .expect("prefill");
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

pub fn run_gpu(case: &Case, numerics: Numerics, graphs: bool) -> Vec<Vec<f32>> {
    teacher_forced(&mut gpu_backend(case, numerics, graphs), case)
}

pub fn run_cpu(case: &Case, numerics: Numerics) -> Vec<Vec<f32>> {
    let ck = Checkpoint::open(&case.dir).expect("checkpoint");
    let model = Model::from_checkpoint(&ck, numerics).expect("model");
    teacher_forced(&mut CpuBackend::new(model, 4096), case)
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-30)
}

/// (argmax agreement, median row cosine, min row cosine).
pub fn compare(gpu: &[Vec<f32>], cpu: &[Vec<f32>]) -> (f64, f64, f64) {
    assert_eq!(gpu.len(), cpu.len(), "row counts differ");
    let agree = gpu
        .iter()
        .zip(cpu)
        .filter(|(g, c)| argmax(g) == argmax(c))
        .count();
    let mut cos: Vec<f64> = gpu.iter().zip(cpu).map(|(g, c)| cosine(g, c)).collect();
    cos.sort_by(f64::total_cmp);
    (agree as f64 / gpu.len() as f64, cos[cos.len() / 2], cos[0])
}

pub fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Rows of a golden float32 `.npy` logits file (`[rows, vocab]`, C order).
pub fn read_npy_rows(path: &Path) -> Vec<Vec<f32>> {
    let b = std::fs::read(path).expect("read npy");
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = String::from_utf8_lossy(&b[10..10 + hlen]).to_string();
    let shape = header.split("'shape': (").nth(1).expect("shape");
    let vocab: usize = shape
        .split(',')
        .nth(1)
        .expect("2-d")
        .trim()
        .trim_end_matches(')')
        .parse()
        .expect("vocab");
    b[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect::<Vec<f32>>()
        .chunks(vocab)
        .map(<[f32]>::to_vec)
        .collect()
}

/// (median over rows of max |d logit|, argmax agreement): the golden README's smoke gate for
/// engines with the official activation fake-quantisation.
pub fn official_smoke(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f32, f64) {
    assert_eq!(got.len(), want.len(), "row counts differ");
    let mut diffs: Vec<f32> = got.iter().zip(want).map(|(g, w)| max_diff(g, w)).collect();
    diffs.sort_by(f32::total_cmp);
    let agree = got
        .iter()
        .zip(want)
        .filter(|(g, w)| argmax(g) == argmax(w))
        .count();
    (diffs[diffs.len() / 2], agree as f64 / got.len() as f64)
}
