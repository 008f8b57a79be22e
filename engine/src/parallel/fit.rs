//! Will the plan fit the GPUs? Weights per rank plus the decode state (KV caches, compressor
//! states) for the chosen context and batch, in the official layout of spec §3 (BF16 caches,
//! F32 compressor state), so a loader can refuse before reading a byte.

use super::plan::{SplitMode, SplitPlan};
use crate::model::{AttentionKind, ModelConfig};
use std::fmt;

/// Bytes of one cached element (BF16) and one compressor-state element (F32).
const CACHE_ELEM: u64 = 2;
const STATE_ELEM: u64 = 4;

/// One GPU that is too small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub rank: usize,
    pub weights: u64,
    pub kv: u64,
    pub have: u64,
}

impl Shortfall {
    pub fn need(&self) -> u64 {
        self.weights + self.kv
    }
    pub fn missing(&self) -> u64 {
        self.need().saturating_sub(self.have)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitError {
    #[error("the plan has {plan} ranks but {gpus} GPU memory sizes were given")]
    GpuCount { plan: usize, gpus: usize },
    #[error("{}", too_small_message(*.context, *.batch, .short))]
    TooSmall {
        context: usize,
        batch: usize,
        short: Vec<Shortfall>,
    },
}

/// `12.3 GiB`
pub struct Gib(pub u64);

impl fmt::Display for Gib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.2} GiB", self.0 as f64 / (1u64 << 30) as f64)
    }
}

fn too_small_message(context: usize, batch: usize, short: &[Shortfall]) -> String {
    let each: Vec<String> = short
        .iter()
        .map(|s| {
            format!(
                "GPU {} needs {} (weights {} + KV cache {}) but has {}: {} missing",
                s.rank,
                Gib(s.need()),
                Gib(s.weights),
                Gib(s.kv),
                Gib(s.have),
                Gib(s.missing())
            )
        })
        .collect();
    format!(
        "the model does not fit for {context} tokens of context x batch {batch}: {}",
        each.join("; ")
    )
}

/// Checks every rank's weights plus `batch` sequences of `context_tokens` against its GPU.
pub fn check_fits(
    plan: &SplitPlan,
    gpu_mem_bytes: &[u64],
    context_tokens: usize,
    batch: usize,
) -> Result<(), FitError> {
    if gpu_mem_bytes.len() != plan.world() {
        return Err(FitError::GpuCount {
            plan: plan.world(),
            gpus: gpu_mem_bytes.len(),
        });
    }
    let short: Vec<Shortfall> = plan
        .ranks
        .iter()
        .zip(gpu_mem_bytes)
        .map(|(r, &have)| Shortfall {
            rank: r.rank,
            weights: r.weight_bytes,
            kv: rank_state_bytes(plan, r.rank, context_tokens) * batch as u64,
            have,
        })
        .filter(|s| s.need() > s.have)
        .collect();
    if short.is_empty() {
        Ok(())
    } else {
        Err(FitError::TooSmall {
            context: context_tokens,
            batch,
            short,
        })
    }
}

/// Decode-state bytes of one sequence on rank `r`. Tensor mode replicates the single shared
/// K=V head on every rank (each needs all keys for its heads); layer mode keeps each layer's
/// state on the rank that runs it.
pub fn rank_state_bytes(plan: &SplitPlan, r: usize, context: usize) -> u64 {
    let (cfg, rank) = (&plan.cfg, &plan.ranks[r]);
    let mut layers: Vec<usize> = match plan.mode {
        SplitMode::Tensor => (0..cfg.num_hidden_layers).collect(),
        SplitMode::Layer => rank.layers.clone().collect(),
    };
    if rank.mtp {
        layers.push(cfg.num_hidden_layers);
    }
    layers
        .into_iter()
        .map(|l| layer_state_bytes(cfg, l, context))
        .sum()
}

/// One block's window, compressed caches and compressor states for `context` tokens.
pub fn layer_state_bytes(cfg: &ModelConfig, layer: usize, context: usize) -> u64 {
    let (d, id) = (cfg.head_dim as u64, cfg.index_head_dim as u64);
    let n = context as u64;
    let window = cfg.sliding_window as u64 * d * CACHE_ELEM;
    // Compressor state: (kv, score) x rows x width; overlap keeps two windows of 2·dim.
    let state = |m: u64, dim: u64, overlap: bool| {
        let (rows, width) = if overlap { (2 * m, 2 * dim) } else { (m, dim) };
        2 * rows * width * STATE_ELEM
    };
    match cfg.attention_kind(layer) {
        AttentionKind::Window => window,
        AttentionKind::Hca { ratio } => {
            let m = ratio as u64;
            window + n / m * d * CACHE_ELEM + state(m, d, false)
        }
        AttentionKind::Csa { ratio } => {
            let m = ratio as u64;
            window + n / m * (d + id) * CACHE_ELEM + state(m, d, true) + state(m, id, true)
        }
    }
}
