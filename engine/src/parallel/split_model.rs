//! The split CPU model: R simulated ranks run the reference building blocks on their shares,
//! joined by a [`Collective`]. Logits equal the unsplit [`crate::reference::Model`] up to f32
//! reassociation (tensor mode) or exactly (layer mode).

use super::collective::{Collective, CollectiveError, InProcessSum};
use super::plan::{PlanError, SplitMode, SplitPlan};
use super::slice::{rank_attention_config, tensor_block, OutProjection};
use crate::api::Numerics;
use crate::model::checkpoint::{Checkpoint, CheckpointError};
use crate::model::ModelConfig;
use crate::reference::attention::Segment;
use crate::reference::mhc::hc_head;
use crate::reference::ops::rmsnorm_rows;
use crate::reference::rope::Rope;
use crate::reference::state::LayerState;
use crate::reference::weights::{BlockWeights, HcParams, Linear, ModelWeights};
use crate::reference::{ForwardOptions, ItemOutput, SeqSnapshot, SeqState};
use std::ops::Range;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    #[error("the plan was made for another model config than the weights'")]
    ConfigMismatch,
    #[error("the collective has {collective} ranks but the plan {plan}")]
    WorldMismatch { collective: usize, plan: usize },
}

/// One rank's weights.
pub struct RankModel {
    pub rank: usize,
    /// Main layers held (`blocks[i]` is layer `layers.start + i`).
    pub layers: Range<usize>,
    /// The config the reference attention sees on this rank (tensor mode: its heads).
    pub attn_cfg: ModelConfig,
    pub blocks: Vec<BlockWeights>,
    /// Tensor mode: the rank's output projection per layer (empty in layer mode).
    pub out: Vec<OutProjection>,
}

/// Embedding and head side. Replicated on every rank in tensor mode, on the first / last
/// rank in layer mode; the simulation keeps a single copy.
pub struct Globals {
    pub embed: Vec<f32>,
    pub head: Linear,
    pub norm: Vec<f32>,
    pub hc_head: HcParams,
}

pub struct SplitModel<C: Collective<Buf = [f32]> = InProcessSum> {
    pub plan: SplitPlan,
    pub cfg: ModelConfig,
    pub numerics: Numerics,
    pub ranks: Vec<RankModel>,
    pub globals: Globals,
    pub(super) ropes: Vec<Rope>,
    pub collective: C,
}

/// A sequence's decode state: one reference state per rank (its layers only).
#[derive(Debug, Clone)]
pub struct SplitState {
    pub pos: usize,
    pub ranks: Vec<SeqState>,
}

#[derive(Debug, Clone)]
pub struct SplitSnapshot {
    pub pos: usize,
    ranks: Vec<SeqSnapshot>,
}

impl SplitState {
    pub fn snapshot(&self) -> SplitSnapshot {
        SplitSnapshot {
            pos: self.pos,
            ranks: self.ranks.iter().map(SeqState::snapshot).collect(),
        }
    }

    pub fn restore(&mut self, s: &SplitSnapshot) {
        self.pos = s.pos;
        for (r, snap) in self.ranks.iter_mut().zip(&s.ranks) {
            r.restore(snap);
        }
    }

    /// Bytes of every rank's caches.
    pub fn rank_bytes(&self) -> Vec<usize> {
        self.ranks.iter().map(SeqState::bytes).collect()
    }
}

/// One sequence's part of a forward call.
pub struct SplitItem<'a> {
    pub state: &'a mut SplitState,
    pub tokens: &'a [u32],
}

impl SplitModel<InProcessSum> {
    /// Loads `dir` and splits it over `ranks` simulated ranks.
    pub fn load(
        dir: &Path,
        ranks: usize,
        mode: SplitMode,
        numerics: Numerics,
    ) -> Result<Self, SplitError> {
        let ck = Checkpoint::open(dir)?;
        let plan = SplitPlan::new(ck.config(), ranks, mode)?;
        let weights = ModelWeights::load(&ck)?;
        Self::from_weights(plan, weights, numerics, InProcessSum::new(ranks))
    }
}

impl<C: Collective<Buf = [f32]>> SplitModel<C> {
    /// Cuts the full weights into the plan's rank shares (consuming them).
    pub fn from_weights(
        plan: SplitPlan,
        weights: ModelWeights,
        numerics: Numerics,
        collective: C,
    ) -> Result<Self, SplitError> {
        if collective.world() != plan.world() {
            return Err(SplitError::WorldMismatch {
                collective: collective.world(),
                plan: plan.world(),
            });
        }
        if weights.blocks.len() != plan.cfg.num_hidden_layers {
            return Err(SplitError::ConfigMismatch);
        }
        let cfg = plan.cfg.clone();
        let ranks = plan
            .ranks
            .iter()
            .map(|rp| {
                let blocks = &weights.blocks[rp.layers.clone()];
                let (blocks, out) = match plan.mode {
                    SplitMode::Layers => (blocks.to_vec(), Vec::new()),
                    SplitMode::Tensor => blocks.iter().map(|b| tensor_block(&cfg, b, rp)).unzip(),
                };
                let attn_cfg = match plan.mode {
                    SplitMode::Layers => cfg.clone(),
                    SplitMode::Tensor => rank_attention_config(&cfg, rp),
                };
                RankModel {
                    rank: rp.rank,
                    layers: rp.layers.clone(),
                    attn_cfg,
                    blocks,
                    out,
                }
            })
            .collect();
        let ropes = (0..cfg.num_blocks())
            .map(|l| Rope::for_layer(&cfg, l))
            .collect();
        let globals = Globals {
            embed: weights.embed,
            head: weights.head,
            norm: weights.norm,
            hc_head: weights.hc_head,
        };
        Ok(SplitModel {
            plan,
            cfg,
            numerics,
            ranks,
            globals,
            ropes,
            collective,
        })
    }

    pub fn new_state(&self) -> SplitState {
        let ranks = self
            .ranks
            .iter()
            .map(|r| SeqState {
                pos: 0,
                layers: r
                    .blocks
                    .iter()
                    .map(|b| LayerState::new(&self.cfg, b))
                    .collect(),
            })
            .collect();
        SplitState { pos: 0, ranks }
    }

    /// Feeds every item's tokens (prefill, chunk or decode), updating its state.
    pub fn forward(
        &self,
        batch: &mut [SplitItem<'_>],
        opts: ForwardOptions,
    ) -> Result<Vec<ItemOutput>, SplitError> {
        let tokens: Vec<u32> = batch
            .iter()
            .flat_map(|b| b.tokens.iter().copied())
            .collect();
        let segs = segments(batch);
        let mut streams = self.embed(&tokens);
        match self.plan.mode {
            SplitMode::Tensor => {
                for layer in 0..self.cfg.num_hidden_layers {
                    super::tp::block(self, layer, &mut streams, &tokens, &segs, batch)?;
                }
            }
            SplitMode::Layers => super::pipeline::run(self, &mut streams, &tokens, &segs, batch)?,
        }
        for b in batch.iter_mut() {
            b.state.pos += b.tokens.len();
            b.state
                .ranks
                .iter_mut()
                .for_each(|r| r.pos += b.tokens.len());
        }
        Ok(self.logits(batch, &streams, opts))
    }

    /// The `n` residual streams of every token, all equal to its embedding.
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let (d, n) = (self.cfg.hidden_size, self.cfg.hc_mult);
        let mut streams = Vec::with_capacity(tokens.len() * n * d);
        for &t in tokens {
            let row = &self.globals.embed[t as usize * d..(t as usize + 1) * d];
            (0..n).for_each(|_| streams.extend_from_slice(row));
        }
        streams
    }

    /// HC head, final norm and vocabulary head on the last (or every) row of each item.
    fn logits(
        &self,
        batch: &[SplitItem<'_>],
        streams: &[f32],
        opts: ForwardOptions,
    ) -> Vec<ItemOutput> {
        let cfg = &self.cfg;
        let width = cfg.hc_mult * cfg.hidden_size;
        let mut start = 0;
        batch
            .iter()
            .map(|b| {
                let end = start + b.tokens.len();
                let first = if opts.all_logits {
                    start
                } else {
                    end.saturating_sub(1).max(start)
                };
                start = end;
                let g = &self.globals;
                let rows = &streams[first * width..end * width];
                let mut y = hc_head(
                    &g.hc_head,
                    rows,
                    cfg.hc_mult,
                    cfg.hidden_size,
                    cfg.rms_norm_eps,
                    cfg.hc_eps,
                );
                rmsnorm_rows(&mut y, &g.norm, cfg.rms_norm_eps);
                ItemOutput {
                    logits: g.head.forward(&y, Numerics::Reference),
                }
            })
            .collect()
    }
}

/// The rows and start position of each item within the concatenated batch.
fn segments(batch: &[SplitItem<'_>]) -> Vec<Segment> {
    let mut row = 0;
    batch
        .iter()
        .map(|b| {
            let seg = Segment {
                rows: row..row + b.tokens.len(),
                start_pos: b.state.pos,
            };
            row += b.tokens.len();
            seg
        })
        .collect()
}

/// Sums per-rank partial results through the collective; returns the sum.
pub(super) fn reduce<C: Collective<Buf = [f32]>>(
    c: &C,
    mut parts: Vec<Vec<f32>>,
) -> Result<Vec<f32>, CollectiveError> {
    let mut bufs: Vec<&mut [f32]> = parts.iter_mut().map(Vec::as_mut_slice).collect();
    c.all_reduce_sum(&mut bufs)?;
    Ok(parts.swap_remove(0))
}

/// Every item's state of `layer` on rank `rank` (layer index local to the rank).
pub(super) fn layer_states<'a>(
    batch: &'a mut [SplitItem<'_>],
    rank: usize,
    local_layer: usize,
) -> Vec<&'a mut LayerState> {
    batch
        .iter_mut()
        .map(|b| &mut b.state.ranks[rank].layers[local_layer])
        .collect()
}
