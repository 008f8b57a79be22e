//! `dsv4 bench`: a full-dimension DeepSeek-V4-Flash with random weights generated on one GPU, decode
//! timed with CUDA events at several batch sizes and context lengths, eager and graph replay, against
//! the bytes each step must read and the device's copy bandwidth.

mod measure;
mod multi;
mod plan;
mod prefill;

use dsv4_engine::api::{Numerics, SplitMode};
use dsv4_engine::gpu::{
    block_dense_bytes, probe_gpu, BankPlan, ExpertBank, GpuModel, GpuProbe, GraphSet,
    ModelWeightsDev, PrefillWs, MAX_ROWS,
};
use dsv4_kernels::GpuContext;
use measure::Inputs;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Decode batch sizes (rows per step, 1..=64).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    batches: Vec<usize>,
    /// Live context lengths (tokens already in each sequence's caches).
    #[arg(long, value_delimiter = ',', default_value = "4096,65536")]
    contexts: Vec<usize>,
    #[arg(long, default_value_t = 20)]
    steps: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Per-op time breakdown of one eager step (events around each op).
    #[arg(long)]
    profile: bool,
    /// Also write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Routed-expert banks (default: as many as fit; layers share the rest). With --gpus: banks per rank
    /// (default: one per layer; fewer let ranks simulated on one GPU fit).
    #[arg(long)]
    banks: Option<usize>,
    /// Split the model over these GPUs (ordinals; the same ordinal repeated simulates several ranks
    /// on one GPU). Two or more run the split runner instead of the one-GPU bench.
    #[arg(long, value_delimiter = ',')]
    gpus: Vec<usize>,
    /// With --gpus: also time the tensor split with every collective skipped (wrong results; shows
    /// what the collectives cost inside the graphs).
    #[arg(long)]
    without_collectives: bool,
    /// With --gpus, tensor split: the collectives to time in turn on the same model build (`auto`: the
    /// backend's choice; `nccl`, `peer`, `none` = every collective skipped).
    #[arg(long, value_delimiter = ',', default_value = "auto", value_parser = multi::parse_comm)]
    collectives: Vec<multi::CommChoice>,
    /// Split modes to run with --gpus, in turn.
    #[arg(long, value_delimiter = ',', default_value = "tensor", value_parser = parse_split)]
    split: Vec<SplitMode>,
    /// Prompt lengths of the batched-prefill timing (`0`: skip it).
    #[arg(long, value_delimiter = ',', default_value = "1024,8192")]
    prefill: Vec<usize>,
    /// Tokens per batched-prefill call.
    #[arg(long, default_value_t = 8192)]
    prefill_chunk: usize,
}

impl BenchArgs {
    /// Rejects settings the bench cannot time, naming the value (before any GPU work).
    fn validate(&self) -> anyhow::Result<()> {
        if self.batches.is_empty() {
            anyhow::bail!("--batches: give at least one decode batch size");
        }
        if let Some(b) = self.batches.iter().find(|b| !(1..=MAX_ROWS).contains(*b)) {
            anyhow::bail!(
                "--batches: {b} rows is outside 1..={MAX_ROWS} (the most rows one decode step runs)"
            );
        }
        if self.contexts.is_empty() {
            anyhow::bail!("--contexts: give at least one context length");
        }
        if self.steps == 0 {
            anyhow::bail!("--steps: time at least one step");
        }
        Ok(())
    }

    /// The largest decode batch asked for (validate keeps every one in 1..=MAX_ROWS).
    pub(super) fn max_batch(&self) -> usize {
        self.batches
            .iter()
            .copied()
            .max()
            .unwrap_or(1)
            .clamp(1, MAX_ROWS)
    }

    /// The prefill prompt lengths to time (`0` entries dropped).
    pub(super) fn prompts(&self) -> Vec<usize> {
        self.prefill.iter().copied().filter(|&p| p > 0).collect()
    }

    /// Context the caches are made for: the longest live context or prompt, plus the timed steps.
    fn max_context(&self) -> usize {
        let longest = self.prompts().into_iter().max().unwrap_or(0);
        let ctx = self.contexts.iter().copied().max().unwrap_or(4096);
        ctx.max(longest) + self.warmup + self.steps + 8
    }
}

/// The collectives a split mode is timed with: the layer split has one hand-off per step (the backend's
/// choice); the tensor split each of `--collectives`, then none with `--without-collectives`.
fn comms_for(args: &BenchArgs, mode: SplitMode) -> Vec<multi::CommChoice> {
    let mut out = match mode {
        SplitMode::Layer => vec![multi::CommChoice::Auto],
        SplitMode::Tensor => args.collectives.clone(),
    };
    if mode == SplitMode::Tensor && args.without_collectives {
        out.push(multi::CommChoice::Without);
    }
    out
}

fn parse_split(s: &str) -> Result<SplitMode, String> {
    match s {
        "tensor" => Ok(SplitMode::Tensor),
        "layer" => Ok(SplitMode::Layer),
        _ => Err(format!("`{s}`: expected tensor or layer")),
    }
}

#[derive(serde::Serialize)]
struct Row {
    context: usize,
    batch: usize,
    graph: bool,
    ms_per_step: f64,
    tok_per_s: f64,
    distinct_experts: usize,
    weight_gb: f64,
    cache_gb: f64,
    gb_per_s: f64,
    pct_of_copy: f64,
}

#[derive(serde::Serialize)]
struct Report {
    gpu: String,
    /// Programmatic dependent launch on (the default on sm_90+; `DSV4_PDL=0` turns it off).
    pdl: bool,
    /// Where the kernels came from (see [`kernels_label`]).
    kernels: &'static str,
    copy_gb_per_s: f64,
    expert_banks: usize,
    layers_sharing_a_bank: usize,
    weights_gb: f64,
    rows: Vec<Row>,
    /// (batch, per-op ms) of eager steps.
    profile: Vec<(usize, Vec<(String, f64)>)>,
    prefill: Vec<prefill::PrefillRow>,
    /// Per-stage ms of one prefill call of `prefill_chunk` tokens.
    prefill_profile: Vec<(String, f64)>,
    /// (tokens, per-stage ms) of one call of the shortest prompt, when it is shorter than a chunk.
    prefill_profile_short: Option<(usize, Vec<(String, f64)>)>,
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    args.validate()?;
    let info = match probe_gpu() {
        GpuProbe::Available(i) => i,
        // The reason alone: describe() would add "using the CPU backend", which the bench does not do.
        GpuProbe::Unavailable(why) => anyhow::bail!("dsv4 bench needs a GPU: {why}"),
    };
    if args.gpus.len() >= 2 {
        let mut reports = Vec::new();
        for &mode in &args.split {
            reports.extend(multi::run(args, &args.gpus, mode, &comms_for(args, mode))?);
        }
        if let Some(p) = &args.json {
            std::fs::write(p, serde_json::to_string_pretty(&reports)?)?;
        }
        return Ok(());
    }
    let cfg = plan::flash_config()?;
    let ctx = GpuContext::new(0)?;
    let copy = measure::copy_bandwidth(&ctx.stream)?;
    let max_b = args.max_batch();
    let prompts = args.prompts();
    let max_ctx = args.max_context();
    let chunk = args.prefill_chunk.max(1);
    let prefill_bytes = if prompts.is_empty() {
        0
    } else {
        PrefillWs::bytes_for(&cfg, chunk, max_ctx)
    };
    let mem = plan::memory_plan(&ctx, &cfg, max_b + 1, max_ctx, prefill_bytes)?;
    let banks = args.banks.unwrap_or(mem.banks);
    let bank_plan = BankPlan::shared(cfg.num_hidden_layers, banks);
    println!(
        "{}: {:.1} GiB free, {:.1} GiB for the rest; expert bank {:.2} GiB; {} banks for {} layers ({} layers share a bank)",
        info.name,
        mem.free as f64 / GIB,
        mem.other as f64 / GIB,
        mem.bank_bytes as f64 / GIB,
        bank_plan.banks,
        cfg.num_hidden_layers,
        bank_plan.sharings()
    );
    let weights = ModelWeightsDev::synthetic(&ctx, &cfg, bank_plan.clone(), 42)?;
    let weights_gb = weights.bytes(&cfg) as f64 / 1e9;
    let mut model = GpuModel::new(ctx, cfg, weights, Numerics::Official, max_b, max_b, max_ctx)?;
    let graphs = GraphSet::capture(&mut model, &args.batches)?;
    let mut rows = Vec::new();
    for &c in &args.contexts {
        for &b in args.batches.iter() {
            rows.extend(bench_point(&mut model, &graphs, args, c, b, copy)?);
        }
    }
    let mut profile = Vec::new();
    if args.profile {
        for b in [1, max_b] {
            let inp = Inputs::new(b, args.contexts[0], model.cfg.vocab_size);
            profile.push((b, measure::profile(&mut model, &inp, 3)?));
        }
    }
    let mut report = Report {
        gpu: info.name,
        pdl: model.ctx.pdl,
        kernels: kernels_label(&model.ctx),
        copy_gb_per_s: copy,
        expert_banks: bank_plan.banks,
        layers_sharing_a_bank: bank_plan.sharings(),
        weights_gb,
        rows,
        profile,
        prefill: Vec::new(),
        prefill_profile: Vec::new(),
        prefill_profile_short: None,
    };
    print_report(&report);
    if !prompts.is_empty() {
        let mut ws = PrefillWs::new(&model.ctx, &model.cfg, chunk, max_ctx)?;
        report.prefill = prefill::time_prompts(&mut model, &mut ws, &prompts, chunk)?;
        if args.profile {
            report.prefill_profile = prefill::profile(&mut model, &mut ws, chunk)?;
            let shortest = prompts.iter().copied().min().unwrap_or(chunk);
            if shortest < chunk {
                let p = prefill::profile(&mut model, &mut ws, shortest)?;
                report.prefill_profile_short = Some((shortest, p));
            }
        }
        prefill::print(&report.prefill, &report.prefill_profile, chunk);
        if let Some((len, p)) = &report.prefill_profile_short {
            prefill::print_profile(p, *len);
        }
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

const GIB: f64 = (1u64 << 30) as f64;

/// Eager and graph timings of one (context, batch) point.
fn bench_point(
    model: &mut GpuModel,
    graphs: &GraphSet,
    args: &BenchArgs,
    context: usize,
    batch: usize,
    copy: f64,
) -> anyhow::Result<Vec<Row>> {
    let inp = Inputs::new(batch, context, model.cfg.vocab_size);
    let experts = measure::distinct_experts(model, &inp)?;
    let cfg = &model.cfg;
    let w = &model.weights;
    let dense: usize = w
        .blocks
        .iter()
        .map(|b| b.attn.weight_bytes() as usize + block_dense_bytes(b))
        .sum();
    let fixed =
        dense + w.head.num_bytes() + w.hc_head.func.num_bytes() + batch * cfg.hidden_size * 2;
    let weight = fixed + experts * ExpertBank::expert_bytes(cfg);
    let cache = batch * plan::cache_bytes_per_row(cfg, context);
    let mut out = Vec::new();
    for graph in [false, true] {
        let none = GraphSet::empty();
        let g = if graph { graphs } else { &none };
        let ms = measure::time_steps(model, g, &inp, args.warmup, args.steps)?;
        let gbs = (weight + cache) as f64 / (ms * 1e-3) / 1e9;
        out.push(Row {
            context,
            batch,
            graph,
            ms_per_step: ms,
            tok_per_s: batch as f64 / (ms * 1e-3),
            distinct_experts: experts,
            weight_gb: weight as f64 / 1e9,
            cache_gb: cache as f64 / 1e9,
            gb_per_s: gbs,
            pct_of_copy: 100.0 * gbs / copy,
        });
    }
    Ok(out)
}

/// "fatbin" (nvcc at build time: every kernel, the sm_90a wgmma ones included) or "NVRTC" (compiled at start
/// for the GPU present, without the sm_90a-only wgmma kernels: the prefill GEMMs and the ring GEMVs take their
/// mma.sync kernels). Printed with every table: a build without nvcc measures other kernels.
pub(crate) fn kernels_label(ctx: &GpuContext) -> &'static str {
    match ctx.source {
        dsv4_kernels::ModuleSource::Fatbin => "fatbin",
        dsv4_kernels::ModuleSource::Nvrtc { .. } => "NVRTC",
    }
}

fn print_report(r: &Report) {
    println!(
        "\n{} | copy {:.0} GB/s | weights {:.1} GB | {} expert banks ({} layers share) | official numerics | PDL {} | kernels {}",
        r.gpu,
        r.copy_gb_per_s,
        r.weights_gb,
        r.expert_banks,
        r.layers_sharing_a_bank,
        if r.pdl { "on" } else { "off" },
        r.kernels
    );
    println!("| context | batch | graph | ms/step | tok/s | experts | weights GB | cache GB | GB/s | of copy |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for x in &r.rows {
        println!(
            "| {} | {} | {} | {:.3} | {:.1} | {} | {:.2} | {:.3} | {:.0} | {:.1}% |",
            x.context,
            x.batch,
            if x.graph { "on" } else { "off" },
            x.ms_per_step,
            x.tok_per_s,
            x.distinct_experts,
            x.weight_gb,
            x.cache_gb,
            x.gb_per_s,
            x.pct_of_copy
        );
    }
    for (b, ops) in &r.profile {
        println!("\nper-op time of one eager step (batch {b}), summed over layers:");
        let total: f64 = ops.iter().map(|p| p.1).sum();
        for (name, ms) in ops {
            println!("  {name:<14} {ms:8.3} ms  {:5.1}%", 100.0 * ms / total);
        }
    }
}
