//! Writes safetensors shards and `model.safetensors.index.json` for a tensor list.
//!
//! Each shard's header is computed from the shapes alone, written first, and then each
//! tensor is generated and streamed out, so at most one tensor is in memory at a time.

use super::init::tensor_data;
use super::SynthError;
use crate::model::checkpoint::{ExpectedTensor, StoredTensor, INDEX_FILE};
use serde_json::{json, Map, Value};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError + '_ {
    move |source| SynthError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn stored_bytes(t: &StoredTensor) -> u64 {
    (t.shape.iter().product::<usize>() * t.dtype.size()) as u64
}

/// Shard file name in the Hugging Face convention.
pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
}

/// The safetensors header for `tensors` laid out in order, padded with spaces to a multiple
/// of 8 bytes as the format recommends.
fn header(tensors: &[StoredTensor]) -> Result<Vec<u8>, SynthError> {
    let mut map = Map::new();
    map.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + stored_bytes(t);
        let entry =
            json!({"dtype": t.dtype.as_str(), "shape": t.shape, "data_offsets": [offset, end]});
        map.insert(t.name.clone(), entry);
        offset = end;
    }
    let mut bytes =
        serde_json::to_vec(&Value::Object(map)).map_err(|e| SynthError::Spec(e.to_string()))?;
    while bytes.len() % 8 != 0 {
        bytes.push(b' ');
    }
    Ok(bytes)
}

/// Writes one shard holding the logical tensors `group` (each with its scale, if any).
fn write_shard(
    path: &Path,
    group: &[ExpectedTensor],
    seed: u64,
    experts: usize,
) -> Result<(), SynthError> {
    let stored: Vec<StoredTensor> = group.iter().flat_map(ExpectedTensor::stored).collect();
    let head = header(&stored)?;
    let file = File::create(path).map_err(io_err(path))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&(head.len() as u64).to_le_bytes())
        .map_err(io_err(path))?;
    w.write_all(&head).map_err(io_err(path))?;
    for t in group {
        for buf in tensor_data(t, seed, experts) {
            w.write_all(&buf).map_err(io_err(path))?;
        }
    }
    w.flush().map_err(io_err(path))
}

/// Splits `tensors` into `shards` contiguous, non-empty groups of about equal count,
/// writes them and the index; returns nothing but the files.
pub fn write_shards(
    dir: &Path,
    tensors: &[ExpectedTensor],
    shards: usize,
    seed: u64,
    experts: usize,
) -> Result<(), SynthError> {
    if shards == 0 || shards > tensors.len() {
        return Err(SynthError::Spec(format!(
            "shards must be in 1..={} (the number of logical tensors), found {shards}",
            tensors.len()
        )));
    }
    let mut weight_map = Map::new();
    let mut total = 0u64;
    let mut start = 0;
    for s in 0..shards {
        let end = (s + 1) * tensors.len() / shards;
        let group = &tensors[start..end];
        let name = shard_name(s, shards);
        write_shard(&dir.join(&name), group, seed, experts)?;
        for t in group.iter().flat_map(ExpectedTensor::stored) {
            total += stored_bytes(&t);
            weight_map.insert(t.name, Value::String(name.clone()));
        }
        start = end;
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    write_json(&dir.join(INDEX_FILE), &index)
}

/// Pretty-printed JSON file.
pub fn write_json(path: &Path, value: &Value) -> Result<(), SynthError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| SynthError::Spec(e.to_string()))?;
    std::fs::write(path, text + "\n").map_err(io_err(path))
}
