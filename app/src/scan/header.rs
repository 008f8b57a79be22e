//! Reads only the JSON header of a `.safetensors` file: an 8-byte little-endian length, then
//! that many bytes of JSON. Tensor data is never read, so checking a 150 GB checkpoint is cheap.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Headers larger than this are treated as damage (real ones are a few MB at most).
const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// What the header says about one shard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardHeader {
    /// Distinct dtype strings, e.g. "BF16", "F8_E4M3", "I8".
    pub dtypes: BTreeSet<String>,
    /// Bytes of tensor data the header describes.
    pub tensor_bytes: u64,
    pub tensor_count: usize,
}

pub fn read_shard_header(path: &Path) -> Result<ShardHeader, String> {
    let mut file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let file_len = file
        .metadata()
        .map_err(|e| format!("cannot stat: {e}"))?
        .len();
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes)
        .map_err(|_| "shorter than the 8-byte header length".to_string())?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES || header_len + 8 > file_len {
        return Err(format!(
            "header length {header_len} does not fit a file of {file_len} bytes"
        ));
    }
    let mut header = vec![0u8; usize::try_from(header_len).map_err(|e| e.to_string())?];
    file.read_exact(&mut header)
        .map_err(|e| format!("cannot read header: {e}"))?;
    parse_header(&header, file_len - 8 - header_len)
}

/// Parses the header JSON; `data_len` is the size of the data section that follows it.
fn parse_header(header: &[u8], data_len: u64) -> Result<ShardHeader, String> {
    let value: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| format!("header is not JSON: {e}"))?;
    let tensors = value
        .as_object()
        .ok_or_else(|| "header is not a JSON object".to_string())?;
    let mut summary = ShardHeader::default();
    for (name, info) in tensors.iter().filter(|(k, _)| *k != "__metadata__") {
        let dtype = info
            .get("dtype")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| format!("tensor {name}: no dtype"))?;
        let (start, end) =
            data_offsets(info).ok_or_else(|| format!("tensor {name}: bad data_offsets"))?;
        if start > end || end > data_len {
            return Err(format!(
                "tensor {name}: data [{start}, {end}) lies outside the {data_len}-byte data section"
            ));
        }
        summary.dtypes.insert(dtype.to_string());
        summary.tensor_bytes += end - start;
        summary.tensor_count += 1;
    }
    Ok(summary)
}

fn data_offsets(info: &serde_json::Value) -> Option<(u64, u64)> {
    let offsets = info.get("data_offsets")?.as_array()?;
    match offsets.as_slice() {
        [a, b] => Some((a.as_u64()?, b.as_u64()?)),
        _ => None,
    }
}

/// Writes a tiny but valid safetensors file (header plus zeroed data), for tests.
#[cfg(test)]
pub fn write_test_shard(path: &Path, tensors: &[(&str, &str, u64)]) {
    use std::io::Write;
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, bytes) in tensors {
        header.insert(
            (*name).to_string(),
            serde_json::json!({"dtype": dtype, "shape": [bytes], "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let json = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap_or_default();
    let mut file = File::create(path).unwrap_or_else(|e| panic!("create {path:?}: {e}"));
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    bytes.resize(bytes.len() + offset as usize, 0);
    file.write_all(&bytes)
        .unwrap_or_else(|e| panic!("write {path:?}: {e}"));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_dtypes_and_sizes_from_the_header_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.safetensors");
        write_test_shard(&path, &[("w", "BF16", 64), ("s", "F8_E4M3", 16)]);
        let header = read_shard_header(&path).unwrap();
        assert_eq!(header.tensor_bytes, 80);
        assert_eq!(header.tensor_count, 2);
        assert!(header.dtypes.contains("F8_E4M3"));
    }

    #[test]
    fn rejects_truncated_or_lying_files() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short.safetensors");
        std::fs::write(&short, [1, 2, 3]).unwrap();
        assert!(read_shard_header(&short).is_err());

        let huge = dir.path().join("huge.safetensors");
        let mut bytes = 1_000_000u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(&huge, bytes).unwrap();
        assert!(read_shard_header(&huge)
            .unwrap_err()
            .contains("does not fit"));

        let header = br#"{"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,100]}}"#;
        assert!(parse_header(header, 8).unwrap_err().contains("outside"));
    }
}
