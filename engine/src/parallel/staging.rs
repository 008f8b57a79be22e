//! The CPU staging: keeps the read pieces until commit, then dequantises each share to f32.
//! A [`StagedBytes`] meter counts the bytes held, so a caller can watch a failed load give
//! everything back.

use super::load::{LoadError, Piece, Rect, Staging};
use super::plan::SplitPlan;
use super::shares::{as_matrix, rank_shares, Part, TensorShare};
use crate::model::checkpoint::dequant::{
    bf16_to_f32, dequant_fp4, dequant_fp8, f32_from_le, first_e4m3_nan, first_ue8m0_nan,
};
use crate::model::checkpoint::{Dtype, Storage};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of read pieces held by a staging right now (shared; cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct StagedBytes(Arc<AtomicU64>);

impl StagedBytes {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// A staged piece; gives its bytes back to the meter when dropped (commit or failure alike).
struct Staged {
    piece: Piece,
    meter: StagedBytes,
}

impl Drop for Staged {
    fn drop(&mut self) {
        let n = self.piece.bytes.len() as u64;
        self.meter.0.fetch_sub(n, Ordering::AcqRel);
    }
}

/// A loaded share: the part's `[rows, cols]` values.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedTensor {
    pub name: String,
    pub part: Part,
    /// The part's shape: the logical shape with the first (and second) dim cut to the part.
    pub shape: Vec<usize>,
    pub storage: Storage,
    pub rows: usize,
    pub cols: usize,
    /// Dequantised values (I64 tensors such as `tid2eid` converted to f32, exact below 2^24).
    pub data: Vec<f32>,
}

/// Every share of one rank, in `rank_shares` order.
#[derive(Debug, Clone)]
pub struct RankTensors {
    pub rank: usize,
    pub tensors: Vec<LoadedTensor>,
}

type Key = (usize, usize, usize);

/// Pieces by (rank, share, stored index) until [`Staging::commit`].
pub struct CpuStaging {
    shares: Vec<Vec<TensorShare>>,
    pieces: Mutex<HashMap<Key, Staged>>,
    meter: StagedBytes,
}

impl CpuStaging {
    pub fn new(plan: &SplitPlan) -> Self {
        Self::with_meter(plan, StagedBytes::default())
    }

    /// A staging that counts its held bytes in `meter`.
    pub fn with_meter(plan: &SplitPlan, meter: StagedBytes) -> Self {
        CpuStaging {
            shares: (0..plan.world()).map(|r| rank_shares(plan, r)).collect(),
            pieces: Mutex::new(HashMap::new()),
            meter,
        }
    }
}

fn err(tensor: &str, message: impl Into<String>) -> LoadError {
    LoadError::Tensor {
        file: "<staging>".into(),
        tensor: tensor.into(),
        message: message.into(),
    }
}

impl Staging for CpuStaging {
    type Committed = Vec<RankTensors>;

    fn put(&self, piece: Piece) -> Result<(), LoadError> {
        let mut map = self
            .pieces
            .lock()
            .map_err(|_| err("<any>", "a loader thread panicked"))?;
        let key = (piece.rank, piece.share, piece.stored);
        self.meter
            .0
            .fetch_add(piece.bytes.len() as u64, Ordering::AcqRel);
        let meter = self.meter.clone();
        map.insert(key, Staged { piece, meter });
        Ok(())
    }

    fn commit(self) -> Result<Vec<RankTensors>, LoadError> {
        let mut pieces = self
            .pieces
            .into_inner()
            .map_err(|_| err("<any>", "a loader thread panicked"))?;
        let mut out = Vec::with_capacity(self.shares.len());
        for (rank, shares) in self.shares.iter().enumerate() {
            let mut tensors = Vec::with_capacity(shares.len());
            for (i, share) in shares.iter().enumerate() {
                let mut take = |k: usize| {
                    pieces
                        .remove(&(rank, i, k))
                        .ok_or_else(|| err(&share.tensor.name, format!("rank {rank}: never read")))
                };
                tensors.push(dequant_share(share, &mut take)?);
            }
            out.push(RankTensors { rank, tensors });
        }
        Ok(out)
    }
}

/// Dequantises one share from its weight (and scale) piece, cropping block-widened reads.
fn dequant_share(
    share: &TensorShare,
    take: &mut dyn FnMut(usize) -> Result<Staged, LoadError>,
) -> Result<LoadedTensor, LoadError> {
    let name = &share.tensor.name;
    let (rows, cols) = as_matrix(&share.tensor.shape);
    let (r, c) = share.part.ranges(rows, cols);
    let staged = take(0)?;
    let w = &staged.piece;
    let (data, read) = match share.tensor.storage {
        Storage::Plain(Dtype::BF16) => (bf16_to_f32(&w.bytes), w.rect.clone()),
        Storage::Plain(Dtype::F32) => (f32_from_le(&w.bytes), w.rect.clone()),
        Storage::Plain(Dtype::I64) => (i64_as_f32(&w.bytes), w.rect.clone()),
        Storage::Plain(d) => return Err(err(name, format!("cannot load {d} as f32"))),
        Storage::Fp8 { block } => {
            let s = take(1)?;
            check_nan(name, &w.bytes, &s.piece.bytes)?;
            let (h, wd) = (w.rect.rows.len(), w.rect.cols.len());
            let data = dequant_fp8(&w.bytes, h, wd, &s.piece.bytes, block);
            (data, w.rect.clone())
        }
        Storage::Fp4 => {
            let s = take(1)?;
            let s = &s.piece;
            if let Some(i) = first_ue8m0_nan(&s.bytes) {
                return Err(err(
                    name,
                    format!("scale element {i} is the UE8M0 NaN code"),
                ));
            }
            let rect = Rect {
                rows: w.rect.rows.clone(),
                cols: 0..cols,
            };
            (dequant_fp4(&w.bytes, rect.rows.len(), cols, &s.bytes), rect)
        }
    };
    Ok(LoadedTensor {
        name: name.clone(),
        part: share.part.clone(),
        shape: part_shape(&share.tensor.shape, r.len(), c.len()),
        storage: share.tensor.storage,
        rows: r.len(),
        cols: c.len(),
        data: crop(&data, &read, &r, &c),
    })
}

/// The logical shape cut to a `rows x cols` part (a whole tensor of 3+ dims keeps its dims).
fn part_shape(logical: &[usize], rows: usize, cols: usize) -> Vec<usize> {
    match logical.len() {
        0 => Vec::new(),
        1 => vec![rows],
        2 => vec![rows, cols],
        _ if rows * cols == logical.iter().product::<usize>() => logical.to_vec(),
        _ => vec![rows, cols],
    }
}

fn check_nan(name: &str, codes: &[u8], scale: &[u8]) -> Result<(), LoadError> {
    if let Some(i) = first_e4m3_nan(codes) {
        return Err(err(name, format!("element {i} is an e4m3 NaN code")));
    }
    if let Some(i) = first_ue8m0_nan(scale) {
        return Err(err(
            name,
            format!("scale element {i} is the UE8M0 NaN code"),
        ));
    }
    Ok(())
}

fn i64_as_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            i64::from_le_bytes(b) as f32
        })
        .collect()
}

/// The `rows x cols` sub-rectangle of `data` laid out as `read` (values or bytes).
pub(crate) fn crop<T: Copy>(
    data: &[T],
    read: &Rect,
    rows: &std::ops::Range<usize>,
    cols: &std::ops::Range<usize>,
) -> Vec<T> {
    if read.rows == *rows && read.cols == *cols {
        return data.to_vec();
    }
    let width = read.cols.len();
    let (r0, c0) = (rows.start - read.rows.start, cols.start - read.cols.start);
    (0..rows.len())
        .flat_map(|i| {
            let at = (r0 + i) * width + c0;
            data[at..at + cols.len()].iter().copied()
        })
        .collect()
}
