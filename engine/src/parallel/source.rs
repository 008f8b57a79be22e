//! One rank's committed shares as a [`TensorSource`]: a split tensor comes back as the rank's
//! rows / columns only, so the reference weight builder reads exactly what the rank holds.
//! Every tensor is handed out once (moved, not copied: the staging's copy is the only one),
//! and [`RankSource::finish`] checks that the builder used everything the plan gave the rank.

use super::staging::{LoadedTensor, RankTensors};
use crate::model::checkpoint::{CheckpointError, DenseTensor, Dtype, Storage, StoredAs};
use crate::reference::weights::TensorSource;
use std::cell::RefCell;
use std::collections::HashMap;

pub struct RankSource {
    rank: usize,
    /// Parts by tensor name, in plan order (`wo_a` has one per touched output group).
    parts: RefCell<HashMap<String, Vec<LoadedTensor>>>,
    /// Valid `tid2eid` values are expert ids below this.
    experts: usize,
}

impl RankSource {
    pub fn new(tensors: RankTensors, experts: usize) -> Self {
        let mut parts: HashMap<String, Vec<LoadedTensor>> = HashMap::new();
        for t in tensors.tensors {
            parts.entry(t.name.clone()).or_default().push(t);
        }
        RankSource {
            rank: tensors.rank,
            parts: RefCell::new(parts),
            experts,
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    fn err(&self, tensor: &str, message: impl Into<String>) -> CheckpointError {
        CheckpointError::Tensor {
            file: format!("<rank {} shares>", self.rank),
            tensor: tensor.to_string(),
            message: message.into(),
        }
    }

    /// Whether the rank holds (any part of) `name`.
    pub fn holds(&self, name: &str) -> bool {
        self.parts.borrow().contains_key(name)
    }

    /// Takes every part of `name`.
    pub fn take_parts(&self, name: &str) -> Result<Vec<LoadedTensor>, CheckpointError> {
        self.parts
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| self.err(name, "not held by this rank (or already used)"))
    }

    /// Takes the single part of `name`.
    fn take_one(&self, name: &str) -> Result<LoadedTensor, CheckpointError> {
        let mut parts = self.take_parts(name)?;
        match (parts.pop(), parts.is_empty()) {
            (Some(t), true) => Ok(t),
            _ => Err(self.err(name, "held in several parts where one was expected")),
        }
    }

    /// An error naming a tensor the plan gave the rank but the builder never used.
    pub fn finish(self) -> Result<(), CheckpointError> {
        let parts = self.parts.borrow();
        match parts.keys().min() {
            Some(name) => Err(self.err(name, "loaded for this rank but never used")),
            None => Ok(()),
        }
    }
}

fn stored_as(storage: Storage) -> Option<StoredAs> {
    match storage {
        Storage::Plain(Dtype::F32) => Some(StoredAs::F32),
        Storage::Plain(Dtype::BF16) => Some(StoredAs::Bf16),
        Storage::Fp8 { .. } => Some(StoredAs::Fp8),
        Storage::Fp4 => Some(StoredAs::Fp4),
        Storage::Plain(_) => None,
    }
}

impl TensorSource for RankSource {
    fn f32(&self, name: &str) -> Result<DenseTensor, CheckpointError> {
        let t = self.take_one(name)?;
        let stored = stored_as(t.storage)
            .ok_or_else(|| self.err(name, format!("{:?} is not a float tensor", t.storage)))?;
        Ok(DenseTensor {
            shape: t.shape,
            data: t.data,
            stored,
        })
    }

    /// The staging keeps integer tensors as f32 (exact: expert ids are far below 2^24); they
    /// are checked to be expert ids, as [`crate::model::checkpoint::Checkpoint::load_i64`] does.
    fn i64(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>), CheckpointError> {
        let t = self.take_one(name)?;
        if t.storage != Storage::Plain(Dtype::I64) {
            return Err(self.err(name, format!("expected I64, found {:?}", t.storage)));
        }
        let n = self.experts as f32;
        if let Some(i) = t
            .data
            .iter()
            .position(|&v| !(0.0..n).contains(&v) || v.fract() != 0.0)
        {
            let message = format!(
                "element {i} = {} is not an expert id in [0, {n})",
                t.data[i]
            );
            return Err(self.err(name, message));
        }
        Ok((t.shape, t.data.iter().map(|&v| v as i64).collect()))
    }
}
