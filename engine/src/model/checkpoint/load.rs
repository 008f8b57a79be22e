//! Reading single tensors out of the mapped shards: dequantised f32, int64, or raw bytes.

use super::dequant::{self, first_e4m3_nan, first_ue8m0_nan};
use super::dtype::{shape_str, Dtype};
use super::expected::{scale_name, FP4_GROUP};
use super::shard::{Shard, TensorInfo};
use super::{Checkpoint, CheckpointError, DenseTensor, StoredAs};
use crate::model::config::LinearFormat;

/// FP8 block size when the config does not say (FP8 experts in a BF16-linear checkpoint).
const DEFAULT_FP8_BLOCK: usize = 128;

/// A tensor's stored bytes, borrowed from the shard mapping (not aligned; little-endian).
#[derive(Debug, Clone, Copy)]
pub struct RawTensor<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

fn err(shard: &Shard, tensor: &str, message: impl Into<String>) -> CheckpointError {
    CheckpointError::Tensor {
        file: shard.path.display().to_string(),
        tensor: tensor.to_string(),
        message: message.into(),
    }
}

impl Checkpoint {
    /// The stored bytes of `name`, as they are on disk.
    pub fn raw(&self, name: &str) -> Result<RawTensor<'_>, CheckpointError> {
        let (shard, info) = self.locate(name)?;
        Ok(RawTensor {
            dtype: info.dtype,
            shape: &info.shape,
            bytes: shard.bytes(info),
        })
    }

    /// Loads `name` dequantised to f32. For FP8 (`F8_E4M3`) and FP4 (`I8`) weights the
    /// matching `.scale` tensor is found and applied automatically.
    pub fn load_f32(&self, name: &str) -> Result<DenseTensor, CheckpointError> {
        let (shard, info) = self.locate(name)?;
        let bytes = shard.bytes(info);
        let dense = |data, stored| DenseTensor {
            shape: info.shape.clone(),
            data,
            stored,
        };
        match info.dtype {
            Dtype::F32 => Ok(dense(dequant::f32_from_le(bytes), StoredAs::F32)),
            Dtype::BF16 => Ok(dense(dequant::bf16_to_f32(bytes), StoredAs::Bf16)),
            Dtype::F8_E4M3 => self.load_fp8(name, shard, info),
            Dtype::I8 => self.load_fp4(name, shard, info),
            other => Err(err(
                shard,
                name,
                format!(
                    "cannot load {other} as f32 (only F32, BF16, F8_E4M3 + scale, I8 FP4 + scale)"
                ),
            )),
        }
    }

    /// Loads an I64 tensor (the hash-routing `tid2eid`) as (shape, values). For `tid2eid`
    /// every value must be a valid expert id.
    pub fn load_i64(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>), CheckpointError> {
        let (shard, info) = self.locate(name)?;
        if info.dtype != Dtype::I64 {
            return Err(err(
                shard,
                name,
                format!("wrong dtype: expected I64, found {}", info.dtype),
            ));
        }
        let values: Vec<i64> = shard
            .bytes(info)
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        if name.ends_with("tid2eid") {
            let n = self.config.n_routed_experts as i64;
            if let Some(i) = values.iter().position(|&v| v < 0 || v >= n) {
                return Err(err(
                    shard,
                    name,
                    format!(
                        "element {i} = {} is not an expert id in [0, {n})",
                        values[i]
                    ),
                ));
            }
        }
        Ok((info.shape.clone(), values))
    }

    /// The `.scale` companion of a quantised weight, with its shape checked.
    fn scale_of(&self, name: &str, want: &[usize]) -> Result<(&Shard, &[u8]), CheckpointError> {
        let sname = scale_name(name);
        let (shard, info) = self.locate(&sname).map_err(|_| {
            let (wshard, _) = self.locate(name).ok().unzip();
            CheckpointError::Tensor {
                file: wshard.map_or_else(
                    || self.dir.display().to_string(),
                    |s| s.path.display().to_string(),
                ),
                tensor: name.to_string(),
                message: format!("quantised weight has no scale tensor `{sname}` in the index"),
            }
        })?;
        if info.dtype != Dtype::F8_E8M0 || info.shape != want {
            return Err(err(
                shard,
                &sname,
                format!(
                    "expected F8_E8M0 {}, found {} {}",
                    shape_str(want),
                    info.dtype,
                    shape_str(&info.shape)
                ),
            ));
        }
        let bytes = shard.bytes(info);
        if let Some(i) = first_ue8m0_nan(bytes) {
            return Err(err(
                shard,
                &sname,
                format!("element {i} is the UE8M0 NaN code 255"),
            ));
        }
        Ok((shard, bytes))
    }

    fn load_fp8(
        &self,
        name: &str,
        shard: &Shard,
        info: &TensorInfo,
    ) -> Result<DenseTensor, CheckpointError> {
        let [rows, cols] = two_dims(shard, name, info)?;
        let block = match self.config.linear_format {
            LinearFormat::Fp8 { block } => block,
            LinearFormat::Bf16 => DEFAULT_FP8_BLOCK,
        };
        let (_, scale) = self.scale_of(name, &[rows.div_ceil(block), cols.div_ceil(block)])?;
        let codes = shard.bytes(info);
        if let Some(i) = first_e4m3_nan(codes) {
            return Err(err(
                shard,
                name,
                format!("element {i} is an e4m3 NaN code ({:#04x})", codes[i]),
            ));
        }
        Ok(DenseTensor {
            shape: vec![rows, cols],
            data: dequant::dequant_fp8(codes, rows, cols, scale, block),
            stored: StoredAs::Fp8,
        })
    }

    fn load_fp4(
        &self,
        name: &str,
        shard: &Shard,
        info: &TensorInfo,
    ) -> Result<DenseTensor, CheckpointError> {
        let [rows, half] = two_dims(shard, name, info)?;
        let cols = half * 2;
        if !cols.is_multiple_of(FP4_GROUP) {
            return Err(err(
                shard,
                name,
                format!("FP4 weight has {cols} logical columns, not a multiple of {FP4_GROUP}"),
            ));
        }
        let (_, scale) = self.scale_of(name, &[rows, cols / FP4_GROUP])?;
        Ok(DenseTensor {
            shape: vec![rows, cols],
            data: dequant::dequant_fp4(shard.bytes(info), rows, cols, scale),
            stored: StoredAs::Fp4,
        })
    }
}

fn two_dims(shard: &Shard, name: &str, info: &TensorInfo) -> Result<[usize; 2], CheckpointError> {
    match info.shape.as_slice() {
        [r, c] => Ok([*r, *c]),
        other => Err(err(
            shard,
            name,
            format!(
                "quantised {} weight must be 2-D, found shape {}",
                info.dtype,
                shape_str(other)
            ),
        )),
    }
}
