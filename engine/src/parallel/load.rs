//! Sharded parallel load: every rank's share (see [`rank_shares`]) read straight from the
//! shards, several shards at once, with progress, into a [`Staging`] that is committed only
//! when every read succeeded. On any error the staging is dropped, so nothing stays loaded
//! (a GPU staging frees its device buffers in `Drop`).

use super::plan::SplitPlan;
use super::reader::{read_header, HeaderEntry, ShardFile, ShardReader};
use super::shares::{as_matrix, rank_shares, TensorShare};
use crate::model::checkpoint::{Dtype, Storage, INDEX_FILE};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error("{file}: tensor `{tensor}`: {message}")]
    Tensor {
        file: String,
        tensor: String,
        message: String,
    },
}

/// Load progress, reported after every tensor read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub shards_done: usize,
    pub shards_total: usize,
    pub elapsed: Duration,
}

impl Progress {
    /// Time left at the average rate so far (`None` before the first byte).
    pub fn eta(&self) -> Option<Duration> {
        if self.bytes_done == 0 {
            return None;
        }
        let left = self.bytes_total.saturating_sub(self.bytes_done) as f64;
        Some(self.elapsed.mul_f64(left / self.bytes_done as f64))
    }
}

/// A stored tensor's rectangle `[rows, cols]` (row-major, `cols` = product of the trailing
/// dims), in stored elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rect {
    pub rows: Range<usize>,
    pub cols: Range<usize>,
}

/// Bytes of one stored tensor's rectangle for one rank's share.
#[derive(Debug, Clone)]
pub struct Piece {
    pub rank: usize,
    /// Index into `rank_shares(plan, rank)`.
    pub share: usize,
    /// Index into the share's `tensor.stored()` (0 = weight, 1 = scale).
    pub stored: usize,
    pub dtype: Dtype,
    pub rect: Rect,
    pub bytes: Vec<u8>,
}

/// Where read pieces go until the whole load succeeded.
pub trait Staging: Sync {
    type Committed;
    fn put(&self, piece: Piece) -> Result<(), LoadError>;
    /// Called once, after every piece arrived.
    fn commit(self) -> Result<Self::Committed, LoadError>;
}

#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Shards read at the same time.
    pub threads: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { threads: 4 }
    }
}

/// One stored tensor to read for one rank.
#[derive(Debug, Clone)]
struct Item {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    piece_rect: Rect,
    rank: usize,
    share: usize,
    stored: usize,
}

impl Item {
    fn bytes(&self) -> u64 {
        (self.piece_rect.rows.len() * self.piece_rect.cols.len() * self.dtype.size()) as u64
    }
}

/// The rectangle of stored tensor `k` of `share` to read. FP8 parts are widened down to a
/// block boundary (the staging crops after dequantising); FP4 parts are whole rows.
pub fn stored_rect(share: &TensorShare, k: usize) -> Result<Rect, String> {
    let (rows, cols) = as_matrix(&share.tensor.shape);
    let (r, c) = share.part.ranges(rows, cols);
    let down = |v: usize, b: usize| v - v % b;
    Ok(match (share.tensor.storage, k) {
        (Storage::Plain(_), _) => Rect { rows: r, cols: c },
        (Storage::Fp8 { block: b }, 0) => Rect {
            rows: down(r.start, b)..r.end,
            cols: down(c.start, b)..c.end,
        },
        (Storage::Fp8 { block: b }, _) => Rect {
            rows: r.start / b..r.end.div_ceil(b),
            cols: c.start / b..c.end.div_ceil(b),
        },
        (Storage::Fp4, k) if c == (0..cols) => {
            let per = if k == 0 {
                2
            } else {
                crate::model::checkpoint::FP4_GROUP
            };
            Rect {
                rows: r,
                cols: 0..cols / per,
            }
        }
        (Storage::Fp4, _) => return Err("FP4 tensors can only be split by rows".into()),
    })
}

/// Reads every rank's share of `plan` from the checkpoint in `dir` into `staging`.
pub fn load_shares<S: Staging>(
    dir: &Path,
    plan: &SplitPlan,
    reader: &dyn ShardReader,
    staging: S,
    opts: LoadOptions,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<S::Committed, LoadError> {
    let jobs = shard_jobs(dir, plan)?;
    let total = jobs
        .iter()
        .flat_map(|(_, items)| items)
        .map(Item::bytes)
        .sum();
    let run = Run {
        dir,
        reader,
        staging: &staging,
        progress,
        next: AtomicUsize::new(0),
        done_bytes: AtomicU64::new(0),
        done_shards: AtomicUsize::new(0),
        total,
        start: Instant::now(),
        failed: AtomicBool::new(false),
        error: Mutex::new(None),
        jobs: &jobs,
    };
    std::thread::scope(|s| {
        for _ in 0..opts.threads.clamp(1, jobs.len().max(1)) {
            s.spawn(|| run.worker());
        }
    });
    let error = run
        .error
        .lock()
        .map(|mut e| e.take())
        .unwrap_or_else(|p| p.into_inner().take());
    match error {
        Some(e) => Err(e), // `staging` is dropped here with everything it held.
        None => staging.commit(),
    }
}

/// Items grouped by shard file (sorted), from the index's weight map.
fn shard_jobs(dir: &Path, plan: &SplitPlan) -> Result<Vec<(String, Vec<Item>)>, LoadError> {
    let index_path = dir.join(INDEX_FILE);
    let weight_map = read_weight_map(&index_path)?;
    let mut by_file: BTreeMap<String, Vec<Item>> = BTreeMap::new();
    for rank in 0..plan.world() {
        for (share_idx, share) in rank_shares(plan, rank).iter().enumerate() {
            for (k, st) in share.tensor.stored().into_iter().enumerate() {
                let tensor_err = |message: String| LoadError::Tensor {
                    file: index_path.display().to_string(),
                    tensor: st.name.clone(),
                    message,
                };
                let file = weight_map
                    .get(&st.name)
                    .ok_or_else(|| tensor_err("not in the weight_map".into()))?;
                let piece_rect = stored_rect(share, k).map_err(tensor_err)?;
                by_file.entry(file.clone()).or_default().push(Item {
                    name: st.name,
                    dtype: st.dtype,
                    shape: st.shape,
                    piece_rect,
                    rank,
                    share: share_idx,
                    stored: k,
                });
            }
        }
    }
    Ok(by_file.into_iter().collect())
}

fn read_weight_map(path: &Path) -> Result<HashMap<String, String>, LoadError> {
    let err = |message: String| LoadError::File {
        file: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read index: {e}")))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| err(format!("malformed index: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| err("malformed index: no weight_map".into()))?;
    Ok(map
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect())
}

/// Shared state of one load's worker threads.
struct Run<'a, S> {
    dir: &'a Path,
    reader: &'a dyn ShardReader,
    staging: &'a S,
    progress: &'a (dyn Fn(&Progress) + Sync),
    jobs: &'a [(String, Vec<Item>)],
    next: AtomicUsize,
    done_bytes: AtomicU64,
    done_shards: AtomicUsize,
    total: u64,
    start: Instant,
    /// Set on the first error: the other workers stop at their next tensor.
    failed: AtomicBool,
    error: Mutex<Option<LoadError>>,
}

impl<S: Staging> Run<'_, S> {
    fn worker(&self) {
        while !self.failed.load(Ordering::Acquire) {
            let Some((file, items)) = self.jobs.get(self.next.fetch_add(1, Ordering::AcqRel))
            else {
                return;
            };
            if let Err(e) = self.shard(file, items) {
                self.fail(e);
                return;
            }
            self.done_shards.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn fail(&self, e: LoadError) {
        self.failed.store(true, Ordering::Release);
        if let Ok(mut slot) = self.error.lock() {
            slot.get_or_insert(e);
        }
    }

    fn shard(&self, file: &str, items: &[Item]) -> Result<(), LoadError> {
        let path = self.dir.join(file);
        let shown = path.display().to_string();
        let first = items.first().map_or("", |i| i.name.as_str());
        let tensor_err = |tensor: &str, message: String| LoadError::Tensor {
            file: shown.clone(),
            tensor: tensor.to_string(),
            message,
        };
        let mut f = self
            .reader
            .open(&path)
            .map_err(|e| tensor_err(first, format!("cannot open shard: {e}")))?;
        let header = read_header(f.as_mut()).map_err(|m| tensor_err(first, m))?;
        for item in items {
            if self.failed.load(Ordering::Acquire) {
                return Ok(());
            }
            let entry = header
                .get(&item.name)
                .ok_or_else(|| tensor_err(&item.name, "absent from the shard header".into()))?;
            let bytes =
                read_item(f.as_mut(), entry, item).map_err(|m| tensor_err(&item.name, m))?;
            self.staging.put(Piece {
                rank: item.rank,
                share: item.share,
                stored: item.stored,
                dtype: item.dtype,
                rect: item.piece_rect.clone(),
                bytes,
            })?;
            self.report(item.bytes());
        }
        Ok(())
    }

    fn report(&self, bytes: u64) {
        let done = self.done_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        (self.progress)(&Progress {
            bytes_done: done,
            bytes_total: self.total,
            shards_done: self.done_shards.load(Ordering::Acquire),
            shards_total: self.jobs.len(),
            elapsed: self.start.elapsed(),
        });
    }
}

/// Reads an item's rectangle: one read when it spans whole rows, else one per row.
fn read_item(f: &mut dyn ShardFile, e: &HeaderEntry, item: &Item) -> Result<Vec<u8>, String> {
    if e.dtype != item.dtype || e.shape != item.shape {
        return Err(format!(
            "expected {} {:?}, the shard header says {} {:?}",
            item.dtype, item.shape, e.dtype, e.shape
        ));
    }
    let (_, cols) = as_matrix(&item.shape);
    let size = item.dtype.size();
    let Rect { rows, cols: c } = &item.piece_rect;
    let mut out = vec![0u8; rows.len() * c.len() * size];
    let row_bytes = (cols * size) as u64;
    let read = |f: &mut dyn ShardFile, off: u64, buf: &mut [u8]| {
        f.read_at(off, buf).map_err(|e| format!("read failed: {e}"))
    };
    if c.len() == cols {
        read(f, e.start + rows.start as u64 * row_bytes, &mut out)?;
    } else if !c.is_empty() {
        for (i, dst) in out.chunks_mut(c.len() * size).enumerate() {
            let off = e.start + (rows.start + i) as u64 * row_bytes + (c.start * size) as u64;
            read(f, off, dst)?;
        }
    }
    Ok(out)
}
