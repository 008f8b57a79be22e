//! Shared helpers for the end-to-end and golden tests: locating the golden sets, reading
//! `.npy`, `tokens.json` and safetensors files of reference outputs.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// A golden set by name: the repository copy under `tests/data/` first, then `../shared/golden/`.
/// `None` (with a printed reason) when neither exists, so the caller can skip.
pub fn golden_set(name: &str) -> Option<PathBuf> {
    let root = workspace_root();
    let candidates = [
        root.join("tests/data").join(name),
        root.join("../shared/golden").join(name),
    ];
    let found = candidates
        .iter()
        .find(|p| p.join("README.md").exists())
        .cloned();
    if found.is_none() {
        eprintln!(
            "SKIP: golden set `{name}` not found (looked in tests/data and ../shared/golden)"
        );
    }
    found
}

/// The teacher-forcing inputs of a golden variant.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct GoldenTokens {
    pub prompt_ids: Vec<u32>,
    pub decode_fed_ids: Vec<u32>,
    pub all_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
}

pub fn read_tokens(path: &Path) -> Result<GoldenTokens> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    Ok(serde_json::from_str(&text)?)
}

/// A float32 `.npy` file: shape and values.
pub fn read_npy_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        bail!("{}: not an npy file", path.display());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[start..start + header_len])?;
    if !header.contains("'<f4'") || header.contains("'fortran_order': True") {
        bail!(
            "{}: expected little-endian C-order float32, header {header}",
            path.display()
        );
    }
    let shape_txt = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| anyhow!("no shape in npy header"))?;
    let shape = shape_txt
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()?;
    let data = bytes[start + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((shape, data))
}

/// Tensors by name: shape and values as f32.
pub type TensorMap = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Every tensor of a safetensors file as f32 (I64 converted), by name, with its shape.
pub fn read_safetensors_f32(path: &Path) -> Result<TensorMap> {
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let data: Vec<f32> = match view.dtype() {
            safetensors::Dtype::F32 => view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            safetensors::Dtype::I64 => view
                .data()
                .chunks_exact(8)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    i64::from_le_bytes(b) as f32
                })
                .collect(),
            other => bail!(
                "{}: tensor {name}: unsupported dtype {other:?}",
                path.display()
            ),
        };
        out.insert(name, (view.shape().to_vec(), data));
    }
    Ok(out)
}

/// Largest absolute difference of two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Index of the largest value.
pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}
pub mod engine_harness;
