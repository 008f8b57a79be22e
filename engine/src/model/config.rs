//! `config.json` of a DeepSeek-V4 checkpoint (spec §1): parsed, validated, and turned into
//! the derived per-layer facts the model needs.

use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// A config that cannot be used, naming the offending field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read config: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: malformed JSON: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("{path}: field `{field}`: {reason}")]
    Field {
        path: String,
        field: String,
        reason: String,
    },
}

/// How the non-expert linear weights are stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearFormat {
    /// Plain BF16 `[out, in]`, no scale tensor.
    Bf16,
    /// FP8 e4m3 with UE8M0 block scales of `block x block`.
    Fp8 { block: usize },
}

/// How the routed experts are stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertFormat {
    Bf16,
    /// FP4 e2m1 packed two per byte (I8 container), UE8M0 scale per 32 inputs.
    Fp4,
    /// FP8 e4m3 with 128x128 UE8M0 block scales (the official lossless conversion).
    Fp8,
}

/// YaRN settings of `rope_scaling` (applied only on compressed layers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

/// The validated model configuration. Field names follow the HF `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_nextn_predict_layers: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub sliding_window: usize,
    /// One entry per main layer plus one per MTP block.
    pub compress_ratios: Vec<usize>,
    pub compress_rope_theta: f64,
    pub rope_theta: f64,
    pub yarn: Option<Yarn>,
    pub max_position_embeddings: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub num_hash_layers: usize,
    pub routed_scaling_factor: f32,
    pub swiglu_limit: f32,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub rms_norm_eps: f32,
    pub bos_token_id: u32,
    pub eos_token_id: u32,
    pub linear_format: LinearFormat,
    pub expert_format: ExpertFormat,
}

/// The three attention kinds of spec §2.7, by compress ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Ratio 0: sliding window only.
    Window,
    /// Ratio 4: overlapping compressor plus lightning indexer.
    Csa { ratio: usize },
    /// Any other ratio: non-overlapping compressor, all visible entries attended.
    Hca { ratio: usize },
}

impl AttentionKind {
    pub fn ratio(self) -> usize {
        match self {
            AttentionKind::Window => 0,
            AttentionKind::Csa { ratio } | AttentionKind::Hca { ratio } => ratio,
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawRopeScaling {
    #[serde(rename = "type", alias = "rope_type")]
    kind: Option<String>,
    factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
}

struct FieldReader<'a> {
    path: &'a str,
    obj: &'a serde_json::Map<String, Value>,
}

impl FieldReader<'_> {
    fn err(&self, field: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Field {
            path: self.path.to_string(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    fn get(&self, field: &str) -> Result<&Value, ConfigError> {
        self.obj
            .get(field)
            .ok_or_else(|| self.err(field, "missing required key"))
    }

    fn usize(&self, field: &str) -> Result<usize, ConfigError> {
        self.get(field)?
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| self.err(field, "expected a non-negative integer"))
    }

    fn usize_or(&self, field: &str, default: usize) -> Result<usize, ConfigError> {
        if self.obj.contains_key(field) {
            self.usize(field)
        } else {
            Ok(default)
        }
    }

    fn f64(&self, field: &str) -> Result<f64, ConfigError> {
        self.get(field)?
            .as_f64()
            .ok_or_else(|| self.err(field, "expected a number"))
    }

    fn f64_or(&self, field: &str, default: f64) -> Result<f64, ConfigError> {
        if self.obj.contains_key(field) {
            self.f64(field)
        } else {
            Ok(default)
        }
    }

    fn str_or<'b>(&'b self, field: &str, default: &'b str) -> Result<&'b str, ConfigError> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.err(field, "expected a string")),
        }
    }
}

impl ModelConfig {
    /// Reads and validates `config.json` from a file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: shown.clone(),
            source,
        })?;
        Self::from_json_str(&text, &shown)
    }

    /// Parses and validates config text; `path` is only used in error messages.
    pub fn from_json_str(text: &str, path: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|source| ConfigError::Json {
            path: path.to_string(),
            source,
        })?;
        let obj = value.as_object().ok_or_else(|| ConfigError::Field {
            path: path.to_string(),
            field: "<root>".into(),
            reason: "expected a JSON object".into(),
        })?;
        let r = FieldReader { path, obj };
        let cfg = Self::read_fields(&r)?;
        cfg.validate(&r)?;
        Ok(cfg)
    }

    fn read_fields(r: &FieldReader<'_>) -> Result<Self, ConfigError> {
        let model_type = r.str_or("model_type", "")?;
        if model_type != "deepseek_v4" {
            return Err(r.err(
                "model_type",
                format!("expected \"deepseek_v4\", found {model_type:?}"),
            ));
        }
        let compress_ratios = Self::read_ratios(r)?;
        Ok(ModelConfig {
            vocab_size: r.usize("vocab_size")?,
            hidden_size: r.usize("hidden_size")?,
            num_hidden_layers: r.usize("num_hidden_layers")?,
            num_nextn_predict_layers: r.usize_or("num_nextn_predict_layers", 0)?,
            num_attention_heads: r.usize("num_attention_heads")?,
            head_dim: r.usize("head_dim")?,
            qk_rope_head_dim: r.usize("qk_rope_head_dim")?,
            q_lora_rank: r.usize("q_lora_rank")?,
            o_groups: r.usize("o_groups")?,
            o_lora_rank: r.usize("o_lora_rank")?,
            sliding_window: r.usize("sliding_window")?,
            compress_ratios,
            compress_rope_theta: r.f64("compress_rope_theta")?,
            rope_theta: r.f64("rope_theta")?,
            yarn: Self::read_yarn(r)?,
            max_position_embeddings: r.usize("max_position_embeddings")?,
            index_n_heads: r.usize("index_n_heads")?,
            index_head_dim: r.usize("index_head_dim")?,
            index_topk: r.usize("index_topk")?,
            n_routed_experts: r.usize("n_routed_experts")?,
            n_shared_experts: r.usize_or("n_shared_experts", 1)?,
            num_experts_per_tok: r.usize("num_experts_per_tok")?,
            moe_intermediate_size: r.usize("moe_intermediate_size")?,
            num_hash_layers: r.usize_or("num_hash_layers", 0)?,
            routed_scaling_factor: r.f64("routed_scaling_factor")? as f32,
            swiglu_limit: r.f64_or("swiglu_limit", 0.0)? as f32,
            hc_mult: r.usize("hc_mult")?,
            hc_sinkhorn_iters: r.usize("hc_sinkhorn_iters")?,
            hc_eps: r.f64("hc_eps")? as f32,
            rms_norm_eps: r.f64("rms_norm_eps")? as f32,
            bos_token_id: r.usize_or("bos_token_id", 0)? as u32,
            eos_token_id: r.usize_or("eos_token_id", 1)? as u32,
            linear_format: Self::read_linear_format(r)?,
            expert_format: Self::read_expert_format(r)?,
        })
    }

    fn read_ratios(r: &FieldReader<'_>) -> Result<Vec<usize>, ConfigError> {
        let arr = r
            .get("compress_ratios")?
            .as_array()
            .ok_or_else(|| r.err("compress_ratios", "expected an array of integers"))?;
        arr.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64().map(|x| x as usize).ok_or_else(|| {
                    r.err(
                        "compress_ratios",
                        format!("entry {i} is not a non-negative integer"),
                    )
                })
            })
            .collect()
    }

    fn read_yarn(r: &FieldReader<'_>) -> Result<Option<Yarn>, ConfigError> {
        let Some(raw) = r.obj.get("rope_scaling") else {
            return Ok(None);
        };
        if raw.is_null() {
            return Ok(None);
        }
        let s: RawRopeScaling = serde_json::from_value(raw.clone())
            .map_err(|e| r.err("rope_scaling", format!("malformed: {e}")))?;
        match s.kind.as_deref() {
            Some("yarn") => {}
            other => {
                return Err(r.err(
                    "rope_scaling.type",
                    format!("only \"yarn\" is supported, found {other:?}"),
                ))
            }
        }
        let need = |v: Option<f64>, name: &str| {
            v.ok_or_else(|| r.err(&format!("rope_scaling.{name}"), "missing required key"))
        };
        Ok(Some(Yarn {
            factor: need(s.factor, "factor")?,
            original_max_position: s
                .original_max_position_embeddings
                .ok_or_else(|| {
                    r.err(
                        "rope_scaling.original_max_position_embeddings",
                        "missing required key",
                    )
                })?,
            beta_fast: need(s.beta_fast, "beta_fast")?,
            beta_slow: need(s.beta_slow, "beta_slow")?,
        }))
    }

    fn read_linear_format(r: &FieldReader<'_>) -> Result<LinearFormat, ConfigError> {
        let Some(q) = r.obj.get("quantization_config") else {
            return Ok(LinearFormat::Bf16);
        };
        let field = "quantization_config";
        let q = q
            .as_object()
            .ok_or_else(|| r.err(field, "expected an object"))?;
        let get_str = |k: &str| q.get(k).and_then(Value::as_str);
        if get_str("quant_method") != Some("fp8") {
            return Err(r.err(
                "quantization_config.quant_method",
                format!("only \"fp8\" is supported, found {:?}", q.get("quant_method")),
            ));
        }
        if let Some(fmt) = get_str("fmt") {
            if fmt != "e4m3" {
                return Err(r.err(
                    "quantization_config.fmt",
                    format!("only \"e4m3\" is supported, found {fmt:?}"),
                ));
            }
        }
        if let Some(sf) = get_str("scale_fmt") {
            if sf != "ue8m0" {
                return Err(r.err(
                    "quantization_config.scale_fmt",
                    format!("only \"ue8m0\" is supported, found {sf:?}"),
                ));
            }
        }
        let block = q
            .get("weight_block_size")
            .and_then(Value::as_array)
            .ok_or_else(|| r.err("quantization_config.weight_block_size", "missing or not an array"))?;
        let dims: Vec<u64> = block.iter().filter_map(Value::as_u64).collect();
        match dims.as_slice() {
            [a, b] if a == b && *a > 0 => Ok(LinearFormat::Fp8 { block: *a as usize }),
            _ => Err(r.err(
                "quantization_config.weight_block_size",
                format!("expected two equal positive integers, found {block:?}"),
            )),
        }
    }

    fn read_expert_format(r: &FieldReader<'_>) -> Result<ExpertFormat, ConfigError> {
        match r.obj.get("expert_dtype").and_then(Value::as_str) {
            None => Ok(if r.obj.contains_key("quantization_config") {
                ExpertFormat::Fp8
            } else {
                ExpertFormat::Bf16
            }),
            Some("fp4") => Ok(ExpertFormat::Fp4),
            Some("fp8") => Ok(ExpertFormat::Fp8),
            Some("bf16") => Ok(ExpertFormat::Bf16),
            Some(other) => Err(r.err(
                "expert_dtype",
                format!("expected \"fp4\", \"fp8\" or \"bf16\", found {other:?}"),
            )),
        }
    }
}

impl super::config_check::FieldErr for FieldReader<'_> {
    fn field_err(&self, field: &str, reason: &str) -> ConfigError {
        self.err(field, reason)
    }
}
