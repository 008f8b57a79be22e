//! `dsv4 bench --gpus 0,1 --split tensor|layer`: the full-size synthetic model split over several GPUs
//! (each rank's share generated on its GPU, every layer with its own experts), decode timed per step
//! (host clock around input copy + step + greedy ids back, the step's one sync), eager and graph replay,
//! and the time inside collectives of an eager step; then the batched prefill (prompts of `--prefill`
//! lengths in calls of `--prefill-chunk` tokens, host clock to the first token).

use super::measure::Inputs;
use super::plan;
use super::prefill::{self, PrefillRow, PromptRunner};
use super::BenchArgs;
use anyhow::Context;
use dsv4_engine::api::{Numerics, SplitMode};
use dsv4_engine::gpu::multi::collective::GpuCollective;
use dsv4_engine::gpu::multi::graph::MultiGraphs;
use dsv4_engine::gpu::multi::load::{contexts, gpu_plan};
use dsv4_engine::gpu::multi::rank::Rank;
use dsv4_engine::gpu::multi::synth::synthetic_rank;
use dsv4_engine::gpu::multi::weights::rank_attention_config;
use dsv4_engine::gpu::multi::{collective_for, CollectiveKind, CollectiveProbe, MultiModel};
use dsv4_engine::gpu::{PrefillSeg, RunnerError};
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, GpuContext};
use std::sync::Arc;
use std::time::Instant;

#[derive(serde::Serialize)]
pub struct MultiRow {
    pub split: String,
    pub gpus: Vec<usize>,
    pub context: usize,
    pub batch: usize,
    pub graph: bool,
    pub ms_per_step: f64,
    pub tok_per_s: f64,
    /// Eager step: ms inside collectives (waiting for the other ranks included).
    pub collective_ms: f64,
    pub collectives_per_step: usize,
}

#[derive(serde::Serialize)]
pub struct MultiReport {
    pub gpu: String,
    /// Programmatic dependent launch on (every rank's context decides it the same way).
    pub pdl: bool,
    /// Where the kernels came from (super::kernels_label).
    pub kernels: &'static str,
    pub collective: String,
    pub weights_gb_per_rank: Vec<f64>,
    pub graph_error: Option<String>,
    pub rows: Vec<MultiRow>,
    /// Batched prefill (empty without `--prefill`).
    pub prefill: Vec<PrefillRow>,
}

fn split_name(mode: SplitMode) -> &'static str {
    match mode {
        SplitMode::Tensor => "tensor",
        SplitMode::Layer => "layer",
    }
}

/// Skips every collective: each GPU runs its share alone (wrong results, timing only), so the step
/// time without communication shows what the collectives cost inside the graphs.
struct NoCollective(usize);

impl GpuCollective for NoCollective {
    fn name(&self) -> &'static str {
        "no collectives (timing only)"
    }
    fn world(&self) -> usize {
        self.0
    }
    fn all_reduce_sum(&self, _: &mut [&mut CudaSlice<f32>], _: usize) -> Result<(), RunnerError> {
        Ok(())
    }
    fn send(
        &self,
        _: usize,
        _: usize,
        _: &CudaSlice<bf16>,
        _: &mut CudaSlice<bf16>,
        _: usize,
    ) -> Result<(), RunnerError> {
        Ok(())
    }
}

/// Which collective a timing runs with (`--collectives`, tensor split).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommChoice {
    /// What the backend picks (`collective_for`, `DSV4_COLLECTIVE` included).
    Auto,
    Nccl,
    Peer,
    /// Every collective skipped (`--without-collectives`).
    Without,
}

pub fn parse_comm(s: &str) -> Result<CommChoice, String> {
    match s {
        "auto" => Ok(CommChoice::Auto),
        "nccl" => Ok(CommChoice::Nccl),
        "peer" => Ok(CommChoice::Peer),
        "none" => Ok(CommChoice::Without),
        _ => Err(format!("`{s}`: expected auto, nccl, peer or none")),
    }
}

fn make_comm(
    choice: CommChoice,
    gpus: &[Arc<GpuContext>],
    mode: SplitMode,
) -> Result<Box<dyn GpuCollective>, RunnerError> {
    let kind = match choice {
        CommChoice::Auto => CollectiveKind::Auto,
        CommChoice::Nccl => CollectiveKind::Nccl,
        CommChoice::Peer => CollectiveKind::Peer,
        CommChoice::Without => return Ok(Box::new(NoCollective(gpus.len()))),
    };
    collective_for(gpus, mode, kind)
}

/// Builds the split model once and times it with each of `comms` in turn (the same weights, so the
/// collectives compare within one process); one report per collective.
pub fn run(
    args: &BenchArgs,
    devices: &[usize],
    mode: SplitMode,
    comms: &[CommChoice],
) -> anyhow::Result<Vec<MultiReport>> {
    let cfg = plan::flash_config()?;
    let plan = gpu_plan(&cfg, devices.len(), mode)?;
    let gpus = contexts(devices)?;
    let max_b = args.max_batch();
    let max_ctx = args.max_context();
    let mut ranks = Vec::with_capacity(gpus.len());
    let mut gb = Vec::new();
    for (r, g) in gpus.iter().enumerate() {
        let w = synthetic_rank(g, &plan, r, 42, args.banks).with_context(|| {
            format!(
                "building rank {r} of the full-size model on GPU {} (ranks simulated on one GPU do not fit \
                 with a bank per layer: pass --banks N to share expert banks)",
                devices[r]
            )
        })?;
        gb.push(w.bytes() as f64 / 1e9);
        let attn_cfg = match mode {
            SplitMode::Tensor => rank_attention_config(&cfg, &plan.ranks[r])?,
            SplitMode::Layer => cfg.clone(),
        };
        ranks.push(Rank::new(
            g.clone(),
            &cfg,
            &attn_cfg,
            w,
            max_b + 1,
            max_b,
            max_ctx,
        )?);
    }
    let first = *comms.first().unwrap_or(&CommChoice::Auto);
    let comm = make_comm(first, &gpus, mode)?;
    let mut model = MultiModel::new(plan, Numerics::Official, ranks, comm, max_b, max_b)?;
    let mut reports = Vec::with_capacity(comms.len());
    for (i, &choice) in comms.iter().enumerate() {
        if i > 0 {
            model.synchronize()?;
            model.comm = make_comm(choice, &gpus, mode)?;
        }
        let without = choice == CommChoice::Without;
        reports.push(time_with(args, &mut model, devices, &gb, without)?);
    }
    Ok(reports)
}

/// Decode (eager and graphs) and prefill timings of `model` with its current collective.
fn time_with(
    args: &BenchArgs,
    model: &mut MultiModel,
    devices: &[usize],
    gb: &[f64],
    without_collectives: bool,
) -> anyhow::Result<MultiReport> {
    let mode = model.plan.mode;
    let collective = model.comm.name().to_string();
    println!(
        "{} ranks ({} split, {collective}) on GPUs {devices:?}: weights {:?} GB per rank",
        model.ranks.len(),
        split_name(mode),
        gb.iter()
            .map(|g| (g * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    model.synchronize()?;
    // The graphs are dropped at the end of this call, before the collective they captured.
    let (graphs, graph_error) = match MultiGraphs::capture(model, &args.batches) {
        Ok(g) => (g, None),
        Err(e) => {
            println!("graph capture failed ({e}): eager only");
            model.synchronize()?;
            (MultiGraphs::empty(), Some(e.to_string()))
        }
    };
    let mut rows = Vec::new();
    for &c in &args.contexts {
        for &b in args.batches.iter() {
            let inp = Inputs::new(b, c, model.cfg.vocab_size);
            let (coll_ms, count) = collective_ms(model, &inp)?;
            let modes: &[bool] = if graphs.buckets().contains(&b) {
                &[false, true]
            } else {
                &[false]
            };
            for &graph in modes {
                let none = MultiGraphs::empty();
                let g = if graph { &graphs } else { &none };
                let ms = time_steps(model, g, &inp, args.warmup, args.steps)?;
                rows.push(MultiRow {
                    split: split_name(mode).into(),
                    gpus: devices.to_vec(),
                    context: c,
                    batch: b,
                    graph,
                    ms_per_step: ms,
                    tok_per_s: b as f64 / (ms * 1e-3),
                    collective_ms: coll_ms,
                    collectives_per_step: count,
                });
            }
        }
    }
    let chunk = args.prefill_chunk.max(1);
    let prompts = args.prompts();
    let prefill = if prompts.is_empty() || without_collectives {
        Vec::new()
    } else if model.enable_prefill(chunk) {
        let mut r = SplitPrompts { model, start: None };
        prefill::time_runner(&mut r, &prompts, chunk)?
    } else {
        println!("no prefill workspace of {chunk} tokens fits: prefill not timed");
        Vec::new()
    };
    let report = MultiReport {
        gpu: model.ranks[0].gpu.info.name.clone(),
        pdl: model.ranks[0].gpu.pdl,
        kernels: super::kernels_label(&model.ranks[0].gpu),
        collective,
        weights_gb_per_rank: gb.to_vec(),
        graph_error,
        rows,
        prefill,
    };
    print_report(&report);
    prefill::print(&report.prefill, &[], chunk);
    drop(graphs);
    model.synchronize()?;
    Ok(report)
}

/// The split runner's batched prefill, timed on the host (the ranks' GPUs have no common event clock).
struct SplitPrompts<'a> {
    model: &'a mut MultiModel,
    start: Option<Instant>,
}

impl PromptRunner for SplitPrompts<'_> {
    fn vocab(&self) -> usize {
        self.model.cfg.vocab_size
    }
    fn reset(&mut self) -> anyhow::Result<()> {
        for r in &mut self.model.ranks {
            let s = r.gpu.stream.clone();
            for st in &mut r.states {
                st.reset_slot(&s, 0)?;
            }
        }
        Ok(())
    }
    fn prefill(&mut self, seg: PrefillSeg<'_>) -> anyhow::Result<()> {
        Ok(self.model.prefill(&[seg])?)
    }
    fn read_next(&mut self) -> anyhow::Result<()> {
        self.model.read_next(1)?;
        Ok(())
    }
    fn start(&mut self) -> anyhow::Result<()> {
        self.model.synchronize()?;
        self.start = Some(Instant::now());
        Ok(())
    }
    fn stop(&mut self) -> anyhow::Result<f64> {
        let start = self
            .start
            .take()
            .ok_or_else(|| anyhow::anyhow!("not started"))?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    }
}

fn one_step(model: &mut MultiModel, graphs: &MultiGraphs, inp: &Inputs) -> anyhow::Result<()> {
    let rows = graphs.run(model, &inp.step())?;
    model.read_next(rows)?;
    Ok(())
}

/// Milliseconds per step over `steps` steps after `warmup` (graphs empty = eager).
fn time_steps(
    model: &mut MultiModel,
    graphs: &MultiGraphs,
    inp: &Inputs,
    warmup: usize,
    steps: usize,
) -> anyhow::Result<f64> {
    for _ in 0..warmup {
        one_step(model, graphs, inp)?;
    }
    model.synchronize()?;
    let start = Instant::now();
    for _ in 0..steps {
        one_step(model, graphs, inp)?;
    }
    model.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64)
}

/// Collective milliseconds of an eager step (mean of 3) and the collectives per step.
fn collective_ms(model: &mut MultiModel, inp: &Inputs) -> anyhow::Result<(f64, usize)> {
    let rows = inp.tokens.len();
    let (mut total, mut count) = (0.0, 0);
    for _ in 0..3 {
        let mut probe = CollectiveProbe::default();
        model.upload(&inp.step(), rows)?;
        model.step_probed(rows, Some(&mut probe))?;
        model.read_next(rows)?;
        model.synchronize()?;
        total += probe.total_ms()?;
        count = probe.spans.len();
    }
    Ok((total / 3.0, count))
}

fn print_report(r: &MultiReport) {
    let pdl = if r.pdl { "on" } else { "off" };
    println!(
        "\n{} | {} | official numerics | PDL {pdl} | kernels {}",
        r.gpu, r.collective, r.kernels
    );
    println!("| split | GPUs | context | batch | graph | ms/step | tok/s | collectives/step | collective ms/step (eager) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for x in &r.rows {
        println!(
            "| {} | {:?} | {} | {} | {} | {:.3} | {:.1} | {} | {:.3} |",
            x.split,
            x.gpus,
            x.context,
            x.batch,
            if x.graph { "on" } else { "off" },
            x.ms_per_step,
            x.tok_per_s,
            x.collectives_per_step,
            x.collective_ms
        );
    }
}
