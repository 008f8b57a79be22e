//! [`GpuBackend`]: the CUDA runner behind the engine's [`Backend`] interface. Sequences map to
//! attention-state slots; steps of single tokens run as decode steps (graph replay), steps with a prefill
//! chunk run through the batched prefill (prefill_feed.rs: decode rows ride along as one-token chunks);
//! snapshots save every layer's slot state.

mod prefill_feed;

use super::attention::AttnSnapshot;
use super::graph::GraphSet;
use super::model::{GpuModel, StepInput};
use super::prefill::PrefillWs;
use super::sampling::DeviceSampler;
use super::weights::ModelWeightsDev;
use super::RunnerError;
use crate::api::{GpuStatus, Numerics};
use crate::backend::{check_tokens, Backend, BackendError, SeqId, SnapshotId, Work};
use crate::model::checkpoint::Checkpoint;
use crate::model::ModelConfig;
use crate::sampler::Draw;
use dsv4_kernels::GpuContext;
use std::collections::HashMap;
use std::path::Path;

/// Most rows one step runs (the kernels' batch limit).
pub const MAX_ROWS: usize = 64;
/// Most tokens of one batched-prefill call (its workspace is sized for this many rows).
pub const PREFILL_TOKENS: usize = 2048;

#[derive(Debug, Clone)]
pub struct GpuOptions {
    pub numerics: Numerics,
    /// Sequences held at once (state slots); also the most rows of a step (capped at 64).
    pub max_seqs: usize,
    pub max_context: usize,
    pub cuda_graphs: bool,
    pub graph_buckets: Vec<usize>,
}

struct Seq {
    slot: usize,
    pos: usize,
}

struct Snap {
    seq: SeqId,
    pos: usize,
    layers: Vec<AttnSnapshot>,
}

pub struct GpuBackend {
    model: GpuModel,
    graphs: GraphSet,
    sampler: DeviceSampler,
    seqs: HashMap<SeqId, Seq>,
    free_slots: Vec<usize>,
    snapshots: HashMap<SnapshotId, Snap>,
    next_id: u64,
    context_limit: usize,
    /// None when its workspace did not fit: prefill chunks then run as decode steps.
    prefill: Option<PrefillWs>,
}

/// The split plan's fit check for one GPU against its free memory (the message names what is
/// needed, what is free and what is missing).
fn check_fits_on_gpu(cfg: &ModelConfig, opts: &GpuOptions) -> Result<(), RunnerError> {
    use crate::parallel::{fit::check_fits, plan::SplitMode, plan::SplitPlan};
    let (free, _total) = dsv4_kernels::cudarc::driver::result::mem_get_info()?;
    let plan = SplitPlan::new(cfg, 1, SplitMode::Tensor)
        .map_err(|e| RunnerError::Unsupported(e.to_string()))?;
    let seqs = opts.max_seqs.clamp(1, MAX_ROWS);
    check_fits(&plan, &[free as u64], opts.max_context, seqs)
        .map_err(|e| RunnerError::DoesNotFit(e.to_string()))
}

fn dev(e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(e.to_string())
}

impl GpuBackend {
    /// Opens the checkpoint, uploads it to GPU 0 and captures the decode graphs.
    /// Refuses before uploading anything when the weights and the caches for `max_seqs`
    /// sequences of `max_context` tokens cannot fit in the GPU's free memory.
    pub fn load(dir: &Path, opts: &GpuOptions) -> Result<Self, RunnerError> {
        let ctx = GpuContext::new(0)?;
        let ck = Checkpoint::open(dir)?;
        check_fits_on_gpu(ck.config(), opts)?;
        let weights = ModelWeightsDev::from_checkpoint(&ctx, &ck)?;
        Self::new(ctx, ck.config().clone(), weights, opts)
    }

    pub fn new(
        ctx: GpuContext,
        cfg: ModelConfig,
        weights: ModelWeightsDev,
        opts: &GpuOptions,
    ) -> Result<Self, RunnerError> {
        let seqs = opts.max_seqs.clamp(1, MAX_ROWS);
        let limit = opts.max_context.min(cfg.max_position_embeddings);
        let mut model = GpuModel::new(ctx, cfg, weights, opts.numerics, seqs, seqs, limit)?;
        let graphs = if opts.cuda_graphs {
            GraphSet::capture(&mut model, &opts.graph_buckets)?
        } else {
            GraphSet::empty()
        };
        let sampler = DeviceSampler::new(&model.ctx, model.cfg.vocab_size, seqs)?;
        let prefill = super::prefill::supported(&model.ctx, &model.cfg)
            .then(|| PrefillWs::new(&model.ctx, &model.cfg, PREFILL_TOKENS, limit).ok())
            .flatten();
        Ok(GpuBackend {
            model,
            graphs,
            sampler,
            seqs: HashMap::new(),
            free_slots: (0..seqs).rev().collect(),
            snapshots: HashMap::new(),
            next_id: 1,
            context_limit: limit,
            prefill,
        })
    }

    pub fn model(&self) -> &GpuModel {
        &self.model
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn check_work(&self, work: &[Work<'_>]) -> Result<(), BackendError> {
        check_tokens(work, self.model.cfg.vocab_size)?;
        for w in work {
            let have = self.seq_len(w.seq)?;
            if have + w.tokens.len() > self.context_limit {
                return Err(BackendError::ContextFull {
                    have,
                    new: w.tokens.len(),
                    limit: self.context_limit,
                });
            }
        }
        Ok(())
    }

    /// Feeds every item's tokens: single tokens as decode steps, anything with a longer chunk through the
    /// batched prefill; after each item's last token records the token its draw picks (greedy without
    /// `draws`) and, with `logits`, its logits.
    fn feed(
        &mut self,
        work: &[Work<'_>],
        draws: Option<&[Draw]>,
        logits: bool,
    ) -> Result<Vec<(u32, Vec<f32>)>, BackendError> {
        self.check_work(work)?;
        if self.prefill.is_some() && work.iter().any(|w| w.tokens.len() > 1) {
            return self.feed_prefill(work, draws, logits);
        }
        self.feed_steps(work, draws, logits)
    }

    /// Feeds every item's tokens one token per item per step (decode steps, graph replay).
    fn feed_steps(
        &mut self,
        work: &[Work<'_>],
        draws: Option<&[Draw]>,
        logits: bool,
    ) -> Result<Vec<(u32, Vec<f32>)>, BackendError> {
        let mut out = vec![(0u32, Vec::new()); work.len()];
        let steps = work.iter().map(|w| w.tokens.len()).max().unwrap_or(0);
        let (mut toks, mut slots, mut poss, mut items) = (vec![], vec![], vec![], vec![]);
        let mut row_draws = Vec::new();
        for t in 0..steps {
            toks.clear();
            slots.clear();
            poss.clear();
            items.clear();
            row_draws.clear();
            for (i, w) in work.iter().enumerate().filter(|(_, w)| t < w.tokens.len()) {
                let seq = self
                    .seqs
                    .get(&w.seq)
                    .ok_or(BackendError::UnknownSequence(w.seq))?;
                toks.push(w.tokens[t] as i32);
                slots.push(seq.slot as i32);
                poss.push((seq.pos + t) as i32);
                items.push(i);
                let last = t + 1 == w.tokens.len();
                row_draws.push(match draws {
                    Some(d) if last => d[i],
                    _ => Draw::GREEDY,
                });
            }
            let input = StepInput {
                tokens: &toks,
                slots: &slots,
                positions: &poss,
            };
            self.graphs.run(&mut self.model, &input).map_err(dev)?;
            let vocab = self.model.cfg.vocab_size;
            let m = &mut self.model;
            self.sampler
                .pick(&m.ctx, &mut m.ws, vocab, &row_draws)
                .map_err(dev)?;
            let next = self.model.read_next(toks.len()).map_err(dev)?;
            for (row, &i) in items.iter().enumerate() {
                if t + 1 == work[i].tokens.len() {
                    out[i].0 = next[row] as u32;
                    if logits {
                        out[i].1 = self.model.read_logits(row).map_err(dev)?;
                    }
                }
            }
        }
        for w in work {
            if let Some(s) = self.seqs.get_mut(&w.seq) {
                s.pos += w.tokens.len();
            }
        }
        Ok(out)
    }

    /// Like [`Backend::forward`] but returns only each item's greedy next token (no logits copied back).
    pub fn forward_greedy(&mut self, work: &[Work<'_>]) -> Result<Vec<u32>, BackendError> {
        Ok(self
            .feed(work, None, false)?
            .into_iter()
            .map(|(t, _)| t)
            .collect())
    }
}

impl Backend for GpuBackend {
    fn describe(&self) -> String {
        let info = &self.model.ctx.info;
        format!("CUDA on {} ({:?} numerics)", info.name, self.model.numerics)
    }

    fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }

    fn context_limit(&self) -> usize {
        self.context_limit
    }

    fn create_seq(&mut self) -> Result<SeqId, BackendError> {
        let slot = self
            .free_slots
            .pop()
            .ok_or_else(|| dev("every sequence slot is in use"))?;
        let stream = self.model.ctx.stream.clone();
        for st in &mut self.model.states {
            st.reset_slot(&stream, slot).map_err(dev)?;
        }
        let id = SeqId(self.fresh_id());
        self.seqs.insert(id, Seq { slot, pos: 0 });
        Ok(id)
    }

    fn release_seq(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            self.free_slots.push(s.slot);
        }
        self.snapshots.retain(|_, s| s.seq != seq);
    }

    fn seq_len(&self, seq: SeqId) -> Result<usize, BackendError> {
        self.seqs
            .get(&seq)
            .map(|s| s.pos)
            .ok_or(BackendError::UnknownSequence(seq))
    }

    fn forward(&mut self, work: &[Work<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        Ok(self
            .feed(work, None, true)?
            .into_iter()
            .map(|(_, l)| l)
            .collect())
    }

    fn forward_pick(
        &mut self,
        work: &[Work<'_>],
        draws: &[Draw],
    ) -> Result<Vec<u32>, BackendError> {
        if draws.len() != work.len() {
            return Err(dev(format!(
                "{} draws for {} work items",
                draws.len(),
                work.len()
            )));
        }
        Ok(self
            .feed(work, Some(draws), false)?
            .into_iter()
            .map(|(t, _)| t)
            .collect())
    }

    fn snapshot(&mut self, seq: SeqId) -> Result<SnapshotId, BackendError> {
        let s = self
            .seqs
            .get(&seq)
            .ok_or(BackendError::UnknownSequence(seq))?;
        let stream = self.model.ctx.stream.clone();
        let layers = self
            .model
            .states
            .iter()
            .map(|st| st.snapshot(&stream, s.slot))
            .collect::<Result<Vec<_>, _>>()
            .map_err(dev)?;
        let snap = Snap {
            seq,
            pos: s.pos,
            layers,
        };
        let id = SnapshotId(self.fresh_id());
        self.snapshots.insert(id, snap);
        Ok(id)
    }

    fn restore(&mut self, seq: SeqId, snapshot: SnapshotId) -> Result<(), BackendError> {
        let snap = self
            .snapshots
            .get(&snapshot)
            .ok_or(BackendError::UnknownSnapshot(snapshot))?;
        if snap.seq != seq {
            return Err(BackendError::ForeignSnapshot { seq, snapshot });
        }
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(BackendError::UnknownSequence(seq))?;
        if snap.pos > s.pos {
            return Err(BackendError::StaleSnapshot { seq, snapshot });
        }
        let stream = self.model.ctx.stream.clone();
        for (st, ls) in self.model.states.iter_mut().zip(&snap.layers) {
            st.restore(&stream, s.slot, ls).map_err(dev)?;
        }
        s.pos = snap.pos;
        Ok(())
    }

    fn release_snapshot(&mut self, snapshot: SnapshotId) {
        self.snapshots.remove(&snapshot);
    }

    fn gpu_status(&self) -> Vec<GpuStatus> {
        let info = &self.model.ctx.info;
        let (free, total) = self
            .model
            .ctx
            .ctx
            .mem_get_info()
            .unwrap_or((0, info.total_mem));
        vec![GpuStatus {
            ordinal: info.ordinal,
            name: info.name.clone(),
            memory_used_bytes: total.saturating_sub(free) as u64,
            memory_total_bytes: total as u64,
        }]
    }
}
