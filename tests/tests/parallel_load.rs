//! The sharded parallel loader: every rank's share read from a 7-shard checkpoint equals the
//! slice of the fully loaded tensor; shards are read concurrently with progress; a shard that
//! goes missing or a read that fails mid-load gives a clear error and leaves nothing staged.

use dsv4_engine::model::checkpoint::Checkpoint;
use dsv4_engine::model::synth::{shard_name, write_checkpoint, SynthSpec};
use dsv4_engine::parallel::load::{load_shares, LoadError, LoadOptions, Piece, Progress, Staging};
use dsv4_engine::parallel::reader::{MmapReader, ShardFile, ShardReader};
use dsv4_engine::parallel::shares::{as_matrix, Part};
use dsv4_engine::parallel::staging::CpuStaging;
use dsv4_engine::parallel::{SplitMode, SplitPlan};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Sleeps on every read and records how many shards are open at once.
struct SlowReader {
    open_now: Arc<AtomicUsize>,
    most_open: Arc<AtomicUsize>,
}

struct SlowFile {
    inner: Box<dyn ShardFile>,
    open_now: Arc<AtomicUsize>,
}

impl ShardReader for SlowReader {
    fn open(&self, path: &Path) -> io::Result<Box<dyn ShardFile>> {
        let inner = MmapReader.open(path)?;
        let now = self.open_now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_open.fetch_max(now, Ordering::SeqCst);
        Ok(Box::new(SlowFile {
            inner,
            open_now: self.open_now.clone(),
        }))
    }
}

impl ShardFile for SlowFile {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::thread::sleep(Duration::from_micros(300));
        self.inner.read_at(offset, buf)
    }
}

impl Drop for SlowFile {
    fn drop(&mut self) {
        self.open_now.fetch_sub(1, Ordering::SeqCst);
    }
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

/// Deletes `victim` just before it is opened; or fails the `fail_at`-th read.
struct FailingReader {
    victim: Option<PathBuf>,
    fail_at: Option<usize>,
    reads: Arc<AtomicUsize>,
}

struct CountedFile {
    inner: Box<dyn ShardFile>,
    reads: Arc<AtomicUsize>,
    fail_at: Option<usize>,
}

impl ShardReader for FailingReader {
    fn open(&self, path: &Path) -> io::Result<Box<dyn ShardFile>> {
        if self.victim.as_deref() == Some(path) {
            std::fs::remove_file(path)?;
        }
        Ok(Box::new(CountedFile {
            inner: MmapReader.open(path)?,
            reads: self.reads.clone(),
            fail_at: self.fail_at,
        }))
    }
}

impl ShardFile for CountedFile {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        if Some(n) == self.fail_at {
            return Err(io::Error::other("device unplugged"));
        }
        self.inner.read_at(offset, buf)
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
