//! The whole CPU reference model (spec §2.1): embedding, blocks, HC head, final norm and head,
//! over a batch of sequences that each feed any number of new tokens (prefill, chunked
//! prefill and decode are the same call).

use super::attention::{BlockCtx, Segment};
use super::block::{self, record, Probe};
use super::mhc::hc_head;
use super::ops::rmsnorm_rows;
use super::rope::Rope;
use super::state::{LayerState, SeqState};
use super::weights::ModelWeights;
use crate::api::Numerics;
use crate::model::checkpoint::{Checkpoint, CheckpointError};
use crate::model::ModelConfig;
use std::path::Path;

/// The reference model: config, dequantised weights, rope tables and the numerics mode.
pub struct Model {
    pub cfg: ModelConfig,
    pub weights: ModelWeights,
    /// One table per block, MTP included.
    ropes: Vec<Rope>,
    pub numerics: Numerics,
}

/// One sequence's part of a forward call.
pub struct BatchItem<'a> {
    pub state: &'a mut SeqState,
    pub tokens: &'a [u32],
}

/// What a forward call returns for one sequence.
#[derive(Debug, Clone)]
pub struct ItemOutput {
    /// `[rows, vocab]`: the last token's logits, or every token's with `all_logits`.
    pub logits: Vec<f32>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ForwardOptions {
    /// Return logits for every fed token instead of only the last.
    pub all_logits: bool,
}

impl Model {
    pub fn load(dir: &Path, numerics: Numerics) -> Result<Self, CheckpointError> {
        let ck = Checkpoint::open(dir)?;
        Self::from_checkpoint(&ck, numerics)
    }

    pub fn from_checkpoint(ck: &Checkpoint, numerics: Numerics) -> Result<Self, CheckpointError> {
        let cfg = ck.config().clone();
        let weights = ModelWeights::load(ck)?;
        let ropes = (0..cfg.num_blocks())
            .map(|l| Rope::for_layer(&cfg, l))
            .collect();
        Ok(Model {
            cfg,
            weights,
            ropes,
            numerics,
        })
    }

    /// A fresh state for a new sequence (main blocks only).
    pub fn new_state(&self) -> SeqState {
        SeqState {
            pos: 0,
            layers: self
                .weights
                .blocks
                .iter()
                .map(|b| LayerState::new(&self.cfg, b))
                .collect(),
        }
    }

    pub(crate) fn block_ctx(&self, layer: usize) -> BlockCtx<'_> {
        BlockCtx {
            cfg: &self.cfg,
            rope: &self.ropes[layer],
            numerics: self.numerics,
        }
    }

    /// Feeds every item's tokens, updating its state; returns logits per item.
    pub fn forward(&self, batch: &mut [BatchItem<'_>], opts: ForwardOptions) -> Vec<ItemOutput> {
        let streams = self.forward_streams(batch, None);
        self.logits_from_streams(batch, &streams, opts)
    }

    /// Like [`Model::forward`] but returns the final residual streams `[T, n, D]` of all fed
    /// rows (the input of the HC head and of MTP), recording activations into `probe`.
    pub fn forward_streams(
        &self,
        batch: &mut [BatchItem<'_>],
        mut probe: Option<&mut dyn Probe>,
    ) -> Vec<f32> {
        let (d, n) = (self.cfg.hidden_size, self.cfg.hc_mult);
        let tokens: Vec<u32> = batch
            .iter()
            .flat_map(|b| b.tokens.iter().copied())
            .collect();
        let segs = segments(batch);
        let mut streams = Vec::with_capacity(tokens.len() * n * d);
        for &t in &tokens {
            let row = &self.weights.embed[t as usize * d..(t as usize + 1) * d];
            (0..n).for_each(|_| streams.extend_from_slice(row));
        }
        for (layer, w) in self.weights.blocks.iter().enumerate() {
            let mut states: Vec<&mut LayerState> = batch
                .iter_mut()
                .map(|b| &mut b.state.layers[layer])
                .collect();
            let ctx = self.block_ctx(layer);
            let p: Option<&mut dyn Probe> = match probe {
                Some(ref mut p) => Some(&mut **p),
                None => None,
            };
            block::forward(&ctx, w, layer, &mut streams, &tokens, &segs, &mut states, p);
        }
        for b in batch.iter_mut() {
            b.state.pos += b.tokens.len();
        }
        record(&mut probe, || "final_streams".into(), &streams);
        streams
    }

    /// Runs main block `layer` alone on `streams` `[T, n, D]` of positions `0..T` from a fresh
    /// state (teacher-forced per-layer checks against another implementation).
    pub fn run_block(&self, layer: usize, streams: &mut [f32], tokens: &[u32]) {
        let w = &self.weights.blocks[layer];
        let mut state = LayerState::new(&self.cfg, w);
        let segs = [Segment {
            rows: 0..tokens.len(),
            start_pos: 0,
        }];
        let ctx = self.block_ctx(layer);
        block::forward(
            &ctx,
            w,
            layer,
            streams,
            tokens,
            &segs,
            &mut [&mut state],
            None,
        );
    }

    /// HC head, final norm and head on the chosen rows of each item.
    fn logits_from_streams(
        &self,
        batch: &[BatchItem<'_>],
        streams: &[f32],
        opts: ForwardOptions,
    ) -> Vec<ItemOutput> {
        let width = self.cfg.hc_mult * self.cfg.hidden_size;
        let mut start = 0;
        batch
            .iter()
            .map(|b| {
                let rows = b.tokens.len();
                let first = if opts.all_logits {
                    start
                } else {
                    start + rows.saturating_sub(1)
                };
                let end = start + rows;
                start = end;
                ItemOutput {
                    logits: self.head_logits(&streams[first * width..end * width]),
                }
            })
            .collect()
    }

    /// Logits `[rows, vocab]` of final streams `[rows, n, D]` through the model's HC head.
    pub fn head_logits(&self, streams: &[f32]) -> Vec<f32> {
        let w = &self.weights;
        self.project_vocab(streams, &w.hc_head, &w.norm)
    }

    pub(crate) fn project_vocab(
        &self,
        streams: &[f32],
        hc: &super::weights::HcParams,
        norm: &[f32],
    ) -> Vec<f32> {
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
        self.weights.head.forward(&y, Numerics::Reference)
    }
}

/// The rows and start position of each item within the concatenated batch.
fn segments(batch: &[BatchItem<'_>]) -> Vec<Segment> {
    Segment::consecutive(batch.iter().map(|b| (b.tokens.len(), b.state.pos)))
}
