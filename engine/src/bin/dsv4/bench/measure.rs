//! Timing with CUDA events: copy bandwidth, decode steps (eager or graph replay), distinct experts per
//! step, and a per-op breakdown of one eager step.

use dsv4_engine::gpu::{GpuModel, GraphSet, StepInput};
use dsv4_kernels::cudarc::driver::{sys, CudaEvent, CudaStream};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

fn event(stream: &Arc<CudaStream>) -> anyhow::Result<CudaEvent> {
    Ok(stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written (2 GiB buffers).
pub fn copy_bandwidth(model_stream: &Arc<CudaStream>) -> anyhow::Result<f64> {
    let n = 2usize << 30;
    let src = model_stream.alloc_zeros::<u8>(n)?;
    let mut dst = model_stream.alloc_zeros::<u8>(n)?;
    model_stream.memcpy_dtod(&src, &mut dst)?;
    let reps = 10;
    let start = event(model_stream)?;
    for _ in 0..reps {
        model_stream.memcpy_dtod(&src, &mut dst)?;
    }
    let end = event(model_stream)?;
    let ms = f64::from(start.elapsed_ms(&end)?);
    Ok(2.0 * n as f64 * reps as f64 / (ms * 1e-3) / 1e9)
}

/// Host inputs of a bench step: `batch` rows in slots 0.., all at position `context`.
pub struct Inputs {
    pub tokens: Vec<i32>,
    pub slots: Vec<i32>,
    pub positions: Vec<i32>,
}

impl Inputs {
    pub fn new(batch: usize, context: usize, vocab: usize) -> Self {
        Inputs {
            tokens: (0..batch)
                .map(|i| ((i * 7919 + 13) % vocab) as i32)
                .collect(),
            slots: (0..batch as i32).collect(),
            positions: vec![context as i32; batch],
        }
    }
    pub fn step(&self) -> StepInput<'_> {
        StepInput {
            tokens: &self.tokens,
            slots: &self.slots,
            positions: &self.positions,
        }
    }
}

/// One decode step as the backend runs it: upload, step (graph or eager), read the tokens (one sync).
fn one_step(model: &mut GpuModel, graphs: &GraphSet, inp: &Inputs) -> anyhow::Result<()> {
    let rows = graphs.run(model, &inp.step())?;
    model.read_next(rows)?;
    Ok(())
}

/// Milliseconds per step over `steps` steps after `warmup` (graphs empty = eager).
pub fn time_steps(
    model: &mut GpuModel,
    graphs: &GraphSet,
    inp: &Inputs,
    warmup: usize,
    steps: usize,
) -> anyhow::Result<f64> {
    for _ in 0..warmup {
        one_step(model, graphs, inp)?;
    }
    let stream = model.ctx.stream.clone();
    let start = event(&stream)?;
    for _ in 0..steps {
        one_step(model, graphs, inp)?;
    }
    let end = event(&stream)?;
    Ok(f64::from(start.elapsed_ms(&end)?) / steps as f64)
}

/// Distinct routed experts selected per layer, summed over layers, in one eager step. The ids are read after
/// the routed experts: at batch 1 their first launch does the routing (engine gpu/moe.rs `fused_route_up`).
pub fn distinct_experts(model: &mut GpuModel, inp: &Inputs) -> anyhow::Result<usize> {
    let rows = inp.tokens.len();
    model.upload(&inp.step(), rows)?;
    let slots = rows * model.cfg.num_experts_per_tok;
    let stream = model.ctx.stream.clone();
    let mut total = 0usize;
    let mut ids = vec![0i32; slots];
    model.step_with(rows, &mut |name, ws| {
        if name == "moe.routed" {
            stream.memcpy_dtoh(&ws.ids.slice(..slots), &mut ids)?;
            stream.synchronize()?;
            total += ids.iter().collect::<HashSet<_>>().len();
        }
        Ok(())
    })?;
    model.read_next(rows)?;
    Ok(total)
}

/// Milliseconds per op name (summed over layers) of `reps` eager steps, averaged.
pub fn profile(
    model: &mut GpuModel,
    inp: &Inputs,
    reps: usize,
) -> anyhow::Result<Vec<(String, f64)>> {
    let rows = inp.tokens.len();
    let stream = model.ctx.stream.clone();
    let mut acc: BTreeMap<&'static str, f64> = BTreeMap::new();
    for _ in 0..reps {
        model.upload(&inp.step(), rows)?;
        let mut marks: Vec<(&'static str, CudaEvent)> = vec![("start", event(&stream)?)];
        model.step_with(rows, &mut |name, _| {
            marks.push((
                name,
                stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?,
            ));
            Ok(())
        })?;
        model.read_next(rows)?;
        for w in marks.windows(2) {
            *acc.entry(w[1].0).or_default() += f64::from(w[0].1.elapsed_ms(&w[1].1)?);
        }
    }
    let mut out: Vec<(String, f64)> = acc
        .into_iter()
        .map(|(k, v)| (k.to_string(), v / reps as f64))
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(out)
}
