//! Loading the split model onto GPU ranks from a many-shard checkpoint: shards read in parallel with
//! progress straight onto the GPU, the same model as a plain load; a shard that goes missing or a read
//! that fails mid-load gives an error naming the file and leaves no GPU memory behind; a model that
//! cannot fit is refused before anything is read. SKIPs without a GPU.

mod parallel_common;

use dsv4_engine::api::{Numerics, SplitMode};
use dsv4_engine::backend::{Backend, Work};
use dsv4_engine::gpu::multi::load::{
    contexts, free_memory, gpu_plan, load_rank_weights, read_config,
};
use dsv4_engine::gpu::multi::{MultiGpuBackend, MultiOptions};
use dsv4_engine::gpu::{probe_gpu, GpuOptions, GpuProbe, RunnerError};
use dsv4_engine::model::synth::{shard_name, write_checkpoint, SynthSpec};
use dsv4_engine::parallel::load::{LoadError, LoadOptions, Progress};
use dsv4_engine::parallel::LoadSettings;
use parallel_common::{tokens, FailingReader, SlowReader};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SHARDS: usize = 7;

fn gpu_or_skip() -> bool {
    match probe_gpu() {
        GpuProbe::Available(_) => true,
        GpuProbe::Unavailable(why) => {
            eprintln!("SKIP: {why}");
            false
        }
    }
}

fn checkpoint() -> tempfile::TempDir {
    let mut spec = SynthSpec::tiny_default().with_quantized(true);
    spec.shards = SHARDS;
    spec.vocab_size = 256;
    spec.moe_intermediate_size = 256;
    spec.seed = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    write_checkpoint(dir.path(), &spec).expect("write");
    dir
}

fn options(devices: &[usize], mode: SplitMode) -> MultiOptions {
    MultiOptions {
        gpu: GpuOptions {
            numerics: Numerics::Official,
            max_seqs: 2,
            max_context: 512,
            cuda_graphs: true,
            graph_buckets: vec![1, 2],
        },
        devices: devices.to_vec(),
        mode,
        collective: Default::default(),
    }
}

fn logits(b: &mut dyn Backend, seq: &[u32]) -> Vec<Vec<f32>> {
    let s = b.create_seq().expect("seq");
    seq.chunks(5)
        .map(|c| {
            let w = [Work { seq: s, tokens: c }];
            b.forward(&w).expect("forward").remove(0)
        })
        .collect()
}

#[test]
fn split_load_reads_many_shards_in_parallel_onto_the_gpu() {
    if !gpu_or_skip() {
        return;
    }
    let dir = checkpoint();
    let reader = SlowReader::default();
    let etas = Mutex::new(Vec::new());
    let progress = |p: &Progress| etas.lock().expect("lock").push((p.bytes_done, p.eta()));
    let settings = LoadSettings {
        options: LoadOptions { threads: 4 },
        reader: &reader,
        progress: &progress,
        ..Default::default()
    };
    for mode in [SplitMode::Tensor, SplitMode::Layer] {
        let opts = options(&[0, 0, 0], mode);
        let mut slow = MultiGpuBackend::load(dir.path(), &opts, &settings).expect("slow load");
        let mut plain =
            MultiGpuBackend::load(dir.path(), &opts, &LoadSettings::default()).expect("plain load");
        let seq = tokens(15, 256, 9);
        let (a, b) = (logits(&mut slow, &seq), logits(&mut plain, &seq));
        assert!(
            a.iter().zip(&b).all(|(x, y)| x == y),
            "{mode:?}: the slow reader's model differs"
        );
    }
    assert!(
        reader.most_open.load(Ordering::SeqCst) >= 2,
        "shards read concurrently"
    );
    let etas = etas.into_inner().expect("lock");
    assert!(etas
        .iter()
        .any(|(_, e)| e.is_some_and(|e| e > Duration::ZERO)));
}

/// Loads with `reader` onto three ranks of GPU 0 (contexts made first, so only the load's own memory
/// is measured); returns the error and the free memory before and after.
fn failing_load(dir: &Path, mode: SplitMode, reader: FailingReader) -> (RunnerError, usize, usize) {
    let gpus = contexts(&[0, 0, 0]).expect("contexts");
    let plan = gpu_plan(&read_config(dir).expect("config"), 3, mode).expect("plan");
    let peak = Mutex::new(0usize);
    let progress = |_: &Progress| {
        let used = gpus[0].ctx.mem_get_info().map_or(0, |(f, t)| t - f);
        let mut p = peak.lock().expect("lock");
        *p = (*p).max(used);
    };
    let settings = LoadSettings {
        options: LoadOptions { threads: 1 },
        reader: &reader,
        progress: &progress,
        ..Default::default()
    };
    let before = free_memory(&gpus).expect("free memory")[0];
    let err = match load_rank_weights(dir, &plan, &gpus, &settings) {
        Ok(_) => panic!("the load must fail"),
        Err(e) => e,
    };
    let after = free_memory(&gpus).expect("free memory")[0];
    eprintln!(
        "{mode:?}: {err}\nfree before {before}, after {after} (peak used {} MiB)",
        *peak.lock().expect("lock") >> 20
    );
    (err, before, after)
}

/// The shard of the last layer's shared expert: read by rank 0, after earlier shards (the last shard
/// may hold only the MTP block, which the GPU runner does not load).
fn late_shard(dir: &Path) -> std::path::PathBuf {
    let index = std::fs::read_to_string(dir.join("model.safetensors.index.json")).expect("index");
    let v: serde_json::Value = serde_json::from_str(&index).expect("json");
    let cfg = read_config(dir).expect("config");
    let name = format!(
        "layers.{}.ffn.shared_experts.w2.weight",
        cfg.num_hidden_layers - 1
    );
    let file = v["weight_map"][&name].as_str().expect("in the weight map");
    assert_ne!(
        file,
        shard_name(0, SHARDS),
        "the victim must not be the first shard"
    );
    dir.join(file)
}

#[test]
fn shard_missing_mid_load_names_the_file_and_frees_the_gpu() {
    if !gpu_or_skip() {
        return;
    }
    let dir = checkpoint();
    let victim = late_shard(dir.path());
    let reader = FailingReader {
        victim: Some(victim.clone()),
        fail_at: None,
        reads: Arc::default(),
    };
    let (err, before, after) = failing_load(dir.path(), SplitMode::Tensor, reader);
    assert!(
        matches!(&err, RunnerError::Load(LoadError::Tensor { file, message, .. })
            if *file == victim.display().to_string() && message.contains("cannot open shard")),
        "{err}"
    );
    assert_eq!(before, after, "GPU memory left behind after a failed load");
}

#[test]
fn read_failing_mid_shard_names_the_tensor_and_frees_the_gpu() {
    if !gpu_or_skip() {
        return;
    }
    let dir = checkpoint();
    let reader = FailingReader {
        victim: None,
        fail_at: Some(60),
        reads: Arc::default(),
    };
    let (err, before, after) = failing_load(dir.path(), SplitMode::Layer, reader);
    let text = err.to_string();
    assert!(
        text.contains("device unplugged")
            && text.contains("tensor `")
            && text.contains(".safetensors"),
        "{text}"
    );
    assert_eq!(before, after, "GPU memory left behind after a failed load");
}

#[test]
fn split_backend_load_failure_names_the_file() {
    if !gpu_or_skip() {
        return;
    }
    let dir = checkpoint();
    let victim = dir.path().join(shard_name(2, SHARDS));
    let reader = FailingReader {
        victim: Some(victim.clone()),
        fail_at: None,
        reads: Arc::default(),
    };
    let settings = LoadSettings {
        reader: &reader,
        ..Default::default()
    };
    let opts = options(&[0, 0], SplitMode::Tensor);
    let Err(err) = MultiGpuBackend::load(dir.path(), &opts, &settings) else {
        panic!("the load must fail");
    };
    let text = err.to_string();
    assert!(text.contains(&victim.display().to_string()), "{text}");
}

#[test]
fn split_load_refuses_up_front_when_the_caches_cannot_fit() {
    if !gpu_or_skip() {
        return;
    }
    let dir = checkpoint();
    let mut opts = options(&[0, 0], SplitMode::Tensor);
    opts.gpu.max_context = 1 << 36;
    let Err(err) = MultiGpuBackend::load(dir.path(), &opts, &LoadSettings::default()) else {
        panic!("must not fit");
    };
    let text = err.to_string();
    assert!(
        matches!(err, RunnerError::DoesNotFit(_)) && text.contains("missing"),
        "{text}"
    );
}
