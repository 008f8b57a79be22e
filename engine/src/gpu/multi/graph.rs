//! CUDA graphs of the split decode step, one set per batch-size bucket: every distinct rank stream
//! (one per GPU; simulated ranks share one) is captured at once while the step is enqueued, so each
//! GPU's graph holds its kernels and its side of the collectives (NCCL calls are captured like kernels).
//! A step replays every GPU's graph of the smallest bucket that holds its rows.

use super::model::MultiModel;
use crate::gpu::{RunnerError, StepInput};
use dsv4_kernels::cudarc::driver::{sys, CudaGraph, CudaStream};
use std::sync::Arc;

/// A captured graph that may move to the engine thread.
struct SendGraph(CudaGraph);

// SAFETY: a CUDA graph exec handle is not tied to the creating thread; cudarc binds the context to the
// calling thread before every launch, and the owner (one backend) never uses it from two threads at once.
unsafe impl Send for SendGraph {}

pub struct MultiGraphs {
    /// (bucket rows, one graph per distinct stream), ascending.
    sets: Vec<(usize, Vec<SendGraph>)>,
}

/// The ranks' streams, each once.
fn streams(model: &MultiModel) -> Vec<Arc<CudaStream>> {
    let mut out: Vec<Arc<CudaStream>> = Vec::new();
    for r in &model.ranks {
        if !out.iter().any(|s| Arc::ptr_eq(s, &r.gpu.stream)) {
            out.push(r.gpu.stream.clone());
        }
    }
    out
}

impl MultiGraphs {
    pub fn empty() -> Self {
        MultiGraphs { sets: Vec::new() }
    }

    /// Captures one graph set per bucket (buckets above the model's rows are skipped).
    pub fn capture(model: &mut MultiModel, buckets: &[usize]) -> Result<Self, RunnerError> {
        let mut sizes: Vec<usize> = buckets
            .iter()
            .copied()
            .filter(|&b| b > 0 && b <= model.max_rows)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut sets = Vec::with_capacity(sizes.len());
        for b in sizes {
            sets.push((b, capture_one(model, b)?));
        }
        Ok(MultiGraphs { sets })
    }

    pub fn buckets(&self) -> Vec<usize> {
        self.sets.iter().map(|(b, _)| *b).collect()
    }

    /// Uploads `input` and runs one step: graph replay when a bucket fits, eager otherwise. Returns the
    /// rows actually computed.
    pub fn run(&self, model: &mut MultiModel, input: &StepInput<'_>) -> Result<usize, RunnerError> {
        let n = input.tokens.len();
        match self.sets.iter().find(|(b, _)| *b >= n) {
            Some((b, graphs)) => {
                model.upload(input, *b)?;
                for g in graphs {
                    g.0.launch()?;
                }
                Ok(*b)
            }
            None => {
                model.upload(input, n)?;
                model.step(n)?;
                Ok(n)
            }
        }
    }
}

/// Captures one step of `rows` rows on every stream.
fn capture_one(model: &mut MultiModel, rows: usize) -> Result<Vec<SendGraph>, RunnerError> {
    let streams = streams(model);
    // Relaxed: NCCL may make setup calls of its own while the streams capture.
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    let mut begun = 0;
    let mut result = Ok(());
    for s in &streams {
        result = s.begin_capture(mode).map_err(RunnerError::from);
        if result.is_err() {
            break;
        }
        begun += 1;
    }
    if result.is_ok() {
        result = model.step(rows);
    }
    // End every capture that began, even after a failure, so the streams are usable again.
    let mut graphs = Vec::with_capacity(begun);
    for s in &streams[..begun] {
        let ended = s.end_capture(sys::CUgraphInstantiate_flags(0));
        match ended {
            Ok(Some(g)) => graphs.push(SendGraph(g)),
            Ok(None) => result = result.and(Err(RunnerError::NoGraph(rows))),
            Err(e) => result = result.and(Err(e.into())),
        }
    }
    result?;
    for g in &graphs {
        g.0.upload()?;
    }
    Ok(graphs)
}
