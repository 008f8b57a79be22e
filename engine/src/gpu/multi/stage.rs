//! The GPU staging of the sharded loader ([`crate::parallel::load::load_shares`]): every piece goes to
//! its rank's GPU as it is read. FP8 weights are cropped to the rank's part and uploaded at once; routed
//! experts are written straight into the rank's expert bank of their layer at their slot; small tensors
//! (norms, scales, mixers, router, embedding and head) wait on the host for the builder. Nothing is
//! committed until every piece arrived; dropping the staging (any failure) frees every device buffer.

use crate::gpu::weights::ExpertBank;
use crate::model::checkpoint::Storage;
use crate::model::ExpertFormat;
use crate::parallel::load::{LoadError, Piece, Staging};
use crate::parallel::plan::SplitPlan;
use crate::parallel::shares::{as_matrix, rank_shares, TensorShare};
use crate::parallel::staging::crop;
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::GpuContext;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// A staged stored tensor: device bytes (FP8 weights) or host bytes (everything small).
pub enum Held {
    Dev(CudaSlice<u8>),
    Host(Vec<u8>),
}

/// One rank's committed share of one logical tensor: the weight (stored 0) and its scale (stored 1).
pub struct Staged {
    pub share: TensorShare,
    pub weight: Held,
    pub scale: Option<Vec<u8>>,
}

/// Everything one rank loaded: tensors by logical name (parts in plan order) and expert banks by layer.
pub struct RankStore {
    pub rank: usize,
    pub parts: HashMap<String, Vec<Staged>>,
    pub banks: HashMap<usize, ExpertBank>,
}

type Key = (usize, usize, usize);

/// A bank being filled, how many of its expert pieces arrived, and its (hidden, inter) dims.
struct BankFill {
    bank: ExpertBank,
    pieces: usize,
    dims: (usize, usize),
}

pub struct GpuStaging {
    shares: Vec<Vec<TensorShare>>,
    gpus: Vec<Arc<GpuContext>>,
    /// Routed experts each rank holds.
    experts: Vec<Range<usize>>,
    held: Mutex<HashMap<Key, Held>>,
    banks: Mutex<HashMap<(usize, usize), BankFill>>,
}

fn err(tensor: &str, message: impl Into<String>) -> LoadError {
    LoadError::Tensor {
        file: "<GPU staging>".into(),
        tensor: tensor.into(),
        message: message.into(),
    }
}

/// `layers.{l}.ffn.experts.{e}.…` -> (l, e).
fn expert_of(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let rest = rest.strip_prefix("ffn.experts.")?;
    let (e, _) = rest.split_once('.')?;
    Some((l.parse().ok()?, e.parse().ok()?))
}

impl GpuStaging {
    /// `gpus[r]` is rank r's device (simulated ranks may share one).
    pub fn new(plan: &SplitPlan, gpus: Vec<Arc<GpuContext>>) -> Self {
        GpuStaging {
            shares: (0..plan.world()).map(|r| rank_shares(plan, r)).collect(),
            experts: plan.ranks.iter().map(|r| r.experts.clone()).collect(),
            gpus,
            held: Mutex::new(HashMap::new()),
            banks: Mutex::new(HashMap::new()),
        }
    }

    fn share(&self, p: &Piece) -> Result<&TensorShare, LoadError> {
        self.shares
            .get(p.rank)
            .and_then(|s| s.get(p.share))
            .ok_or_else(|| {
                err(
                    "<any>",
                    format!("piece of unknown share {}/{}", p.rank, p.share),
                )
            })
    }

    /// Copies an expert piece into its slot of the rank's bank of its layer (made on first use).
    fn put_expert(
        &self,
        p: &Piece,
        share: &TensorShare,
        layer: usize,
        e: usize,
    ) -> Result<(), LoadError> {
        let name = &share.tensor.name;
        let range = &self.experts[p.rank];
        if !range.contains(&e) {
            return Err(err(name, format!("expert {e} is not rank {}'s", p.rank)));
        }
        let gpu = &self.gpus[p.rank];
        let stored = share.tensor.stored();
        let per = |k: usize| stored[k].shape.iter().product::<usize>() * stored[k].dtype.size();
        let dev = |e: dsv4_kernels::cudarc::driver::DriverError| err(name, format!("GPU: {e}"));
        let mut banks = self
            .banks
            .lock()
            .map_err(|_| err(name, "a loader thread panicked"))?;
        let fill = match banks.entry((p.rank, layer)) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let n = range.len();
                let alloc = |k| gpu.stream.alloc_zeros::<u8>(n * per(k)).map_err(dev);
                let bank = ExpertBank {
                    w1: alloc(0)?,
                    s1: alloc(1)?,
                    w3: alloc(0)?,
                    s3: alloc(1)?,
                    w2: alloc(0)?,
                    s2: alloc(1)?,
                    format: ExpertFormat::Fp4,
                };
                // w1/w3 are [inter, hidden], w2 [hidden, inter].
                let (rows, cols) = as_matrix(&share.tensor.shape);
                let dims = if name.ends_with(".w2.weight") {
                    (rows, cols)
                } else {
                    (cols, rows)
                };
                v.insert(BankFill {
                    bank,
                    pieces: 0,
                    dims,
                })
            }
        };
        let which = name.rsplit('.').nth(1).unwrap_or("");
        let b = &mut fill.bank;
        let dst = match (which, p.stored) {
            ("w1", 0) => &mut b.w1,
            ("w1", _) => &mut b.s1,
            ("w3", 0) => &mut b.w3,
            ("w3", _) => &mut b.s3,
            ("w2", 0) => &mut b.w2,
            ("w2", _) => &mut b.s2,
            _ => return Err(err(name, "not an expert matrix w1/w2/w3")),
        };
        let size = per(p.stored);
        if p.bytes.len() != size {
            return Err(err(
                name,
                format!("{} bytes, expected {size}", p.bytes.len()),
            ));
        }
        let at = (e - range.start) * size;
        gpu.stream
            .memcpy_htod(&p.bytes, &mut dst.slice_mut(at..at + size))
            .map_err(dev)?;
        fill.pieces += 1;
        Ok(())
    }

    /// FP8 weights cropped to the part and uploaded; everything else kept on the host.
    fn hold(&self, p: Piece, share: &TensorShare) -> Result<Held, LoadError> {
        let name = &share.tensor.name;
        if !(matches!(share.tensor.storage, Storage::Fp8 { .. }) && p.stored == 0) {
            return Ok(Held::Host(p.bytes));
        }
        let (rows, cols) = as_matrix(&share.tensor.shape);
        let (r, c) = share.part.ranges(rows, cols);
        let bytes = crop(&p.bytes, &p.rect, &r, &c);
        let gpu = &self.gpus[p.rank];
        let dev = gpu
            .stream
            .clone_htod(&bytes)
            .map_err(|e| err(name, format!("GPU: {e}")))?;
        Ok(Held::Dev(dev))
    }
}

impl Staging for GpuStaging {
    type Committed = Vec<RankStore>;

    fn put(&self, piece: Piece) -> Result<(), LoadError> {
        let share = self.share(&piece)?;
        if let (Storage::Fp4, Some((layer, e))) =
            (share.tensor.storage, expert_of(&share.tensor.name))
        {
            return self.put_expert(&piece, share, layer, e);
        }
        let key = (piece.rank, piece.share, piece.stored);
        let held = self.hold(piece, share)?;
        self.held
            .lock()
            .map_err(|_| err(&share.tensor.name, "a loader thread panicked"))?
            .insert(key, held);
        Ok(())
    }

    fn commit(self) -> Result<Vec<RankStore>, LoadError> {
        let poisoned = || err("<any>", "a loader thread panicked");
        let mut held = self.held.into_inner().map_err(|_| poisoned())?;
        let mut banks = self.banks.into_inner().map_err(|_| poisoned())?;
        let mut out = Vec::with_capacity(self.shares.len());
        for (rank, shares) in self.shares.into_iter().enumerate() {
            let mut store = RankStore {
                rank,
                parts: HashMap::new(),
                banks: HashMap::new(),
            };
            for (i, share) in shares.into_iter().enumerate() {
                if share.tensor.storage == Storage::Fp4 && expert_of(&share.tensor.name).is_some() {
                    continue;
                }
                let name = share.tensor.name.clone();
                let missing = || err(&name, format!("rank {rank}: never read"));
                let weight = held.remove(&(rank, i, 0)).ok_or_else(missing)?;
                let scale = match share.tensor.storage {
                    Storage::Plain(_) => None,
                    _ => match held.remove(&(rank, i, 1)).ok_or_else(missing)? {
                        Held::Host(b) => Some(b),
                        Held::Dev(_) => return Err(err(&name, "scale staged on the device")),
                    },
                };
                let staged = Staged {
                    share,
                    weight,
                    scale,
                };
                store.parts.entry(name).or_default().push(staged);
            }
            let layers: Vec<usize> = banks.keys().filter(|k| k.0 == rank).map(|k| k.1).collect();
            for layer in layers {
                if let Some(fill) = banks.remove(&(rank, layer)) {
                    let want = 6 * self.experts[rank].len();
                    let tensor = format!("layers.{layer}.ffn.experts");
                    if fill.pieces != want {
                        return Err(err(
                            &tensor,
                            format!("{} of {want} pieces read", fill.pieces),
                        ));
                    }
                    let bank = fill
                        .bank
                        .into_device_layout(
                            &self.gpus[rank],
                            self.experts[rank].len(),
                            fill.dims.0,
                            fill.dims.1,
                        )
                        .map_err(|e| err(&tensor, format!("GPU: {e}")))?;
                    store.banks.insert(layer, bank);
                }
            }
            out.push(store);
        }
        Ok(out)
    }
}
