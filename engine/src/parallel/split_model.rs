//! The split CPU model: R simulated ranks run the reference building blocks on their shares,
//! joined by a [`Collective`]. Logits equal the unsplit [`crate::reference::Model`] up to f32
//! reassociation (tensor mode) or exactly (layer mode).

use super::collective::{Collective, CollectiveError, InProcessSum};
use super::load::LoadError;
use super::plan::{PlanError, SplitMode, SplitPlan};
use super::rank::{HeadSide, MtpHead, RankModel};
use super::state::SplitState;
use super::tp::RankLayer;
use crate::api::Numerics;
use crate::model::checkpoint::CheckpointError;
use crate::model::ModelConfig;
use crate::reference::attention::Segment;
use crate::reference::mhc::hc_head;
use crate::reference::ops::rmsnorm_rows;
use crate::reference::rope::Rope;
use crate::reference::state::LayerState;
use crate::reference::weights::HcParams;
use crate::reference::{ForwardOptions, ItemOutput, SeqState};

#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    #[error("shares of {got} ranks for a plan of {plan} ranks")]
    SharesMismatch { got: usize, plan: usize },
    #[error("no rank holds {0}")]
    NothingHolds(&'static str),
    #[error("MTP needs the final streams of {rows} rows, got {got} values")]
    MtpStreams { rows: usize, got: usize },
    #[error("the collective has {collective} ranks but the plan {plan}")]
    WorldMismatch { collective: usize, plan: usize },
}

/// Embedding and head side. Replicated on every rank in tensor mode, on the first / last
/// rank in layer mode; the simulation keeps a single copy.
pub struct Globals {
    pub embed: Vec<f32>,
    pub head: HeadSide,
    pub mtp: Option<MtpHead>,
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

/// One sequence's part of a forward call.
pub struct SplitItem<'a> {
    pub state: &'a mut SplitState,
    pub tokens: &'a [u32],
}

impl<C: Collective<Buf = [f32]>> SplitModel<C> {
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
        let streams = self.forward_streams(batch)?;
        Ok(self.logits(batch, &streams, opts))
    }

    /// Like [`SplitModel::forward`] but returns the final residual streams `[T, n, D]` of all
    /// fed rows (the input of the HC head and of MTP).
    pub fn forward_streams(&self, batch: &mut [SplitItem<'_>]) -> Result<Vec<f32>, SplitError> {
        let tokens: Vec<u32> = batch
            .iter()
            .flat_map(|b| b.tokens.iter().copied())
            .collect();
        let segs = segments(batch);
        let mut streams = self.embed(&tokens);
        match self.plan.mode {
            SplitMode::Tensor => {
                for layer in 0..self.cfg.num_hidden_layers {
                    let mut ranks = self.tensor_layer(batch, layer);
                    let rope = &self.ropes[layer];
                    super::tp::block(self, rope, &mut ranks, &mut streams, &tokens, &segs)?;
                }
            }
            SplitMode::Layer => super::pipeline::run(self, &mut streams, &tokens, &segs, batch)?,
        }
        for b in batch.iter_mut() {
            b.state.pos += b.tokens.len();
            b.state
                .ranks
                .iter_mut()
                .for_each(|r| r.pos += b.tokens.len());
        }
        Ok(streams)
    }

    /// Every rank's share of main layer `layer` with the batch's states of it.
    fn tensor_layer<'a>(
        &'a self,
        batch: &'a mut [SplitItem<'_>],
        layer: usize,
    ) -> Vec<RankLayer<'a>> {
        let mut states = states_by_rank(batch, layer, self.ranks.len());
        self.ranks
            .iter()
            .zip(&self.plan.ranks)
            .zip(states.iter_mut())
            .map(|((rank, rp), st)| RankLayer {
                cfg: &rank.attn_cfg,
                block: &rank.blocks[layer],
                out: &rank.out[layer],
                owned: rp.owned_groups.clone(),
                states: std::mem::take(st),
            })
            .collect()
    }

    /// The `n` residual streams of every token, all equal to its embedding.
    pub(super) fn embed(&self, tokens: &[u32]) -> Vec<f32> {
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
                let h = &self.globals.head;
                ItemOutput {
                    logits: self.vocab(&streams[first * width..end * width], &h.hc_head, &h.norm),
                }
            })
            .collect()
    }

    /// Logits `[rows, vocab]` of streams `[rows, n, D]` through an HC head and a norm.
    pub(super) fn vocab(&self, streams: &[f32], hc: &HcParams, norm: &[f32]) -> Vec<f32> {
        let cfg = &self.cfg;
        let mut y = hc_head(
            hc,
            streams,
            cfg.hc_mult,
            cfg.hidden_size,
            cfg.rms_norm_eps,
            cfg.hc_eps,
        );
        rmsnorm_rows(&mut y, norm, cfg.rms_norm_eps);
        self.globals.head.head.forward(&y, Numerics::Reference)
    }
}

/// The rows and start position of each item within the concatenated batch.
fn segments(batch: &[SplitItem<'_>]) -> Vec<Segment> {
    Segment::consecutive(batch.iter().map(|b| (b.tokens.len(), b.state.pos)))
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

/// Every item's state of local layer `layer`, grouped by rank: `[rank][item]`.
pub(super) fn states_by_rank<'a>(
    batch: &'a mut [SplitItem<'_>],
    layer: usize,
    world: usize,
) -> Vec<Vec<&'a mut LayerState>> {
    let mut out: Vec<Vec<&mut LayerState>> = (0..world).map(|_| Vec::new()).collect();
    for b in batch.iter_mut() {
        for (r, s) in b.state.ranks.iter_mut().enumerate() {
            if let Some(l) = s.layers.get_mut(layer) {
                out[r].push(l);
            }
        }
    }
    out
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
