//! The sharded parallel loader: every rank's share read from a 7-shard checkpoint equals the
//! slice of the fully loaded tensor; shards are read concurrently with progress; a shard that
//! goes missing or a read that fails mid-load gives a clear error and leaves nothing staged;
//! the same through `SplitModel::load_with`, the real path from shards to rank weights.

mod parallel_common;

use dsv4_engine::api::Numerics;
use dsv4_engine::model::checkpoint::Checkpoint;
use dsv4_engine::model::synth::{shard_name, write_checkpoint, SynthSpec};
use dsv4_engine::parallel::load::{load_shares, LoadError, LoadOptions, Piece, Progress, Staging};
use dsv4_engine::parallel::reader::MmapReader;
use dsv4_engine::parallel::shares::{as_matrix, Part};
use dsv4_engine::parallel::staging::{CpuStaging, StagedBytes};
use dsv4_engine::parallel::{
    LoadSettings, SplitError, SplitItem, SplitMode, SplitModel, SplitPlan,
};
use dsv4_engine::reference::ForwardOptions;
use parallel_common::{tokens, FailingReader, SlowReader};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SHARDS: usize = 7;

fn checkpoint() -> (tempfile::TempDir, SplitPlan) {
    let mut spec = SynthSpec::tiny_default().with_quantized(true);
    spec.shards = SHARDS;
    spec.vocab_size = 256;
    spec.seed = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    write_checkpoint(dir.path(), &spec).expect("write");
    let cfg = spec.model_config().expect("config");
    // 3 ranks on 4 heads / 2 groups: uneven heads, straddling group, FP8 + FP4 parts.
    let plan = SplitPlan::new(&cfg, 3, SplitMode::Tensor).expect("plan");
    (dir, plan)
}

fn slice(data: &[f32], shape: &[usize], part: &Part) -> Vec<f32> {
    let (rows, cols) = as_matrix(shape);
    let (r, c) = part.ranges(rows, cols);
    r.flat_map(|i| data[i * cols + c.start..i * cols + c.end].to_vec())
        .collect()
}

#[test]
fn every_rank_share_equals_the_slice_of_the_full_tensor() {
    let (dir, plan) = checkpoint();
    let ck = Checkpoint::open(dir.path()).expect("open");
    let last = Mutex::new(None::<Progress>);
    let progress = |p: &Progress| {
        let mut l = last.lock().expect("lock");
        if l.is_none_or(|q| q.bytes_done < p.bytes_done) {
            *l = Some(*p);
        }
    };
    let opts = LoadOptions { threads: 3 };
    let ranks = load_shares(
        dir.path(),
        &plan,
        &MmapReader,
        CpuStaging::new(&plan),
        opts,
        &progress,
    )
    .expect("load");
    for rank in &ranks {
        assert!(!rank.tensors.is_empty());
        for t in &rank.tensors {
            let (logical, full): (Vec<usize>, Vec<f32>) = if t.name.ends_with("tid2eid") {
                let (shape, ids) = ck.load_i64(&t.name).expect("i64");
                (shape, ids.into_iter().map(|v| v as f32).collect())
            } else {
                let d = ck.load_f32(&t.name).expect("f32");
                (d.shape, d.data)
            };
            let want = slice(&full, &logical, &t.part);
            assert_eq!(t.data, want, "rank {}: {} {:?}", rank.rank, t.name, t.part);
        }
    }
    let p = last.lock().expect("lock").expect("progress was reported");
    assert_eq!(p.bytes_done, p.bytes_total);
    assert_eq!(p.shards_total, SHARDS);
    // Reads are the plan's bytes, plus FP8 parts widened to a block boundary.
    let planned = plan.total_bytes();
    assert!(p.bytes_total >= planned && p.bytes_total < planned + planned / 5);
}

#[test]
fn slow_reader_reads_shards_in_parallel_with_an_estimate() {
    let (dir, plan) = checkpoint();
    let reader = SlowReader {
        open_now: Arc::default(),
        most_open: Arc::default(),
    };
    let etas = Mutex::new(Vec::new());
    let progress = |p: &Progress| etas.lock().expect("lock").push(p.eta());
    let staging = CpuStaging::new(&plan);
    load_shares(
        dir.path(),
        &plan,
        &reader,
        staging,
        LoadOptions { threads: 4 },
        &progress,
    )
    .expect("load");
    assert!(
        reader.most_open.load(Ordering::SeqCst) >= 2,
        "shards read concurrently"
    );
    assert_eq!(
        reader.open_now.load(Ordering::SeqCst),
        0,
        "every shard closed"
    );
    let etas = etas.into_inner().expect("lock");
    assert!(etas.iter().all(Option::is_some));
    assert_eq!(etas.last().copied().flatten(), Some(Duration::ZERO));
}

/// Stands for device buffers: counts pieces alive; dropping the staging frees them.
struct CountingStaging {
    live: Arc<AtomicUsize>,
    held: Mutex<Vec<Held>>,
}

struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Staging for CountingStaging {
    type Committed = usize;
    fn put(&self, _piece: Piece) -> Result<(), LoadError> {
        self.live.fetch_add(1, Ordering::SeqCst);
        self.held
            .lock()
            .expect("lock")
            .push(Held(self.live.clone()));
        Ok(())
    }
    fn commit(self) -> Result<usize, LoadError> {
        Ok(self.live.load(Ordering::SeqCst))
    }
}

fn failing_load(dir: &Path, plan: &SplitPlan, reader: FailingReader) -> (LoadError, usize) {
    let live = Arc::new(AtomicUsize::new(0));
    let staging = CountingStaging {
        live: live.clone(),
        held: Mutex::default(),
    };
    // One thread: shards in order, so the failure comes after earlier shards were staged.
    let err = load_shares(
        dir,
        plan,
        &reader,
        staging,
        LoadOptions { threads: 1 },
        &|_| {},
    )
    .expect_err("must fail");
    (err, live.load(Ordering::SeqCst))
}

#[test]
fn shard_deleted_mid_load_names_file_and_tensor_and_frees_everything() {
    let (dir, plan) = checkpoint();
    let victim = dir.path().join(shard_name(SHARDS - 1, SHARDS));
    let reader = FailingReader {
        victim: Some(victim.clone()),
        fail_at: None,
        reads: Arc::default(),
    };
    let (err, live) = failing_load(dir.path(), &plan, reader);
    assert!(
        matches!(&err, LoadError::Tensor { file, message, .. }
            if *file == victim.display().to_string() && message.contains("cannot open shard")),
        "{err}"
    );
    assert!(err.to_string().contains("tensor `"), "{err}");
    assert_eq!(live, 0, "staged pieces must be freed");
}

#[test]
fn read_failing_mid_shard_names_the_tensor() {
    let (dir, plan) = checkpoint();
    let reader = FailingReader {
        victim: None,
        fail_at: Some(40),
        reads: Arc::default(),
    };
    let (err, live) = failing_load(dir.path(), &plan, reader);
    let text = err.to_string();
    assert!(
        text.contains("device unplugged") && text.contains("tensor `"),
        "{text}"
    );
    assert!(text.contains(".safetensors"), "{text}");
    assert_eq!(live, 0);
}

/// Loads through the real path with `reader`; returns the error and the most bytes staged
/// at any progress report.
fn failing_model_load(dir: &Path, mode: SplitMode, reader: FailingReader) -> (SplitError, u64) {
    let staged = StagedBytes::default();
    let peak = AtomicU64::new(0);
    let progress = |_: &Progress| {
        peak.fetch_max(staged.get(), Ordering::SeqCst);
    };
    let settings = LoadSettings {
        options: LoadOptions { threads: 1 },
        reader: &reader,
        progress: &progress,
        staged: staged.clone(),
    };
    let result = SplitModel::load_with(dir, 3, mode, Numerics::Official, &settings);
    let Err(err) = result else {
        panic!("the load must fail");
    };
    assert_eq!(staged.get(), 0, "no rank keeps partial weights: {err}");
    (err, peak.load(Ordering::SeqCst))
}

#[test]
fn split_model_load_with_a_shard_deleted_mid_load_keeps_nothing() {
    let (dir, _) = checkpoint();
    let victim = dir.path().join(shard_name(SHARDS - 1, SHARDS));
    let reader = FailingReader {
        victim: Some(victim.clone()),
        fail_at: None,
        reads: Arc::default(),
    };
    let (err, peak) = failing_model_load(dir.path(), SplitMode::Tensor, reader);
    assert!(
        matches!(&err, SplitError::Load(LoadError::Tensor { file, tensor, message })
            if *file == victim.display().to_string()
                && !tensor.is_empty()
                && message.contains("cannot open shard")),
        "{err}"
    );
    assert!(peak > 0, "earlier shards were staged before the failure");
}

#[test]
fn split_model_load_with_a_read_failing_mid_shard_keeps_nothing() {
    let (dir, _) = checkpoint();
    let reader = FailingReader {
        victim: None,
        fail_at: Some(60),
        reads: Arc::default(),
    };
    let (err, peak) = failing_model_load(dir.path(), SplitMode::Layer, reader);
    let text = err.to_string();
    assert!(
        text.contains("device unplugged") && text.contains("tensor `"),
        "{text}"
    );
    assert!(text.contains(".safetensors"), "{text}");
    assert!(peak > 0);
}

#[test]
fn split_model_load_reads_shards_in_parallel_with_time_left() {
    let (dir, _) = checkpoint();
    let reader = SlowReader::default();
    let etas = Mutex::new(Vec::new());
    let progress = |p: &Progress| etas.lock().expect("lock").push((p.bytes_done, p.eta()));
    let staged = StagedBytes::default();
    let settings = LoadSettings {
        options: LoadOptions { threads: 4 },
        reader: &reader,
        progress: &progress,
        staged: staged.clone(),
    };
    let (mode, numerics) = (SplitMode::Tensor, Numerics::Official);
    let model = SplitModel::load_with(dir.path(), 3, mode, numerics, &settings).expect("load");
    assert!(
        reader.most_open.load(Ordering::SeqCst) >= 2,
        "shards read concurrently"
    );
    assert_eq!(staged.get(), 0, "every staged piece was built into weights");
    let etas = etas.into_inner().expect("lock");
    assert!(etas
        .iter()
        .any(|(_, e)| e.is_some_and(|e| e > Duration::ZERO)));
    let last = etas
        .iter()
        .max_by_key(|(done, _)| *done)
        .and_then(|(_, e)| *e);
    assert_eq!(last, Some(Duration::ZERO));
    // The slow path built the same model as the default one.
    let plain = SplitModel::load(dir.path(), 3, mode, numerics).expect("load");
    let seq = tokens(12, model.cfg.vocab_size, 3);
    let logits = |m: &SplitModel| {
        let mut state = m.new_state();
        let mut batch = [SplitItem {
            state: &mut state,
            tokens: &seq,
        }];
        let out = m.forward(&mut batch, ForwardOptions::default());
        out.expect("forward").remove(0).logits
    };
    assert_eq!(logits(&model), logits(&plain));
}
