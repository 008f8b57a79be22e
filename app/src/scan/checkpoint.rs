//! Checks one checkpoint folder: config, index, shard headers.

use super::header::read_shard_header;
use super::{CacheShape, CheckpointSummary, ScanProblem, WeightFormat};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

pub const CONFIG_FILE: &str = "config.json";
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Config and index files are small; anything bigger is not what we think it is.
const MAX_JSON_BYTES: u64 = 64 * 1024 * 1024;

pub fn inspect_checkpoint(folder: &Path) -> Result<CheckpointSummary, ScanProblem> {
    let config = read_json(&folder.join(CONFIG_FILE)).map_err(ScanProblem::BadConfig)?;
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    if model_type != "deepseek_v4" {
        return Err(ScanProblem::Foreign(model_type.to_string()));
    }
    let layers = config_usize(&config, "num_hidden_layers")?;
    let cache = cache_shape(&config)?;
    let shard_names = shard_names(folder)?;
    let mut formats = config_formats(&config);
    let expert_fp4 = config.get("expert_dtype").and_then(Value::as_str) == Some("fp4");
    let mut weights_bytes = 0;
    for name in &shard_names {
        let header =
            read_shard_header(&folder.join(name)).map_err(|reason| ScanProblem::BadShard {
                file: name.clone(),
                reason,
            })?;
        weights_bytes += header.tensor_bytes;
        formats.extend(
            header
                .dtypes
                .iter()
                .filter_map(|d| dtype_format(d, expert_fp4)),
        );
    }
    Ok(CheckpointSummary {
        layers,
        size_on_disk: folder_size(folder),
        weights_bytes,
        formats,
        shards: shard_names.len(),
        cache,
    })
}

fn read_json(path: &Path) -> Result<Value, String> {
    let len = std::fs::metadata(path)
        .map_err(|e| format!("cannot read: {e}"))?
        .len();
    if len > MAX_JSON_BYTES {
        return Err(format!("{len} bytes is too large for this file"));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("not valid JSON: {e}"))
}

fn config_usize(config: &Value, field: &str) -> Result<usize, ScanProblem> {
    config
        .get(field)
        .and_then(Value::as_u64)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| ScanProblem::BadConfig(format!("`{field}` missing or not a whole number")))
}

fn cache_shape(config: &Value) -> Result<CacheShape, ScanProblem> {
    let ratios = config
        .get("compress_ratios")
        .and_then(Value::as_array)
        .ok_or_else(|| ScanProblem::BadConfig("`compress_ratios` missing".into()))?
        .iter()
        .map(|v| v.as_u64().and_then(|v| usize::try_from(v).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| {
            ScanProblem::BadConfig("`compress_ratios` must hold whole numbers".into())
        })?;
    Ok(CacheShape {
        head_dim: config_usize(config, "head_dim")?,
        index_head_dim: config_usize(config, "index_head_dim")?,
        sliding_window: config_usize(config, "sliding_window").unwrap_or(128),
        compress_ratios: ratios,
    })
}

/// Formats the config declares (FP8 linears, FP4/FP8 experts), before looking at headers.
fn config_formats(config: &Value) -> BTreeSet<WeightFormat> {
    let mut formats = BTreeSet::new();
    let quant = config
        .get("quantization_config")
        .and_then(|q| q.get("quant_method"))
        .and_then(Value::as_str);
    if quant == Some("fp8") {
        formats.insert(WeightFormat::Fp8);
    }
    match config.get("expert_dtype").and_then(Value::as_str) {
        Some("fp4") => formats.insert(WeightFormat::Fp4),
        Some("fp8") => formats.insert(WeightFormat::Fp8),
        Some("bf16") => formats.insert(WeightFormat::Bf16),
        _ => false,
    };
    formats
}

/// The weight format a safetensors dtype stands for; scales and indices (F8_E8M0, F32, I64)
/// are not weight formats. FP4 experts are packed in an I8 container.
fn dtype_format(dtype: &str, expert_fp4: bool) -> Option<WeightFormat> {
    match dtype {
        "BF16" => Some(WeightFormat::Bf16),
        "F8_E4M3" => Some(WeightFormat::Fp8),
        "F4" => Some(WeightFormat::Fp4),
        "I8" if expert_fp4 => Some(WeightFormat::Fp4),
        _ => None,
    }
}

/// The distinct shard files the index names; each must exist.
fn shard_names(folder: &Path) -> Result<BTreeSet<String>, ScanProblem> {
    let index_path = folder.join(INDEX_FILE);
    if !index_path.is_file() {
        return Err(ScanProblem::BadIndex("missing".into()));
    }
    let index = read_json(&index_path).map_err(ScanProblem::BadIndex)?;
    let weight_map = index
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| ScanProblem::BadIndex("no `weight_map` object".into()))?;
    let names = weight_map
        .values()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<BTreeSet<String>>>()
        .ok_or_else(|| ScanProblem::BadIndex("`weight_map` values must be file names".into()))?;
    if names.is_empty() {
        return Err(ScanProblem::BadIndex("`weight_map` is empty".into()));
    }
    if let Some(missing) = names.iter().find(|n| !folder.join(n).is_file()) {
        return Err(ScanProblem::BadShard {
            file: missing.clone(),
            reason: "listed in the index but missing".into(),
        });
    }
    Ok(names)
}

/// Bytes of the regular files directly in `folder` (checkpoints are flat).
fn folder_size(folder: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}
