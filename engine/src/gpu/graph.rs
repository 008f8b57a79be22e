//! CUDA graphs of the decode step, one per batch-size bucket. A step of `n` rows replays the smallest
//! bucket >= n with the inputs padded to it (padding rows use the pad slot); without such a bucket the
//! step runs eagerly. Replay and eager run the same kernels on the same buffers, so they give the same bits.

use super::model::{GpuModel, StepInput};
use super::RunnerError;
use dsv4_kernels::cudarc::driver::{sys, CudaGraph};

/// A captured graph that may move to the engine thread.
struct SendGraph(CudaGraph);

// SAFETY: a CUDA graph exec handle is not tied to the creating thread; cudarc binds the context to the
// calling thread before every launch, and the owner (one backend) never uses it from two threads at once.
unsafe impl Send for SendGraph {}

pub struct GraphSet {
    /// (bucket rows, graph), ascending.
    graphs: Vec<(usize, SendGraph)>,
}

impl GraphSet {
    pub fn empty() -> Self {
        GraphSet { graphs: Vec::new() }
    }

    /// Captures one graph per bucket (buckets above the workspace's rows are skipped).
    pub fn capture(model: &mut GpuModel, buckets: &[usize]) -> Result<Self, RunnerError> {
        let mut sizes: Vec<usize> = buckets
            .iter()
            .copied()
            .filter(|&b| b > 0 && b <= model.ws.max_rows)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut graphs = Vec::with_capacity(sizes.len());
        for b in sizes {
            let stream = model.ctx.stream.clone();
            stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            let stepped = model.step(b);
            // End the capture even when the step failed, so the stream is usable again.
            let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
            stepped?;
            let graph = ended?.ok_or(RunnerError::NoGraph(b))?;
            graph.upload()?;
            graphs.push((b, SendGraph(graph)));
        }
        Ok(GraphSet { graphs })
    }

    pub fn buckets(&self) -> Vec<usize> {
        self.graphs.iter().map(|(b, _)| *b).collect()
    }

    /// The smallest captured bucket that holds `rows`.
    pub fn bucket_for(&self, rows: usize) -> Option<usize> {
        self.graphs.iter().map(|(b, _)| *b).find(|&b| b >= rows)
    }

    fn graph(&self, bucket: usize) -> Option<&CudaGraph> {
        self.graphs
            .iter()
            .find(|(b, _)| *b == bucket)
            .map(|(_, g)| &g.0)
    }

    /// Uploads `input` and runs one step: graph replay when a bucket fits, eager otherwise. Returns the
    /// rows actually computed (the bucket, or the input's rows).
    pub fn run(&self, model: &mut GpuModel, input: &StepInput<'_>) -> Result<usize, RunnerError> {
        let n = input.tokens.len();
        match self
            .bucket_for(n)
            .and_then(|b| self.graph(b).map(|g| (b, g)))
        {
            Some((b, g)) => {
                model.upload(input, b)?;
                g.launch()?;
                Ok(b)
            }
            None => {
                model.upload(input, n)?;
                model.step(n)?;
                Ok(n)
            }
        }
    }
}
