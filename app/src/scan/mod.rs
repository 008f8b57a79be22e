//! Finds DeepSeek-V4 checkpoints in the folders the user lists and checks them cheaply:
//! `config.json`, `model.safetensors.index.json` and the safetensors headers, never tensor data.
//!
//! A listed folder may be a checkpoint itself or hold checkpoints one level down. Folders that
//! look like a model but cannot be used are listed with the reason, so the user knows why their
//! download does not show up.

mod checkpoint;
pub mod estimate;
pub mod header;

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

pub use checkpoint::inspect_checkpoint;

/// How weights are stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WeightFormat {
    Bf16,
    Fp8,
    Fp4,
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Fp8 => "fp8",
            WeightFormat::Fp4 => "fp4",
        })
    }
}

/// The config facts that size the per-sequence caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheShape {
    pub head_dim: usize,
    pub index_head_dim: usize,
    pub sliding_window: usize,
    /// One entry per layer, MTP blocks included.
    pub compress_ratios: Vec<usize>,
}

/// A usable checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointSummary {
    pub layers: usize,
    pub size_on_disk: u64,
    /// Bytes of tensor data according to the shard headers.
    pub weights_bytes: u64,
    pub formats: BTreeSet<WeightFormat>,
    pub shards: usize,
    pub cache: CacheShape,
}

impl CheckpointSummary {
    pub fn formats_text(&self) -> String {
        let names: Vec<String> = self.formats.iter().map(|f| f.to_string()).collect();
        names.join(" + ")
    }
}

/// Why a folder is not a usable checkpoint.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScanProblem {
    #[error("folder not found or not readable")]
    NotAFolder,
    #[error("no checkpoint here (no config.json in it or its subfolders)")]
    NothingFound,
    #[error("not a DeepSeek-V4 checkpoint (model_type {0:?})")]
    Foreign(String),
    #[error("config.json: {0}")]
    BadConfig(String),
    #[error("model.safetensors.index.json: {0}")]
    BadIndex(String),
    #[error("{file}: {reason}")]
    BadShard { file: String, reason: String },
}

/// One folder the scan looked at.
#[derive(Debug, Clone, PartialEq)]
pub struct ScannedModel {
    pub folder: PathBuf,
    pub name: String,
    pub result: Result<CheckpointSummary, ScanProblem>,
}

impl ScannedModel {
    fn new(folder: &Path, result: Result<CheckpointSummary, ScanProblem>) -> Self {
        let name = folder
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| folder.display().to_string());
        ScannedModel {
            folder: folder.to_path_buf(),
            name,
            result,
        }
    }
}

/// Scans each listed folder: the folder itself if it has a `config.json`, else its subfolders.
pub fn scan_folders(folders: &[PathBuf]) -> Vec<ScannedModel> {
    folders.iter().flat_map(|f| scan_folder(f)).collect()
}

fn scan_folder(folder: &Path) -> Vec<ScannedModel> {
    if !folder.is_dir() {
        return vec![ScannedModel::new(folder, Err(ScanProblem::NotAFolder))];
    }
    if folder.join(checkpoint::CONFIG_FILE).is_file() {
        return vec![ScannedModel::new(folder, inspect_checkpoint(folder))];
    }
    let candidates: Vec<ScannedModel> = subfolders(folder)
        .into_iter()
        .filter(|sub| sub.join(checkpoint::CONFIG_FILE).is_file())
        .map(|sub| ScannedModel::new(&sub, inspect_checkpoint(&sub)))
        .collect();
    if candidates.is_empty() {
        vec![ScannedModel::new(folder, Err(ScanProblem::NothingFound))]
    } else {
        candidates
    }
}

fn subfolders(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "scan_tests.rs"]
mod tests;
