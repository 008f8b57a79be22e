//! One memory-mapped safetensors shard: the 8-byte little-endian header length, the JSON
//! header, then the tensor data. Only the header is read; the data stays untouched in the
//! mapping until a tensor is loaded.

use super::dtype::{shape_str, Dtype};
use super::CheckpointError;
use memmap2::Mmap;
use serde_json::Value;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Headers larger than this are certainly corrupt (the real 46-shard checkpoint's largest
/// is well under 1 MiB); refusing them avoids allocating for a garbage length.
const MAX_HEADER_BYTES: u64 = 100 << 20;

/// Where one tensor lives inside a shard's mapping.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file (header offsets + data start).
    pub start: usize,
    pub end: usize,
}

/// A mapped shard and its parsed header.
pub struct Shard {
    pub path: PathBuf,
    pub map: Mmap,
    pub tensors: HashMap<String, TensorInfo>,
}

fn file_err(path: &Path, message: impl Into<String>) -> CheckpointError {
    CheckpointError::File {
        file: path.display().to_string(),
        message: message.into(),
    }
}

fn tensor_err(path: &Path, tensor: &str, message: impl Into<String>) -> CheckpointError {
    CheckpointError::Tensor {
        file: path.display().to_string(),
        tensor: tensor.to_string(),
        message: message.into(),
    }
}

impl Shard {
    /// Maps `path` and parses its header, checking every tensor's byte range.
    pub fn open(path: &Path) -> Result<Shard, CheckpointError> {
        let file =
            File::open(path).map_err(|e| file_err(path, format!("cannot open shard: {e}")))?;
        // SAFETY: the mapping is read-only and the checkpoint is treated as immutable while
        // open; like every mmap-based loader we rely on nobody truncating or rewriting the
        // files underneath us (that would be a SIGBUS / torn read, not memory unsafety in
        // our own code paths, which only ever read through `&[u8]`).
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| file_err(path, format!("cannot memory-map shard: {e}")))?;
        let tensors = parse_header(path, &map)?;
        Ok(Shard {
            path: path.to_path_buf(),
            map,
            tensors,
        })
    }

    /// The bytes of one tensor (its range was checked at open).
    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        self.map.get(info.start..info.end).unwrap_or(&[])
    }
}

/// Parses the header of a mapped shard; `bytes` is the whole file.
pub fn parse_header(
    path: &Path,
    bytes: &[u8],
) -> Result<HashMap<String, TensorInfo>, CheckpointError> {
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            file_err(
                path,
                format!(
                    "file is {} bytes, too short for a safetensors header",
                    bytes.len()
                ),
            )
        })?;
    let header_len = u64::from_le_bytes(len_bytes);
    let available = bytes.len() as u64 - 8;
    if header_len > MAX_HEADER_BYTES || header_len > available {
        return Err(file_err(
            path,
            format!("header length {header_len} exceeds the file ({available} bytes after the length prefix)"),
        ));
    }
    let data_start = 8 + header_len as usize;
    let json: Value = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| file_err(path, format!("malformed safetensors header JSON: {e}")))?;
    let obj = json
        .as_object()
        .ok_or_else(|| file_err(path, "malformed safetensors header: not a JSON object"))?;
    let data_len = bytes.len() - data_start;
    let mut tensors = HashMap::with_capacity(obj.len());
    for (name, entry) in obj {
        if name == "__metadata__" {
            continue;
        }
        let info = parse_entry(path, name, entry, data_start, data_len)?;
        tensors.insert(name.clone(), info);
    }
    Ok(tensors)
}

/// One header entry `{dtype, shape, data_offsets}`, with its byte range checked.
fn parse_entry(
    path: &Path,
    name: &str,
    entry: &Value,
    data_start: usize,
    data_len: usize,
) -> Result<TensorInfo, CheckpointError> {
    let bad = |what: &str| tensor_err(path, name, format!("malformed header entry: {what}"));
    let dtype_str = entry
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no `dtype` string"))?;
    let dtype =
        Dtype::parse(dtype_str).ok_or_else(|| bad(&format!("unknown dtype {dtype_str:?}")))?;
    let shape = usize_array(entry.get("shape"))
        .ok_or_else(|| bad("`shape` is not an array of integers"))?;
    let offsets = usize_array(entry.get("data_offsets"))
        .filter(|o| o.len() == 2)
        .ok_or_else(|| bad("`data_offsets` is not two integers"))?;
    let (begin, end) = (offsets[0], offsets[1]);
    let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let want = numel.and_then(|n| n.checked_mul(dtype.size()));
    if end < begin || Some(end - begin) != want {
        return Err(tensor_err(
            path,
            name,
            format!(
                "data_offsets [{begin}, {end}] hold {} bytes but {dtype} {} needs {}",
                end.saturating_sub(begin),
                shape_str(&shape),
                want.map_or("an overflowing size".to_string(), |w| w.to_string())
            ),
        ));
    }
    if end > data_len {
        return Err(tensor_err(
            path,
            name,
            format!("shard is truncated: tensor data ends at byte {end} of the data section but only {data_len} bytes are present"),
        ));
    }
    Ok(TensorInfo {
        dtype,
        shape,
        start: data_start + begin,
        end: data_start + end,
    })
}

fn usize_array(v: Option<&Value>) -> Option<Vec<usize>> {
    v?.as_array()?
        .iter()
        .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
        .collect()
}
