//! Checkpoint loading: `model.safetensors.index.json` plus memory-mapped shards, every tensor
//! checked by name, dtype and shape against the config; FP8/FP4 dequantisation (spec §4).
//!
//! PUBLIC API CONTRACT (used by the reference model; keep these signatures):
//! - `Checkpoint::open(dir) -> Result<Checkpoint, CheckpointError>`: reads config.json and the index,
//!   maps every shard lazily, validates every expected tensor's header (dtype, shape) without
//!   touching tensor data.
//! - `Checkpoint::config(&self) -> &ModelConfig`
//! - `Checkpoint::load_f32(&self, name) -> Result<DenseTensor, CheckpointError>`: dequantised f32
//!   (BF16/F32 converted; FP8 x block scale; FP4 x per-32 scale), `stored` says which.
//! - `Checkpoint::load_i64(&self, name) -> Result<(Vec<usize>, Vec<i64>), CheckpointError>`
//! - `Checkpoint::raw(&self, name) -> Result<RawTensor<'_>, CheckpointError>`: the stored bytes,
//!   borrowed from the mapping, for a GPU loader.

pub mod dequant;
mod dtype;
mod expected;
mod index;
mod load;
mod shard;

pub use dtype::Dtype;
pub use expected::{
    expected_tensors, scale_name, ExpectedTensor, Role, Storage, StoredTensor, FP4_GROUP,
};
pub use index::INDEX_FILE;
pub use load::RawTensor;

use super::config::ModelConfig;
use dtype::shape_str;
use shard::{Shard, TensorInfo};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The config file inside a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";

/// How a tensor was stored on disk before dequantisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredAs {
    F32,
    Bf16,
    /// FP8 e4m3 with 128x128 UE8M0 block scales.
    Fp8,
    /// FP4 e2m1 packed in an I8 container with per-32 UE8M0 scales.
    Fp4,
}

impl StoredAs {
    /// Whether the official runtime runs this weight as an FP8/FP4 GEMM (and so
    /// fake-quantises the activation feeding it).
    pub fn is_quantized(self) -> bool {
        matches!(self, StoredAs::Fp8 | StoredAs::Fp4)
    }
}

/// A tensor dequantised to f32, row-major.
#[derive(Debug, Clone)]
pub struct DenseTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    pub stored: StoredAs,
}

/// Anything that goes wrong opening or reading a checkpoint; always names the file and tensor.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Config(#[from] super::config::ConfigError),
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error("{file}: tensor `{tensor}`: {message}")]
    Tensor {
        file: String,
        tensor: String,
        message: String,
    },
}

/// An opened checkpoint directory: config, index and mapped shards, all headers validated.
pub struct Checkpoint {
    config: ModelConfig,
    dir: PathBuf,
    shards: Vec<Shard>,
    /// Tensor name -> index into `shards`, for every tensor of the index.
    locations: BTreeMap<String, usize>,
    unexpected: Vec<String>,
    index_total_size: Option<u64>,
}

impl Checkpoint {
    /// Opens `dir`: parses `config.json` and the index, maps every shard named in the index
    /// (headers only, no tensor data is read) and checks every tensor the config implies.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let config = ModelConfig::from_file(&dir.join(CONFIG_FILE))?;
        let index_path = dir.join(INDEX_FILE);
        let index = index::read_index(&index_path)?;
        let (shards, locations) = map_shards(dir, &index.weight_map)?;
        let mut ckpt = Checkpoint {
            config,
            dir: dir.to_path_buf(),
            shards,
            locations,
            unexpected: Vec::new(),
            index_total_size: index.total_size,
        };
        ckpt.unexpected = ckpt.check_expected(&index_path)?;
        Ok(ckpt)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every tensor name of the index, sorted.
    pub fn tensor_names(&self) -> Vec<&str> {
        self.locations.keys().map(String::as_str).collect()
    }

    /// Tensors of the index the config does not imply (sorted); they are mapped but unused.
    pub fn unexpected_tensors(&self) -> &[String] {
        &self.unexpected
    }

    /// Whether the index has a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.locations.contains_key(name)
    }

    /// Sum of the data sizes of every tensor in the index.
    pub fn total_bytes(&self) -> u64 {
        self.locations
            .iter()
            .filter_map(|(name, &s)| self.shards.get(s)?.tensors.get(name))
            .map(|t| (t.end - t.start) as u64)
            .sum()
    }

    /// `metadata.total_size` of the index, if it has one (informational: not checked).
    pub fn index_total_size(&self) -> Option<u64> {
        self.index_total_size
    }

    /// The shard and header entry of `name`.
    fn locate(&self, name: &str) -> Result<(&Shard, &TensorInfo), CheckpointError> {
        let not_found = || CheckpointError::Tensor {
            file: self.dir.join(INDEX_FILE).display().to_string(),
            tensor: name.to_string(),
            message: "not in the checkpoint's weight_map".into(),
        };
        let shard = self
            .locations
            .get(name)
            .and_then(|&s| self.shards.get(s))
            .ok_or_else(not_found)?;
        let info = shard.tensors.get(name).ok_or_else(not_found)?;
        Ok((shard, info))
    }

    /// Checks every expected tensor's presence, dtype and shape; returns the index's extras.
    fn check_expected(&self, index_path: &Path) -> Result<Vec<String>, CheckpointError> {
        let mut seen = HashSet::new();
        for logical in expected_tensors(&self.config) {
            for want in logical.stored() {
                self.check_one(index_path, &want)?;
                seen.insert(want.name);
            }
        }
        Ok(self
            .locations
            .keys()
            .filter(|n| !seen.contains(*n))
            .cloned()
            .collect())
    }

    fn check_one(&self, index_path: &Path, want: &StoredTensor) -> Result<(), CheckpointError> {
        let expected = format!("{} {}", want.dtype, shape_str(&want.shape));
        let Ok((shard, info)) = self.locate(&want.name) else {
            return Err(CheckpointError::Tensor {
                file: index_path.display().to_string(),
                tensor: want.name.clone(),
                message: format!("missing from weight_map (expected {expected})"),
            });
        };
        if info.dtype != want.dtype || info.shape != want.shape {
            let what = if info.dtype != want.dtype {
                "wrong dtype"
            } else {
                "wrong shape"
            };
            return Err(CheckpointError::Tensor {
                file: shard.path.display().to_string(),
                tensor: want.name.clone(),
                message: format!(
                    "{what}: expected {expected}, found {} {}",
                    info.dtype,
                    shape_str(&info.shape)
                ),
            });
        }
        Ok(())
    }
}

type ShardMaps = (Vec<Shard>, BTreeMap<String, usize>);

/// Maps each distinct shard of the weight map once and checks that every tensor the index
/// assigns to it is in its header.
fn map_shards(
    dir: &Path,
    weight_map: &BTreeMap<String, String>,
) -> Result<ShardMaps, CheckpointError> {
    let mut shard_ids: BTreeMap<&str, usize> = BTreeMap::new();
    let mut shards = Vec::new();
    let mut locations = BTreeMap::new();
    for (name, file) in weight_map {
        let id = match shard_ids.get(file.as_str()) {
            Some(&id) => id,
            None => {
                let path = dir.join(file);
                if !path.is_file() {
                    return Err(CheckpointError::Tensor {
                        file: path.display().to_string(),
                        tensor: name.clone(),
                        message: format!("shard named in {INDEX_FILE} does not exist"),
                    });
                }
                shards.push(Shard::open(&path)?);
                shard_ids.insert(file, shards.len() - 1);
                shards.len() - 1
            }
        };
        let shard = &shards[id];
        if !shard.tensors.contains_key(name) {
            return Err(CheckpointError::Tensor {
                file: shard.path.display().to_string(),
                tensor: name.clone(),
                message: format!(
                    "listed for this shard in {INDEX_FILE} but absent from its header"
                ),
            });
        }
        locations.insert(name.clone(), id);
    }
    Ok((shards, locations))
}
