//! `model.safetensors.index.json`: `{"metadata": {"total_size": N}, "weight_map": {name: shard}}`.

use super::CheckpointError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The parsed index.
#[derive(Debug)]
pub struct Index {
    /// Tensor name -> shard file name (sorted by tensor name).
    pub weight_map: BTreeMap<String, String>,
    /// `metadata.total_size`, when present.
    pub total_size: Option<u64>,
}

fn err(path: &Path, message: impl Into<String>) -> CheckpointError {
    CheckpointError::File {
        file: path.display().to_string(),
        message: message.into(),
    }
}

/// Reads and parses the index file at `path`.
pub fn read_index(path: &Path) -> Result<Index, CheckpointError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| err(path, format!("cannot read index: {e}")))?;
    parse_index(path, &text)
}

/// Parses index text; `path` is only used in messages.
pub fn parse_index(path: &Path, text: &str) -> Result<Index, CheckpointError> {
    let json: Value =
        serde_json::from_str(text).map_err(|e| err(path, format!("malformed index JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| err(path, "malformed index: no `weight_map` object"))?;
    let mut weight_map = BTreeMap::new();
    for (name, shard) in map {
        let shard = shard.as_str().ok_or_else(|| CheckpointError::Tensor {
            file: path.display().to_string(),
            tensor: name.clone(),
            message: "malformed index: shard name is not a string".into(),
        })?;
        check_shard_name(path, name, shard)?;
        weight_map.insert(name.clone(), shard.to_string());
    }
    let total_size = json
        .get("metadata")
        .and_then(|m| m.get("total_size"))
        .and_then(Value::as_u64);
    Ok(Index {
        weight_map,
        total_size,
    })
}

/// Shards must be plain file names inside the checkpoint directory: a name with a path
/// separator or `..` could make us map an arbitrary file.
fn check_shard_name(path: &Path, tensor: &str, shard: &str) -> Result<(), CheckpointError> {
    let plain = !shard.is_empty() && !shard.contains(['/', '\\']) && shard != "." && shard != "..";
    if plain {
        Ok(())
    } else {
        Err(CheckpointError::Tensor {
            file: path.display().to_string(),
            tensor: tensor.to_string(),
            message: format!(
                "shard name {shard:?} is not a plain file name in the checkpoint directory"
            ),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_weight_map_and_total_size() {
        let text = r#"{"metadata": {"total_size": 12}, "weight_map": {"b": "s1", "a": "s2"}}"#;
        let idx = parse_index(Path::new("i.json"), text).unwrap();
        assert_eq!(idx.total_size, Some(12));
        let names: Vec<&String> = idx.weight_map.keys().collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn rejects_paths_and_missing_map() {
        let e = parse_index(Path::new("i.json"), r#"{"weight_map": {"t": "../x"}}"#).unwrap_err();
        assert!(e.to_string().contains("i.json") && e.to_string().contains("`t`"));
        let e = parse_index(Path::new("i.json"), r#"{"metadata": {}}"#).unwrap_err();
        assert!(e.to_string().contains("weight_map"));
    }
}
