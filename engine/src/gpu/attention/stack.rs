//! The compressor and indexer weights of one attention layer, stacked into one bf16 projection (`lin`) so
//! the decode step reads them in one grouped GEMV. Both weight sources (the one-GPU checkpoint loader and the
//! split runner's rank store) go through [`stack_compressors`], so the row offsets cannot drift apart.
use super::error::{ensure, GpuError};
use super::layer::{CompressorDev, Fp8Linear, IndexerDev};
use crate::model::{AttentionKind, ModelConfig, CSA_RATIO};
use dsv4_kernels::bf16;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream, DriverError};
use std::sync::Arc;

/// What the stacking needs from a weight source.
pub(crate) trait AttnWeightSource {
    type Error: From<GpuError>;
    /// Appends the rows of a bf16-stored linear `name` to `into` (exact); returns its row count.
    fn bf16_rows(&mut self, name: &str, into: &mut Vec<bf16>) -> Result<usize, Self::Error>;
    /// An f32 tensor on the device.
    fn f32(&mut self, name: &str) -> Result<CudaSlice<f32>, Self::Error>;
    /// The FP8 (or bf16) linear `{prefix}.weight` (+ its scales).
    fn fp8(&mut self, prefix: &str) -> Result<Fp8Linear, Self::Error>;
}

/// The stacked projection and what reads it.
pub(crate) struct Stacked {
    pub comp: Option<CompressorDev>,
    pub index: Option<IndexerDev>,
    pub lin: Vec<bf16>,
    pub rows: usize,
}

impl Stacked {
    /// The stack on the device (None for a layer without compressors).
    pub fn upload(&self, stream: &Arc<CudaStream>) -> Result<Option<CudaSlice<bf16>>, DriverError> {
        if self.lin.is_empty() {
            return Ok(None);
        }
        stream.clone_htod(&self.lin).map(Some)
    }
}

/// The compressor (every layer but the sliding-window ones) and, for CSA layers, the indexer with its own
/// compressor and weights projection; `p` is the layer's `attn.` prefix.
pub(crate) fn stack_compressors<S: AttnWeightSource>(
    src: &mut S,
    p: &str,
    kind: AttentionKind,
    cfg: &ModelConfig,
) -> Result<Stacked, S::Error> {
    let mut s = Stacked {
        comp: None,
        index: None,
        lin: Vec::new(),
        rows: 0,
    };
    if kind != AttentionKind::Window {
        s.comp = Some(compressor(
            src,
            &format!("{p}compressor"),
            kind.ratio(),
            cfg.head_dim,
            &mut s,
        )?);
    }
    if let AttentionKind::Csa { ratio } = kind {
        let comp = compressor(
            src,
            &format!("{p}indexer.compressor"),
            ratio,
            cfg.index_head_dim,
            &mut s,
        )?;
        let wts_off = s.rows;
        s.rows += src.bf16_rows(&format!("{p}indexer.weights_proj.weight"), &mut s.lin)?;
        s.index = Some(IndexerDev {
            wq_b: src.fp8(&format!("{p}indexer.wq_b"))?,
            comp,
            wts_off,
        });
    }
    Ok(s)
}

/// One compressor: its wkv then wgate rows appended to the stack.
fn compressor<S: AttnWeightSource>(
    src: &mut S,
    p: &str,
    ratio: usize,
    dim: usize,
    s: &mut Stacked,
) -> Result<CompressorDev, S::Error> {
    let kv_off = s.rows;
    s.rows += src.bf16_rows(&format!("{p}.wkv.weight"), &mut s.lin)?;
    let gate_off = s.rows;
    s.rows += src.bf16_rows(&format!("{p}.wgate.weight"), &mut s.lin)?;
    let c = CompressorDev {
        ape: src.f32(&format!("{p}.ape"))?,
        norm: src.f32(&format!("{p}.norm.weight"))?,
        ratio,
        overlap: ratio == CSA_RATIO,
        dim,
        kv_off,
        gate_off,
    };
    ensure(
        gate_off - kv_off == c.width() && s.rows - gate_off == c.width(),
        || format!("`{p}`: wkv/wgate rows"),
    )?;
    Ok(c)
}
