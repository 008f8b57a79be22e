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
use super::seqs::{check_draws, feed_steps, logits_only, tokens_only, SeqTable, StepRunner};
use super::slots::{routed_backend_methods, Layers, SlotStates};
use super::weights::ModelWeightsDev;
use super::RunnerError;
use crate::api::{GpuStatus, Numerics};
use crate::backend::{Backend, BackendError, SeqId, SnapshotId, Work};
use crate::model::checkpoint::Checkpoint;
use crate::model::ModelConfig;
use crate::sampler::Draw;
use dsv4_kernels::GpuContext;
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

pub struct GpuBackend {
    model: GpuModel,
    graphs: GraphSet,
    sampler: DeviceSampler,
    /// Snapshots save every layer's state of the slot.
    table: SeqTable<Vec<AttnSnapshot>>,
    /// None when its workspace did not fit: prefill chunks then run as decode steps.
    prefill: Option<PrefillWs>,
}

/// The decode step of the one-GPU runner, for [`feed_steps`].
struct OneGpuSteps<'a> {
    model: &'a mut GpuModel,
    graphs: &'a GraphSet,
    sampler: &'a mut DeviceSampler,
    /// The batched prefill's workspace, when chunks go through it (prefill_feed.rs).
    prefill: Option<&'a mut PrefillWs>,
}

impl StepRunner for OneGpuSteps<'_> {
    fn run(&mut self, input: &StepInput<'_>) -> Result<(), RunnerError> {
        self.graphs.run(self.model, input).map(|_| ())
    }

    fn pick(&mut self, draws: &[Draw]) -> Result<(), RunnerError> {
        let m = &mut *self.model;
        let vocab = m.cfg.vocab_size;
        self.sampler.pick(&m.ctx, &mut m.ws, vocab, draws)
    }

    fn read_next(&mut self, rows: usize) -> Result<Vec<i32>, RunnerError> {
        self.model.read_next(rows)
    }

    fn read_logits(&self, row: usize) -> Result<Vec<f32>, RunnerError> {
        self.model.read_logits(row)
    }
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
        // The batched prefill reads FP8 linears and FP4 experts: BF16 checkpoints prefill as decode steps.
        let quantized = super::weights::check_quantized(&model.cfg).is_ok();
        let prefill = (quantized && super::prefill::supported(&model.ctx, &model.cfg))
            .then(|| PrefillWs::new(&model.ctx, &model.cfg, PREFILL_TOKENS, limit).ok())
            .flatten();
        Ok(GpuBackend {
            model,
            graphs,
            sampler,
            table: SeqTable::new(seqs, limit),
            prefill,
        })
    }

    pub fn model(&self) -> &GpuModel {
        &self.model
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
        self.table.check_work(work, self.model.cfg.vocab_size)?;
        let out = if self.prefill.is_some() && work.iter().any(|w| w.tokens.len() > 1) {
            self.feed_prefill(work, draws, logits)?
        } else {
            let mut steps = OneGpuSteps {
                model: &mut self.model,
                graphs: &self.graphs,
                sampler: &mut self.sampler,
                prefill: None,
            };
            feed_steps(&mut steps, &self.table, work, draws, logits)?
        };
        self.table.advance(work);
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

    routed_backend_methods!();

    fn gpu_status(&self) -> Vec<GpuStatus> {
        vec![gpu_status_of(&self.model.ctx)]
    }
}

/// The one GPU's layer states, for [`routed_backend_methods`].
fn slots_of(model: &mut GpuModel) -> Layers<'_> {
    Layers {
        stream: &model.ctx.stream,
        states: &mut model.states,
    }
}

/// Name and memory use of one GPU, as the engine reports it.
pub(crate) fn gpu_status_of(ctx: &GpuContext) -> GpuStatus {
    let info = &ctx.info;
    let (free, total) = ctx.ctx.mem_get_info().unwrap_or((0, info.total_mem));
    GpuStatus {
        ordinal: info.ordinal,
        name: info.name.clone(),
        memory_used_bytes: total.saturating_sub(free) as u64,
        memory_total_bytes: total as u64,
    }
}
