//! [`SynthSpec`]: the dimensions of a synthetic model and its `config.json`.

use super::SynthError;
use crate::model::config::{ExpertFormat, LinearFormat, ModelConfig};
use serde_json::{json, Value};

/// Dimensions, formats, seed and sharding of a synthetic checkpoint. Field names follow
/// the HF `config.json`; `compress_ratios` includes the MTP entry.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    /// 0 or 1 MTP blocks.
    pub num_nextn_predict_layers: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub sliding_window: usize,
    pub compress_ratios: Vec<usize>,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub num_hash_layers: usize,
    pub routed_scaling_factor: f32,
    pub swiglu_limit: f32,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub max_position_embeddings: usize,
    /// FP8 (128x128 UE8M0) linear weights and FP4 routed experts, as published.
    pub quantized: bool,
    /// With `quantized`: routed experts as FP8 128x128 (`expert_dtype: "fp8"`) instead of FP4.
    pub fp8_experts: bool,
    pub seed: u64,
    /// Number of safetensors shards (>= 1).
    pub shards: usize,
}

impl SynthSpec {
    /// The tiny config of spec §7 (vocab 1024, hidden 256, 5 layers + MTP, ratios
    /// [0, 0, 4, 128, 4, 0], 8 experts top-2), BF16, 2 shards, seed 0.
    pub fn tiny_default() -> Self {
        SynthSpec {
            vocab_size: 1024,
            hidden_size: 256,
            num_hidden_layers: 5,
            num_nextn_predict_layers: 1,
            num_attention_heads: 4,
            head_dim: 128,
            qk_rope_head_dim: 64,
            q_lora_rank: 128,
            o_groups: 2,
            o_lora_rank: 128,
            sliding_window: 16,
            compress_ratios: vec![0, 0, 4, 128, 4, 0],
            index_n_heads: 4,
            index_head_dim: 128,
            index_topk: 8,
            n_routed_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 128,
            num_hash_layers: 3,
            routed_scaling_factor: 1.5,
            swiglu_limit: 10.0,
            hc_mult: 4,
            hc_sinkhorn_iters: 20,
            max_position_embeddings: 1_048_576,
            quantized: false,
            fp8_experts: false,
            seed: 0,
            shards: 2,
        }
    }

    /// The same spec with another vocabulary size (e.g. 129280 for the real tokenizer).
    pub fn with_vocab(mut self, vocab_size: usize) -> Self {
        self.vocab_size = vocab_size;
        self
    }

    /// The same spec, FP8 + FP4 (`true`) or BF16 (`false`).
    pub fn with_quantized(mut self, quantized: bool) -> Self {
        self.quantized = quantized;
        self
    }

    /// The spec that reproduces `cfg`'s shapes and formats (rope/eps settings are the
    /// writer's fixed published values). Fails for format mixes the writer cannot express.
    pub fn from_config(cfg: &ModelConfig, seed: u64, shards: usize) -> Result<Self, SynthError> {
        let (quantized, fp8_experts) = match (cfg.linear_format, cfg.expert_format) {
            (LinearFormat::Bf16, ExpertFormat::Bf16) => (false, false),
            (LinearFormat::Fp8 { block: 128 }, ExpertFormat::Fp4) => (true, false),
            (LinearFormat::Fp8 { block: 128 }, ExpertFormat::Fp8) => (true, true),
            (l, e) => {
                return Err(SynthError::Spec(format!(
                    "format mix {l:?} linear + {e:?} experts is not supported"
                )))
            }
        };
        Ok(SynthSpec {
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            num_hidden_layers: cfg.num_hidden_layers,
            num_nextn_predict_layers: cfg.num_nextn_predict_layers,
            num_attention_heads: cfg.num_attention_heads,
            head_dim: cfg.head_dim,
            qk_rope_head_dim: cfg.qk_rope_head_dim,
            q_lora_rank: cfg.q_lora_rank,
            o_groups: cfg.o_groups,
            o_lora_rank: cfg.o_lora_rank,
            sliding_window: cfg.sliding_window,
            compress_ratios: cfg.compress_ratios.clone(),
            index_n_heads: cfg.index_n_heads,
            index_head_dim: cfg.index_head_dim,
            index_topk: cfg.index_topk,
            n_routed_experts: cfg.n_routed_experts,
            num_experts_per_tok: cfg.num_experts_per_tok,
            moe_intermediate_size: cfg.moe_intermediate_size,
            num_hash_layers: cfg.num_hash_layers,
            routed_scaling_factor: cfg.routed_scaling_factor,
            swiglu_limit: cfg.swiglu_limit,
            hc_mult: cfg.hc_mult,
            hc_sinkhorn_iters: cfg.hc_sinkhorn_iters,
            max_position_embeddings: cfg.max_position_embeddings,
            quantized,
            fp8_experts,
            seed,
            shards,
        })
    }

    /// The HF-schema `config.json` of this model (published key names and fixed values for
    /// rope / YaRN / epsilons / token ids).
    pub fn config_json(&self) -> Value {
        // Two halves: one json! literal this long exceeds the macro recursion limit.
        let mut v = json!({
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": 1,
            "head_dim": self.head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "q_lora_rank": self.q_lora_rank,
            "o_groups": self.o_groups,
            "o_lora_rank": self.o_lora_rank,
            "sliding_window": self.sliding_window,
            "compress_ratios": self.compress_ratios,
            "compress_rope_theta": 160000,
            "rope_theta": 10000,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                             "beta_fast": 32, "beta_slow": 1},
        });
        let rest = json!({
            "max_position_embeddings": self.max_position_embeddings,
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": 1,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hash_layers": self.num_hash_layers,
            "scoring_func": "sqrtsoftplus",
            "topk_method": "noaux_tc",
            "norm_topk_prob": true,
            "routed_scaling_factor": self.routed_scaling_factor,
            "swiglu_limit": self.swiglu_limit,
            "hc_mult": self.hc_mult,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "hc_eps": 1e-6,
            "rms_norm_eps": 1e-6,
            "initializer_range": 0.02,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "use_cache": true,
        });
        if let (Some(obj), Value::Object(more)) = (v.as_object_mut(), rest) {
            obj.extend(more);
        }
        if self.quantized {
            if let Some(obj) = v.as_object_mut() {
                obj.insert(
                    "quantization_config".into(),
                    json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                           "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}),
                );
                let experts = if self.fp8_experts { "fp8" } else { "fp4" };
                obj.insert("expert_dtype".into(), json!(experts));
            }
        }
        v
    }

    /// The validated config this spec describes (the same checks `Checkpoint::open` applies).
    pub fn model_config(&self) -> Result<ModelConfig, SynthError> {
        Ok(ModelConfig::from_json_str(
            &self.config_json().to_string(),
            "<synthetic config.json>",
        )?)
    }
}
