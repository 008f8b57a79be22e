//! [`MultiGpuBackend`]: the split model behind the engine's [`Backend`] interface, the sibling of the
//! one-GPU [`crate::gpu::GpuBackend`] (which stays the path for one GPU). Sequences map to state slots
//! that exist on every rank; snapshots save every rank's layers of a slot.

use super::collective::{GpuCollective, NcclComms, OnDeviceSum};
use super::graph::MultiGraphs;
use super::load::{check_gpus_fit, contexts, gpu_plan, load_rank_weights, read_config};
use super::model::MultiModel;
use super::rank::Rank;
use super::weights::{rank_attention_config, RankWeights};
use crate::api::{GpuStatus, SplitMode};
use crate::backend::{check_tokens, Backend, BackendError, SeqId, SnapshotId, Work};
use crate::gpu::attention::AttnSnapshot;
use crate::gpu::sampling::DeviceSampler;
use crate::gpu::{GpuOptions, RunnerError, StepInput, MAX_ROWS};
use crate::model::ModelConfig;
use crate::parallel::plan::SplitPlan;
use crate::parallel::LoadSettings;
use crate::sampler::Draw;
use dsv4_kernels::GpuContext;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Where the ranks run and how the model is split.
#[derive(Debug, Clone)]
pub struct MultiOptions {
    pub gpu: GpuOptions,
    /// Rank r runs on GPU `devices[r]`; one ordinal repeated simulates that many ranks on one GPU
    /// (joined by an on-device sum instead of NCCL).
    pub devices: Vec<usize>,
    pub mode: SplitMode,
}

struct Seq {
    slot: usize,
    pos: usize,
}

struct Snap {
    seq: SeqId,
    pos: usize,
    /// `[rank][local layer]`.
    ranks: Vec<Vec<AttnSnapshot>>,
}

pub struct MultiGpuBackend {
    /// Before the model: graphs holding NCCL work are destroyed before the communicators.
    graphs: MultiGraphs,
    model: MultiModel,
    /// Picks tokens on the rank that holds the logits.
    sampler: DeviceSampler,
    seqs: HashMap<SeqId, Seq>,
    free_slots: Vec<usize>,
    snapshots: HashMap<SnapshotId, Snap>,
    next_id: u64,
    context_limit: usize,
}

fn dev(e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(e.to_string())
}

/// NCCL when every rank has its own GPU, the on-device sum when all share one.
pub fn collective_for(gpus: &[Arc<GpuContext>]) -> Result<Box<dyn GpuCollective>, RunnerError> {
    let first = &gpus[0];
    if gpus.iter().all(|g| Arc::ptr_eq(g, first)) {
        return Ok(Box::new(OnDeviceSum::new(first.clone(), gpus.len())));
    }
    let distinct = gpus
        .iter()
        .enumerate()
        .all(|(i, g)| gpus[..i].iter().all(|o| !Arc::ptr_eq(o, g)));
    if !distinct {
        return Err(RunnerError::Split(
            "ranks must all share one GPU (simulated) or each have their own".into(),
        ));
    }
    Ok(Box::new(NcclComms::new(
        gpus.iter().map(|g| g.stream.clone()).collect(),
    )?))
}

impl MultiGpuBackend {
    /// Loads `dir` split over `opts.devices`, refusing up front when a GPU cannot hold its share plus
    /// the caches; on any failure nothing stays on the GPUs.
    pub fn load(
        dir: &Path,
        opts: &MultiOptions,
        settings: &LoadSettings<'_>,
    ) -> Result<Self, RunnerError> {
        if opts.devices.is_empty() {
            return Err(RunnerError::Split("no GPUs given".into()));
        }
        let cfg = read_config(dir)?;
        let plan = gpu_plan(&cfg, opts.devices.len(), opts.mode)?;
        let gpus = contexts(&opts.devices)?;
        let seqs = opts.gpu.max_seqs.clamp(1, MAX_ROWS);
        check_gpus_fit(&plan, &gpus, opts.gpu.max_context, seqs)?;
        let weights = load_rank_weights(dir, &plan, &gpus, settings)?;
        let built = Self::new(plan, gpus.clone(), weights, &opts.gpu);
        if built.is_err() {
            super::load::release(&gpus)?;
        }
        built
    }

    /// The backend over ready rank weights (`weights[r]` on `gpus[r]`).
    pub fn new(
        plan: SplitPlan,
        gpus: Vec<Arc<GpuContext>>,
        weights: Vec<RankWeights>,
        opts: &GpuOptions,
    ) -> Result<Self, RunnerError> {
        let seqs = opts.max_seqs.clamp(1, MAX_ROWS);
        let limit = opts.max_context.min(plan.cfg.max_position_embeddings);
        let mut model = build_model(plan, gpus, weights, opts, seqs, limit)?;
        let graphs = if opts.cuda_graphs {
            MultiGraphs::capture(&mut model, &opts.graph_buckets)?
        } else {
            MultiGraphs::empty()
        };
        let sampler = {
            let out = model.out_rank_mut();
            DeviceSampler::new(&out.gpu, out.cfg.vocab_size, seqs)?
        };
        Ok(MultiGpuBackend {
            model,
            graphs,
            sampler,
            seqs: HashMap::new(),
            free_slots: (0..seqs).rev().collect(),
            snapshots: HashMap::new(),
            next_id: 1,
            context_limit: limit,
        })
    }

    pub fn model(&self) -> &MultiModel {
        &self.model
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn slot_of(&self, seq: SeqId) -> Result<&Seq, BackendError> {
        self.seqs
            .get(&seq)
            .ok_or(BackendError::UnknownSequence(seq))
    }

    fn check_work(&self, work: &[Work<'_>]) -> Result<(), BackendError> {
        check_tokens(work, self.model.cfg.vocab_size)?;
        for w in work {
            let have = self.slot_of(w.seq)?.pos;
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

    /// Feeds every item's tokens, one token per item per step; after each item's last token records
    /// the token its draw picks (greedy without `draws`) and, with `logits`, its logits.
    fn feed(
        &mut self,
        work: &[Work<'_>],
        draws: Option<&[Draw]>,
        logits: bool,
    ) -> Result<Vec<(u32, Vec<f32>)>, BackendError> {
        self.check_work(work)?;
        let mut out = vec![(0u32, Vec::new()); work.len()];
        let steps = work.iter().map(|w| w.tokens.len()).max().unwrap_or(0);
        for t in 0..steps {
            let (mut toks, mut slots, mut poss, mut items) = (vec![], vec![], vec![], vec![]);
            let mut row_draws = Vec::new();
            for (i, w) in work.iter().enumerate().filter(|(_, w)| t < w.tokens.len()) {
                let seq = self.slot_of(w.seq)?;
                toks.push(w.tokens[t] as i32);
                slots.push(seq.slot as i32);
                poss.push((seq.pos + t) as i32);
                items.push(i);
                row_draws.push(match draws {
                    Some(d) if t + 1 == w.tokens.len() => d[i],
                    _ => Draw::GREEDY,
                });
            }
            let input = StepInput {
                tokens: &toks,
                slots: &slots,
                positions: &poss,
            };
            self.graphs.run(&mut self.model, &input).map_err(dev)?;
            let r = self.model.out_rank_mut();
            let vocab = r.cfg.vocab_size;
            self.sampler
                .pick(&r.gpu, &mut r.ws, vocab, &row_draws)
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
}

fn build_model(
    plan: SplitPlan,
    gpus: Vec<Arc<GpuContext>>,
    weights: Vec<RankWeights>,
    opts: &GpuOptions,
    seqs: usize,
    limit: usize,
) -> Result<MultiModel, RunnerError> {
    let cfg = plan.cfg.clone();
    let comm = collective_for(&gpus)?;
    let ranks = weights
        .into_iter()
        .zip(gpus)
        .map(|(w, g)| {
            let attn_cfg = match plan.mode {
                SplitMode::Tensor => rank_attention_config(&cfg, &plan.ranks[w.rank])?,
                SplitMode::Layer => cfg.clone(),
            };
            Rank::new(g, &cfg, &attn_cfg, w, seqs + 1, seqs, limit)
        })
        .collect::<Result<Vec<_>, _>>()?;
    MultiModel::new(plan, opts.numerics, ranks, comm, seqs, seqs)
}

impl Backend for MultiGpuBackend {
    fn describe(&self) -> String {
        let m = &self.model;
        let name = &m.ranks[0].gpu.info.name;
        format!(
            "CUDA on {} ranks ({:?} split, {}) of {name} ({:?} numerics)",
            m.ranks.len(),
            m.plan.mode,
            m.comm.name(),
            m.numerics
        )
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
        for r in &mut self.model.ranks {
            let stream = r.gpu.stream.clone();
            for st in &mut r.states {
                st.reset_slot(&stream, slot).map_err(dev)?;
            }
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
        Ok(self.slot_of(seq)?.pos)
    }

    fn forward(&mut self, work: &[Work<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        let fed = self.feed(work, None, true)?;
        Ok(fed.into_iter().map(|(_, l)| l).collect())
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
        let fed = self.feed(work, Some(draws), false)?;
        Ok(fed.into_iter().map(|(t, _)| t).collect())
    }

    fn snapshot(&mut self, seq: SeqId) -> Result<SnapshotId, BackendError> {
        let (slot, pos) = {
            let s = self.slot_of(seq)?;
            (s.slot, s.pos)
        };
        let mut ranks = Vec::with_capacity(self.model.ranks.len());
        for r in &self.model.ranks {
            let layers = r
                .states
                .iter()
                .map(|st| st.snapshot(&r.gpu.stream, slot))
                .collect::<Result<Vec<_>, _>>()
                .map_err(dev)?;
            ranks.push(layers);
        }
        let id = SnapshotId(self.fresh_id());
        self.snapshots.insert(id, Snap { seq, pos, ranks });
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
        for (r, layers) in self.model.ranks.iter_mut().zip(&snap.ranks) {
            let stream = r.gpu.stream.clone();
            for (st, ls) in r.states.iter_mut().zip(layers) {
                st.restore(&stream, s.slot, ls).map_err(dev)?;
            }
        }
        s.pos = snap.pos;
        Ok(())
    }

    fn release_snapshot(&mut self, snapshot: SnapshotId) {
        self.snapshots.remove(&snapshot);
    }

    fn gpu_status(&self) -> Vec<GpuStatus> {
        let mut out: Vec<GpuStatus> = Vec::new();
        for r in &self.model.ranks {
            let info = &r.gpu.info;
            if out.iter().any(|g| g.ordinal == info.ordinal) {
                continue;
            }
            let (free, total) = r.gpu.ctx.mem_get_info().unwrap_or((0, info.total_mem));
            out.push(GpuStatus {
                ordinal: info.ordinal,
                name: info.name.clone(),
                memory_used_bytes: total.saturating_sub(free) as u64,
                memory_total_bytes: total as u64,
            });
        }
        out
    }
}
