//! Validation of [`ModelConfig`] (the field constraints of spec §7) and derived per-layer facts.

use super::config::{AttentionKind, ConfigError, ExpertFormat, LinearFormat, ModelConfig};

/// The overlapping compressor and the lightning indexer exist exactly for this ratio.
pub const CSA_RATIO: usize = 4;

impl ModelConfig {
    pub(super) fn validate(&self, r: &impl FieldErr) -> Result<(), ConfigError> {
        self.check_positive(r)?;
        self.check_attention(r)?;
        self.check_ratios(r)?;
        self.check_moe(r)?;
        self.check_quant(r)
    }

    fn check_positive(&self, r: &impl FieldErr) -> Result<(), ConfigError> {
        let fields = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("head_dim", self.head_dim),
            ("q_lora_rank", self.q_lora_rank),
            ("o_groups", self.o_groups),
            ("o_lora_rank", self.o_lora_rank),
            ("sliding_window", self.sliding_window),
            ("n_routed_experts", self.n_routed_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("hc_mult", self.hc_mult),
            ("hc_sinkhorn_iters", self.hc_sinkhorn_iters),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in fields {
            if v == 0 {
                return Err(r.field_err(name, "must be positive"));
            }
        }
        Ok(())
    }

    fn check_attention(&self, r: &impl FieldErr) -> Result<(), ConfigError> {
        if self.num_attention_heads % self.o_groups != 0 {
            return Err(r.field_err(
                "o_groups",
                &format!(
                    "num_attention_heads ({}) is not divisible by o_groups ({})",
                    self.num_attention_heads, self.o_groups
                ),
            ));
        }
        let rope = self.qk_rope_head_dim;
        if rope == 0 || rope % 2 != 0 || rope > self.head_dim {
            return Err(r.field_err(
                "qk_rope_head_dim",
                &format!("must be even, positive and <= head_dim ({})", self.head_dim),
            ));
        }
        if self.has_indexer() && (rope > self.index_head_dim || !self.index_head_dim.is_power_of_two())
        {
            return Err(r.field_err(
                "index_head_dim",
                &format!(
                    "must be a power of two >= qk_rope_head_dim ({rope}), found {}",
                    self.index_head_dim
                ),
            ));
        }
        if self.has_indexer() && (self.index_n_heads == 0 || self.index_topk == 0) {
            return Err(r.field_err("index_n_heads", "indexer heads and index_topk must be positive"));
        }
        Ok(())
    }

    fn check_ratios(&self, r: &impl FieldErr) -> Result<(), ConfigError> {
        let want = self.num_hidden_layers + self.num_nextn_predict_layers;
        if self.compress_ratios.len() != want {
            return Err(r.field_err(
                "compress_ratios",
                &format!(
                    "has {} entries, expected num_hidden_layers + num_nextn_predict_layers = {want}",
                    self.compress_ratios.len()
                ),
            ));
        }
        if let Some((i, &bad)) = self
            .compress_ratios
            .iter()
            .enumerate()
            .find(|(_, &m)| m == 1 || (m != 0 && m != CSA_RATIO && !m.is_power_of_two()))
        {
            return Err(r.field_err(
                "compress_ratios",
                &format!("entry {i} = {bad} is unsupported (use 0, 4 or a power of two >= 2)"),
            ));
        }
        if self.num_nextn_predict_layers > 1 {
            return Err(r.field_err("num_nextn_predict_layers", "at most one MTP block is supported"));
        }
        Ok(())
    }

    fn check_moe(&self, r: &impl FieldErr) -> Result<(), ConfigError> {
        if self.num_experts_per_tok > self.n_routed_experts {
            return Err(r.field_err(
                "num_experts_per_tok",
                &format!("exceeds n_routed_experts ({})", self.n_routed_experts),
            ));
        }
        if self.n_shared_experts != 1 {
            return Err(r.field_err("n_shared_experts", "exactly one shared expert is supported"));
        }
        if self.num_hash_layers > self.num_hidden_layers {
            return Err(r.field_err("num_hash_layers", "exceeds num_hidden_layers"));
        }
        if self.hc_eps < 0.0 || self.rms_norm_eps < 0.0 {
            return Err(r.field_err("rms_norm_eps", "epsilons must be non-negative"));
        }
        Ok(())
    }

    fn check_quant(&self, r: &impl FieldErr) -> Result<(), ConfigError> {
        if let LinearFormat::Fp8 { block } = self.linear_format {
            if block != 128 {
                return Err(r.field_err(
                    "quantization_config.weight_block_size",
                    &format!("only 128x128 blocks are supported, found {block}"),
                ));
            }
        }
        if self.expert_format == ExpertFormat::Fp4
            && (self.hidden_size % 32 != 0 || self.moe_intermediate_size % 32 != 0)
        {
            return Err(r.field_err(
                "expert_dtype",
                "fp4 experts need hidden_size and moe_intermediate_size divisible by 32",
            ));
        }
        Ok(())
    }

    /// The attention kind of block `layer` (`num_hidden_layers` is the MTP block).
    pub fn attention_kind(&self, layer: usize) -> AttentionKind {
        match self.compress_ratios.get(layer).copied().unwrap_or(0) {
            0 => AttentionKind::Window,
            CSA_RATIO => AttentionKind::Csa { ratio: CSA_RATIO },
            m => AttentionKind::Hca { ratio: m },
        }
    }

    /// Hash-routed layers route by `tid2eid[token]`; the MTP block never is.
    pub fn is_hash_layer(&self, layer: usize) -> bool {
        layer < self.num_hash_layers && layer < self.num_hidden_layers
    }

    pub fn has_mtp(&self) -> bool {
        self.num_nextn_predict_layers > 0
    }

    /// Whether any block uses the lightning indexer.
    pub fn has_indexer(&self) -> bool {
        self.compress_ratios.contains(&CSA_RATIO)
    }

    /// mHC mixer width `(2 + n) * n`.
    pub fn hc_mix(&self) -> usize {
        (2 + self.hc_mult) * self.hc_mult
    }

    /// Weight-name prefix of block `layer` (`mtp.0.` for the MTP block).
    pub fn block_prefix(&self, layer: usize) -> String {
        if layer < self.num_hidden_layers {
            format!("layers.{layer}.")
        } else {
            format!("mtp.{}.", layer - self.num_hidden_layers)
        }
    }

    /// Number of blocks including MTP.
    pub fn num_blocks(&self) -> usize {
        self.num_hidden_layers + self.num_nextn_predict_layers
    }
}

/// Builds field errors; implemented by the JSON field reader.
pub(super) trait FieldErr {
    fn field_err(&self, field: &str, reason: &str) -> ConfigError;
}
