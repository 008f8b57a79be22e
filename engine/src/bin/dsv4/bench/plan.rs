//! The full-size DeepSeek-V4-Flash config (spec 1.1) and how many routed-expert banks fit the GPU.

use dsv4_engine::gpu::attention::{AttnLayer, AttnState};
use dsv4_engine::gpu::ExpertBank;
use dsv4_engine::model::ModelConfig;
use dsv4_kernels::GpuContext;

/// The published `config.json` values (spec 1.1): 43 layers + MTP, FP8 linears, FP4 experts.
const FLASH_CONFIG: &str = include_str!("flash_config.json");

pub fn flash_config() -> anyhow::Result<ModelConfig> {
    Ok(ModelConfig::from_json_str(
        FLASH_CONFIG,
        "<built-in DeepSeek-V4-Flash config>",
    )?)
}

/// Device bytes the bench needs besides the expert banks, and the banks that fit in the rest.
pub struct MemoryPlan {
    pub free: usize,
    pub other: usize,
    pub bank_bytes: usize,
    pub banks: usize,
}

/// Measures one attention layer and one layer's state (per kind, averaged over the model by
/// counting kinds) and sizes the banks; 6 GiB stay free for workspace, graphs and the copy test, besides
/// `extra` bytes (the batched-prefill workspace).
pub fn memory_plan(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    slots: usize,
    context: usize,
    extra: usize,
) -> anyhow::Result<MemoryPlan> {
    let layers = cfg.num_hidden_layers;
    let mut attn = 0usize;
    // Layers 1 (window), 2 (CSA), 3 (HCA) stand for their kinds.
    for l in 0..layers {
        let probe = match cfg.attention_kind(l).ratio() {
            0 => 1,
            4 => 2,
            _ => 3,
        };
        if l == probe {
            let w = AttnLayer::synthetic(ctx, cfg, l, 1)?.weight_bytes() as usize;
            let s = AttnState::new(ctx, cfg, l, slots, context)?.bytes() as usize;
            let same = (0..layers)
                .filter(|&m| kind(cfg, m) == kind(cfg, l))
                .count();
            attn += (w + s) * same;
        }
    }
    let (d, v, i) = (cfg.hidden_size, cfg.vocab_size, cfg.moe_intermediate_size);
    let dense =
        layers * (2 * 24 * 4 * d * 4 + cfg.n_routed_experts * d * 2 + 3 * (d * i + d * i / 16384));
    let other = 2 * v * d * 2 + dense + attn + extra + (6 << 30);
    let (free, _) = ctx.ctx.mem_get_info()?;
    let bank_bytes = ExpertBank::bytes_for(cfg);
    let banks = (free.saturating_sub(other) / bank_bytes).clamp(1, layers);
    Ok(MemoryPlan {
        free,
        other,
        bank_bytes,
        banks,
    })
}

fn kind(cfg: &ModelConfig, l: usize) -> usize {
    cfg.attention_kind(l).ratio()
}

/// Bytes of attention cache one row reads per step at `context` tokens (spec 2.4-2.7, bf16 caches):
/// the window, CSA indexer keys (all scored) and selected entries, HCA entries.
pub fn cache_bytes_per_row(cfg: &ModelConfig, context: usize) -> usize {
    let (hd, ihd) = (cfg.head_dim, cfg.index_head_dim);
    (0..cfg.num_hidden_layers)
        .map(|l| {
            let window = cfg.sliding_window.min(context) * hd * 2;
            window
                + match cfg.attention_kind(l).ratio() {
                    0 => 0,
                    4 => (context / 4) * ihd * 2 + cfg.index_topk.min(context / 4) * hd * 2,
                    r => (context / r) * hd * 2,
                }
        })
        .sum()
}
