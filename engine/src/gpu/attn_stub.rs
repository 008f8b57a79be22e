//! STAND-IN for `gpu::attention` (branch gpu-attn): the same API, no weights, output zeros. Lets the
//! rest of the runner build, run and be timed before the real attention block is merged; delete on merge.

use crate::api::Numerics;
use crate::model::checkpoint::{Checkpoint, CheckpointError};
use crate::model::ModelConfig;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream, DriverError};
use dsv4_kernels::{bf16, GpuContext, KernelError};

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("kernel: {0}")]
    Kernel(#[from] KernelError),
    #[error("driver: {0}")]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

pub struct AttnLayer {
    hidden: usize,
}

impl AttnLayer {
    pub fn from_checkpoint(
        _ctx: &GpuContext,
        ck: &Checkpoint,
        _layer: usize,
    ) -> Result<AttnLayer, GpuError> {
        Ok(AttnLayer {
            hidden: ck.config().hidden_size,
        })
    }
    pub fn synthetic(
        _ctx: &GpuContext,
        cfg: &ModelConfig,
        _layer: usize,
        _seed: u64,
    ) -> Result<AttnLayer, GpuError> {
        Ok(AttnLayer {
            hidden: cfg.hidden_size,
        })
    }
    pub fn weight_bytes(&self) -> u64 {
        0
    }
}

pub struct AttnSnapshot;

pub struct AttnState;

impl AttnState {
    pub fn new(
        _ctx: &GpuContext,
        _cfg: &ModelConfig,
        _layer: usize,
        _slots: usize,
        _max_context: usize,
    ) -> Result<AttnState, GpuError> {
        Ok(AttnState)
    }
    pub fn bytes(&self) -> u64 {
        0
    }
    pub fn reset_slot(&mut self, _stream: &CudaStream, _slot: usize) -> Result<(), GpuError> {
        Ok(())
    }
    pub fn snapshot(&self, _stream: &CudaStream, _slot: usize) -> Result<AttnSnapshot, GpuError> {
        Ok(AttnSnapshot)
    }
    pub fn restore(
        &mut self,
        _stream: &CudaStream,
        _slot: usize,
        _snap: &AttnSnapshot,
    ) -> Result<(), GpuError> {
        Ok(())
    }
}

pub struct StepMeta {
    pub slots: CudaSlice<i32>,
    pub positions: CudaSlice<i32>,
}

pub struct AttnScratch;

impl AttnScratch {
    pub fn new(
        _ctx: &GpuContext,
        _cfg: &ModelConfig,
        _max_rows: usize,
    ) -> Result<AttnScratch, GpuError> {
        Ok(AttnScratch)
    }
}

#[allow(clippy::too_many_arguments)]
pub fn decode(
    ctx: &GpuContext,
    _stream: &CudaStream,
    layer: &AttnLayer,
    _state: &mut AttnState,
    _meta: &StepMeta,
    rows: usize,
    _a: &CudaSlice<bf16>,
    _scratch: &mut AttnScratch,
    out: &mut CudaSlice<bf16>,
    _numerics: Numerics,
) -> Result<(), GpuError> {
    let mut view = out.slice_mut(..rows * layer.hidden);
    ctx.stream.memset_zeros(&mut view)?;
    Ok(())
}
