//! Token choice on the device for rows whose draw is not greedy (the step's argmax already holds the
//! greedy ones): the draws go up as data, `sample_rows` overwrites those rows' ids, and only ids
//! come back. Buffers are allocated once, so a step allocates nothing.

use super::workspace::Workspace;
use super::RunnerError;
use crate::sampler::Draw;
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{GpuContext, SAMPLE_PARAMS_PER_ROW};

pub struct DeviceSampler {
    params: CudaSlice<f64>,
    /// The weights of every row, [max_rows, vocab].
    scratch: CudaSlice<f32>,
    staging: Vec<f64>,
    max_rows: usize,
}

impl DeviceSampler {
    /// Buffers on `ctx` for steps of up to `max_rows` rows over a `vocab`-wide head.
    pub fn new(ctx: &GpuContext, vocab: usize, max_rows: usize) -> Result<Self, RunnerError> {
        let s = &ctx.stream;
        let n = max_rows * SAMPLE_PARAMS_PER_ROW;
        Ok(DeviceSampler {
            params: s.alloc_zeros::<f64>(n)?,
            scratch: s.alloc_zeros::<f32>(max_rows * vocab)?,
            staging: vec![0.0; n],
            max_rows,
        })
    }

    /// Replaces the greedy ids (`ws.next`) of the last step's first `draws.len()` rows by the draws'
    /// picks from `ws.logits` (`vocab` wide), unless every draw is greedy (then the step's argmax
    /// stands and nothing is launched). Enqueued on `ctx`'s stream, no sync.
    pub fn pick(
        &mut self,
        ctx: &GpuContext,
        ws: &mut Workspace,
        vocab: usize,
        draws: &[Draw],
    ) -> Result<(), RunnerError> {
        let rows = draws.len();
        if draws.iter().all(Draw::is_greedy) {
            return Ok(());
        }
        if rows > self.max_rows {
            return Err(RunnerError::TooManyRows {
                rows,
                max: self.max_rows,
            });
        }
        for (row, d) in self
            .staging
            .chunks_exact_mut(SAMPLE_PARAMS_PER_ROW)
            .zip(draws)
        {
            row.copy_from_slice(&[
                f64::from(d.temperature),
                f64::from(d.top_k),
                f64::from(d.top_p),
                f64::from(d.min_p),
                d.uniform,
            ]);
        }
        let s = &ctx.stream;
        let n = rows * SAMPLE_PARAMS_PER_ROW;
        s.memcpy_htod(&self.staging[..n], &mut self.params.slice_mut(..n))?;
        let logits = ws.logits.slice(..rows * vocab);
        let mut next = ws.next.slice_mut(..rows);
        ctx.launch_sample_rows(
            s,
            rows,
            vocab,
            &logits,
            &self.params,
            &mut self.scratch,
            &mut next,
        )?;
        Ok(())
    }
}
