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

use super::config::ModelConfig;

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

/// An opened checkpoint directory (TEMPORARY minimal loader until the real one lands).
pub struct Checkpoint {
    config: ModelConfig,
    dir: std::path::PathBuf,
    map: std::collections::HashMap<String, String>,
}

fn ferr(file: &str, message: impl ToString) -> CheckpointError {
    CheckpointError::File {
        file: file.into(),
        message: message.to_string(),
    }
}

impl Checkpoint {
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn open(dir: &std::path::Path) -> Result<Self, CheckpointError> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let idx = dir.join("model.safetensors.index.json");
        let text = std::fs::read_to_string(&idx).map_err(|e| ferr("index", e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ferr("index", e))?;
        let map = v["weight_map"]
            .as_object()
            .ok_or_else(|| ferr("index", "no weight_map"))?
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        Ok(Checkpoint {
            config,
            dir: dir.to_path_buf(),
            map,
        })
    }

    fn raw(
        &self,
        name: &str,
    ) -> Result<(safetensors::Dtype, Vec<usize>, Vec<u8>), CheckpointError> {
        let file = self
            .map
            .get(name)
            .ok_or_else(|| ferr("index", format!("missing {name}")))?;
        let bytes = std::fs::read(self.dir.join(file)).map_err(|e| ferr(file, e))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| ferr(file, e))?;
        let t = st.tensor(name).map_err(|e| ferr(file, e))?;
        Ok((t.dtype(), t.shape().to_vec(), t.data().to_vec()))
    }

    pub fn load_i64(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>), CheckpointError> {
        let (_, shape, data) = self.raw(name)?;
        let v = data
            .chunks(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                i64::from_le_bytes(b)
            })
            .collect();
        Ok((shape, v))
    }

    pub fn load_f32(&self, name: &str) -> Result<DenseTensor, CheckpointError> {
        use safetensors::Dtype;
        let (dt, shape, data) = self.raw(name)?;
        let e8 = |b: u8| (f32::from(b) - 127.0).exp2();
        match dt {
            Dtype::F32 => Ok(DenseTensor {
                data: data
                    .chunks(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                shape,
                stored: StoredAs::F32,
            }),
            Dtype::BF16 => Ok(DenseTensor {
                data: data
                    .chunks(2)
                    .map(|c| f32::from_bits((u32::from(c[1]) << 24) | (u32::from(c[0]) << 16)))
                    .collect(),
                shape,
                stored: StoredAs::Bf16,
            }),
            Dtype::F8_E4M3 => {
                let sname = name.replace(".weight", ".scale");
                let (_, sshape, sdata) = self.raw(&sname)?;
                let (o, i) = (shape[0], shape[1]);
                let mut out = vec![0f32; o * i];
                for r in 0..o {
                    for c in 0..i {
                        let b = data[r * i + c];
                        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
                        let e = i32::from((b >> 3) & 0xf);
                        let m = f32::from(b & 7);
                        let v = if e == 0 {
                            m / 8.0 * 2f32.powi(-6)
                        } else {
                            (1.0 + m / 8.0) * 2f32.powi(e - 7)
                        };
                        out[r * i + c] = s * v * e8(sdata[(r / 128) * sshape[1] + c / 128]);
                    }
                }
                Ok(DenseTensor {
                    data: out,
                    shape,
                    stored: StoredAs::Fp8,
                })
            }
            Dtype::I8 => {
                let sname = name.replace(".weight", ".scale");
                let (_, sshape, sdata) = self.raw(&sname)?;
                let (o, half) = (shape[0], shape[1]);
                let i = half * 2;
                let tbl = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
                let dec = |n: u8| {
                    let v = tbl[usize::from(n & 7)];
                    if n & 8 != 0 {
                        -v
                    } else {
                        v
                    }
                };
                let mut out = vec![0f32; o * i];
                for r in 0..o {
                    for k in 0..half {
                        let b = data[r * half + k];
                        for (j, nib) in [(2 * k, b & 0xf), (2 * k + 1, b >> 4)] {
                            out[r * i + j] = dec(nib) * e8(sdata[r * sshape[1] + j / 32]);
                        }
                    }
                }
                Ok(DenseTensor {
                    data: out,
                    shape: vec![o, i],
                    stored: StoredAs::Fp4,
                })
            }
            other => Err(ferr(name, format!("unsupported dtype {other:?}"))),
        }
    }
}
