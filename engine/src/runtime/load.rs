//! Loading a model on the engine thread: the built-in demo model or a checkpoint directory,
//! with progress events, onto the backend the settings choose.

use crate::api::{BackendChoice, EngineSettings, ModelInfo, ModelSource};
use crate::backend::{Backend, CpuBackend};
use crate::chat::Tokenizer;
use crate::model::checkpoint::Checkpoint;
use crate::model::synth::{write_checkpoint, SynthSpec};
use crate::reference::Model;
use std::path::{Path, PathBuf};

/// A loaded model: the backend that runs it and the tokenizer that goes with it.
pub struct Loaded {
    pub backend: Box<dyn Backend>,
    pub tokenizer: Tokenizer,
    pub info: ModelInfo,
}

/// Bumped whenever the demo model's spec changes, so an old cached copy is not reused.
const DEMO_VERSION: u32 = 1;

/// Where the demo checkpoint is cached (created on first use).
pub fn demo_dir() -> PathBuf {
    let base = std::env::var_os("DSV4_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|p| PathBuf::from(p).join("dsv4-chat")))
        .or_else(|| std::env::var_os("HOME").map(|p| PathBuf::from(p).join(".cache/dsv4-chat")))
        .unwrap_or_else(|| std::env::temp_dir().join("dsv4-chat"));
    base.join(format!("demo-model-v{DEMO_VERSION}"))
}

/// The demo model: the tiny random configuration with the real tokenizer's vocabulary.
pub fn demo_spec() -> SynthSpec {
    let mut spec = SynthSpec::tiny_default()
        .with_quantized(true)
        .with_vocab(129_280);
    spec.seed = 20_261_129;
    spec
}

/// Writes the demo checkpoint if it is not already complete (the writer writes config.json
/// last, so a half-written directory does not open and is rewritten). Each process writes into
/// its own temporary directory and renames it into place, so two first starts at once cannot
/// corrupt each other: the loser of the rename finds a complete model and uses it.
pub fn ensure_demo(dir: &Path) -> Result<(), String> {
    if Checkpoint::open(dir).is_ok() {
        return Ok(());
    }
    static ATTEMPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let attempt = ATTEMPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.with_extension(format!("partial-{}-{attempt}", std::process::id()));
    write_checkpoint(&tmp, &demo_spec())
        .map_err(|e| format!("cannot create the demo model: {e}"))?;
    if Checkpoint::open(dir).is_ok() {
        // Another process finished first.
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    let renamed = std::fs::rename(&tmp, dir);
    let _ = std::fs::remove_dir_all(&tmp);
    match (renamed, Checkpoint::open(dir)) {
        (_, Ok(_)) => Ok(()),
        (Err(e), Err(_)) => Err(format!(
            "cannot create the demo model in {}: {e}",
            dir.display()
        )),
        (Ok(()), Err(e)) => Err(format!(
            "the demo model in {} does not open: {e}",
            dir.display()
        )),
    }
}

/// Loads `source`, calling `progress(fraction, message)` along the way.
pub fn load(
    source: &ModelSource,
    settings: &EngineSettings,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<Loaded, String> {
    let (dir, is_demo) = match source {
        ModelSource::Demo => {
            progress(
                0.05,
                "preparing the built-in demo model (random weights: replies are noise)",
            );
            let dir = demo_dir();
            ensure_demo(&dir)?;
            (dir, true)
        }
        ModelSource::Dir(d) => (d.clone(), false),
    };
    progress(0.1, "reading checkpoint headers");
    let ck = Checkpoint::open(&dir).map_err(|e| e.to_string())?;
    let tokenizer = load_tokenizer(&dir)?;
    if tokenizer.vocab_size() > ck.config().vocab_size {
        return Err(format!(
            "the tokenizer has {} ids but the model only {}: wrong tokenizer.json?",
            tokenizer.vocab_size(),
            ck.config().vocab_size
        ));
    }
    let backend = match &settings.backend {
        BackendChoice::Cuda { devices } => match load_on_gpus(&dir, devices, settings, progress) {
            Ok(b) => b,
            Err(why) => {
                progress(0.2, &format!("{why}: using the CPU reference instead"));
                load_on_cpu(&ck, settings, progress)?
            }
        },
        BackendChoice::Cpu => load_on_cpu(&ck, settings, progress)?,
    };
    progress(1.0, "ready");
    let info = model_info(&dir, source, is_demo, backend.as_ref(), settings.numerics);
    Ok(Loaded {
        backend,
        tokenizer,
        info,
    })
}

fn load_on_cpu(
    ck: &Checkpoint,
    settings: &EngineSettings,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<Box<dyn Backend>, String> {
    check_host_memory(ck)?;
    progress(0.3, "loading weights on the CPU");
    let model = Model::from_checkpoint(ck, settings.numerics).map_err(|e| e.to_string())?;
    Ok(Box::new(CpuBackend::new(model, settings.max_context)))
}

/// The GPUs to use: the listed ordinals, or every GPU present when the list is empty. Several GPUs run
/// the model split (the settings' split mode); one GPU the one-GPU runner.
fn load_on_gpus(
    dir: &Path,
    devices: &[usize],
    settings: &EngineSettings,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<Box<dyn Backend>, String> {
    let all = devices.is_empty();
    let devices = if all {
        dsv4_kernels::Gpu::probe_all()?
            .iter()
            .map(|g| g.ordinal)
            .collect()
    } else {
        devices.to_vec()
    };
    if devices.len() <= 1 {
        return load_on_gpu(dir, settings, progress);
    }
    match load_split(dir, &devices, settings, progress) {
        // Not asked for a split: a model that cannot be split this way still runs on one GPU.
        Err(why) if all => {
            progress(0.2, &format!("{why}: using one GPU"));
            load_on_gpu(dir, settings, progress)
        }
        r => r,
    }
}

/// The model split over `devices` in the settings' split mode.
fn load_split(
    dir: &Path,
    devices: &[usize],
    settings: &EngineSettings,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<Box<dyn Backend>, String> {
    use crate::gpu::multi::{MultiGpuBackend, MultiOptions};
    let opts = MultiOptions {
        gpu: gpu_options(settings),
        devices: devices.to_vec(),
        mode: settings.split_mode,
        collective: Default::default(),
    };
    progress(
        0.3,
        &format!(
            "loading weights onto GPUs {devices:?} ({:?} split)",
            settings.split_mode
        ),
    );
    // The loader reports from its threads; this thread relays the latest figures.
    let latest = std::sync::Mutex::new(None::<crate::parallel::load::Progress>);
    let on_read = |p: &crate::parallel::load::Progress| {
        if let Ok(mut l) = latest.lock() {
            *l = Some(*p);
        }
    };
    let load = crate::parallel::LoadSettings {
        progress: &on_read,
        ..Default::default()
    };
    let loaded = std::thread::scope(|s| {
        let job = s.spawn(|| MultiGpuBackend::load(dir, &opts, &load));
        while !job.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(200));
            if let Some(p) = latest.lock().ok().and_then(|l| *l) {
                let done = p.bytes_done as f32 / p.bytes_total.max(1) as f32;
                let eta = p.eta().map_or(String::new(), |e| {
                    format!(", about {:.0} s left", e.as_secs_f64())
                });
                progress(
                    0.3 + 0.6 * done,
                    &format!("loading weights: {:.0}%{eta}", 100.0 * done),
                );
            }
        }
        job.join()
    });
    match loaded {
        Ok(Ok(b)) => Ok(Box::new(b) as Box<dyn Backend>),
        Ok(Err(e)) => Err(format!(
            "the CUDA backend could not load the model on {devices:?} ({e})"
        )),
        Err(_) => Err("the GPU loader thread panicked".into()),
    }
}

fn gpu_options(settings: &EngineSettings) -> crate::gpu::GpuOptions {
    crate::gpu::GpuOptions {
        numerics: settings.numerics,
        // Running turns plus a few idle conversations kept for prefix reuse.
        max_seqs: (settings.max_batch + GPU_IDLE_SLOTS).min(crate::gpu::MAX_ROWS),
        max_context: settings.max_context,
        cuda_graphs: settings.cuda_graphs,
        graph_buckets: settings.graph_buckets.clone(),
    }
}

/// The CUDA backend on the first GPU, or why not (no driver, no GPU, unsupported format, ...).
fn load_on_gpu(
    dir: &Path,
    settings: &EngineSettings,
    progress: &mut dyn FnMut(f32, &str),
) -> Result<Box<dyn Backend>, String> {
    use crate::gpu::{probe_gpu, GpuBackend, GpuProbe};
    let gpu = match probe_gpu() {
        GpuProbe::Available(info) => info,
        GpuProbe::Unavailable(why) => return Err(why),
    };
    progress(0.3, &format!("loading weights onto {}", gpu.name));
    GpuBackend::load(dir, &gpu_options(settings))
        .map(|b| Box::new(b) as Box<dyn Backend>)
        .map_err(|e| format!("the CUDA backend could not load the model ({e})"))
}

/// Sequence slots on the GPU beyond the batch, for idle conversations' caches.
const GPU_IDLE_SLOTS: usize = 8;

/// The CPU reference holds every weight as f32: refuse early, with the numbers, when that
/// cannot fit (the real 160 GB checkpoint needs ~1.1 TB as f32), instead of running out of
/// memory half-way.
fn check_host_memory(ck: &Checkpoint) -> Result<(), String> {
    use crate::model::checkpoint::Dtype;
    let mut elements: u64 = 0;
    for name in ck.tensor_names() {
        let Ok(t) = ck.raw(name) else { continue };
        let n: u64 = t.shape.iter().map(|&d| d as u64).product();
        // FP4 experts pack two values per I8 byte; scales are folded into the weights.
        elements += match t.dtype {
            Dtype::I8 => 2 * n,
            Dtype::F8_E8M0 => 0,
            _ => n,
        };
    }
    let needed = elements * 4;
    match available_memory() {
        Some(avail) if needed > avail => Err(format!(
            "the CPU reference needs {:.1} GB of memory for this model as f32 but only {:.1} GB \
             is available: use the CUDA backend (settings) or a smaller model",
            needed as f64 / 1e9,
            avail as f64 / 1e9
        )),
        _ => Ok(()),
    }
}

/// `MemAvailable` of /proc/meminfo in bytes (None where it cannot be read).
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The checkpoint's own `tokenizer.json` when it has one, else the bundled DeepSeek-V4 one.
fn load_tokenizer(dir: &Path) -> Result<Tokenizer, String> {
    let own = dir.join("tokenizer.json");
    let tok = if own.exists() {
        Tokenizer::from_file(&own)
    } else {
        Tokenizer::bundled()
    };
    tok.map_err(|e| e.to_string())
}

fn model_info(
    dir: &Path,
    source: &ModelSource,
    is_demo: bool,
    backend: &dyn Backend,
    numerics: crate::api::Numerics,
) -> ModelInfo {
    let cfg = backend.config();
    let name = if is_demo {
        "Demo model (random weights, produces noise)".to_string()
    } else {
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string())
    };
    ModelInfo {
        name,
        source: source.clone(),
        is_demo,
        backend: backend.describe(),
        numerics,
        layers: cfg.num_hidden_layers,
        vocab_size: cfg.vocab_size,
        context_limit: backend.context_limit(),
        gpus: backend.gpu_status(),
    }
}
