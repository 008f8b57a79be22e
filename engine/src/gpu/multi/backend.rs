//! [`MultiGpuBackend`]: the split model behind the engine's [`Backend`] interface, the sibling of the
//! one-GPU [`crate::gpu::GpuBackend`] (which stays the path for one GPU). Sequences map to state slots
//! that exist on every rank; snapshots save every rank's layers of a slot. Chunks longer than one token
//! go through the split's batched prefill (multi/prefill.rs, prefill_tp.rs), as on one GPU.

use super::collective::{collective_for, CollectiveKind, GpuCollective};
use super::graph::MultiGraphs;
use super::load::{check_gpus_fit, contexts, gpu_plan, load_rank_weights, read_config};
use super::model::MultiModel;
use super::rank::Rank;
use super::weights::{rank_attention_config, RankWeights};
use crate::api::{GpuStatus, SplitMode};
use crate::backend::{Backend, BackendError, SeqId, SnapshotId, Work};
use crate::gpu::attention::AttnSnapshot;
use crate::gpu::backend::gpu_status_of;
use crate::gpu::backend::PREFILL_TOKENS;
use crate::gpu::prefill::feed::{feed_chunks, ChunkRunner};
use crate::gpu::prefill::{self, PrefillSeg};
use crate::gpu::sampling::DeviceSampler;
use crate::gpu::seqs::{check_draws, feed_steps, logits_only, tokens_only, SeqTable, StepRunner};
use crate::gpu::slots::{routed_backend_methods, Layers, SlotStates};
use crate::gpu::{GpuOptions, RunnerError, StepInput, MAX_ROWS};
use crate::model::ModelConfig;
use crate::parallel::plan::SplitPlan;
use crate::parallel::LoadSettings;
use crate::sampler::Draw;
use dsv4_kernels::GpuContext;
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
    /// The collective between GPUs (default: `DSV4_COLLECTIVE`, else the peer sum where possible).
    pub collective: CollectiveKind,
}

pub struct MultiGpuBackend {
    /// Before the model: graphs holding NCCL work are destroyed before the communicators.
    graphs: MultiGraphs,
    model: MultiModel,
    /// Picks tokens on the rank that holds the logits.
    sampler: DeviceSampler,
    /// Snapshots save `[rank][local layer]` states of the slot.
    table: SeqTable<Vec<Vec<AttnSnapshot>>>,
}

/// The split runner's decode step and batched prefill, for [`feed_steps`] and [`feed_chunks`].
struct SplitSteps<'a> {
    model: &'a mut MultiModel,
    graphs: &'a MultiGraphs,
    sampler: &'a mut DeviceSampler,
}

impl StepRunner for SplitSteps<'_> {
    fn run(&mut self, input: &StepInput<'_>) -> Result<(), RunnerError> {
        self.graphs.run(self.model, input).map(|_| ())
    }

    fn pick(&mut self, draws: &[Draw]) -> Result<(), RunnerError> {
        let r = self.model.out_rank_mut();
        let vocab = r.cfg.vocab_size;
        self.sampler.pick(&r.gpu, &mut r.ws, vocab, draws)
    }

    fn read_next(&mut self, rows: usize) -> Result<Vec<i32>, RunnerError> {
        self.model.read_next(rows)
    }

    fn read_logits(&self, row: usize) -> Result<Vec<f32>, RunnerError> {
        self.model.read_logits(row)
    }
}

impl ChunkRunner for SplitSteps<'_> {
    fn max_tokens(&self) -> usize {
        self.model.prefill_tokens()
    }

    fn prefill(&mut self, segs: &[PrefillSeg<'_>]) -> Result<(), RunnerError> {
        self.model.prefill(segs)
    }
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
        let built = Self::new(plan, gpus.clone(), weights, &opts.gpu, opts.collective);
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
        collective: CollectiveKind,
    ) -> Result<Self, RunnerError> {
        let seqs = opts.max_seqs.clamp(1, MAX_ROWS);
        let limit = opts.max_context.min(plan.cfg.max_position_embeddings);
        let comm = collective_for(&gpus, plan.mode, collective)?;
        let mut model = build_model(plan, gpus, weights, comm, opts, seqs, limit)?;
        // As on one GPU: the batched prefill reads FP8 linears and FP4 experts (BF16 checkpoints prefill
        // as decode steps), and runs where its kernels fit the model.
        let quantized = crate::gpu::weights::check_quantized(&model.cfg).is_ok();
        if quantized && prefill::supported(&model.ranks[0].gpu, &model.cfg) {
            model.enable_prefill(PREFILL_TOKENS);
        }
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
            table: SeqTable::new(seqs, limit),
        })
    }

    pub fn model(&self) -> &MultiModel {
        &self.model
    }

    /// Feeds every item's tokens: through the batched prefill when a chunk is longer than one token (and
    /// its workspaces fit), otherwise one token per item per step; after each item's last token records
    /// the token its draw picks (greedy without `draws`) and, with `logits`, its logits.
    fn feed(
        &mut self,
        work: &[Work<'_>],
        draws: Option<&[Draw]>,
        logits: bool,
    ) -> Result<Vec<(u32, Vec<f32>)>, BackendError> {
        self.table.check_work(work, self.model.cfg.vocab_size)?;
        let mut steps = SplitSteps {
            model: &mut self.model,
            graphs: &self.graphs,
            sampler: &mut self.sampler,
        };
        let chunks = steps.model.prefill_tokens() > 0 && work.iter().any(|w| w.tokens.len() > 1);
        let out = if chunks {
            feed_chunks(&mut steps, &self.table, work, draws, logits)?
        } else {
            feed_steps(&mut steps, &self.table, work, draws, logits)?
        };
        self.table.advance(work);
        Ok(out)
    }
}

fn build_model(
    plan: SplitPlan,
    gpus: Vec<Arc<GpuContext>>,
    weights: Vec<RankWeights>,
    comm: Box<dyn GpuCollective>,
    opts: &GpuOptions,
    seqs: usize,
    limit: usize,
) -> Result<MultiModel, RunnerError> {
    let cfg = plan.cfg.clone();
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

    routed_backend_methods!();

    fn gpu_status(&self) -> Vec<GpuStatus> {
        let mut out: Vec<GpuStatus> = Vec::new();
        for r in &self.model.ranks {
            if !out.iter().any(|g| g.ordinal == r.gpu.info.ordinal) {
                out.push(gpu_status_of(&r.gpu));
            }
        }
        out
    }
}

/// Every rank's layer states, for [`routed_backend_methods`].
fn slots_of(model: &mut MultiModel) -> Vec<Layers<'_>> {
    model
        .ranks
        .iter_mut()
        .map(|r| Layers {
            stream: &r.gpu.stream,
            states: &mut r.states,
        })
        .collect()
}
