//! Per-request decode state (spec §3): window ring buffers, compressed caches, indexer keys and
//! compressor states, with cheap snapshots for prefix reuse.
//!
//! Compressed caches only ever grow, so a snapshot keeps just the fixed-size parts (ring buffer,
//! compressor states) and the cache lengths; restoring truncates the caches back.

use super::compressor::CompressorState;
use super::weights::BlockWeights;
use crate::model::ModelConfig;

/// Cache and streaming state of one attention block for one sequence.
#[derive(Debug, Clone)]
pub struct LayerState {
    /// `[window, head_dim]` ring buffer, slot `pos mod window`.
    pub window: Vec<f32>,
    /// `[entries, head_dim]` compressed KV (CSA and HCA blocks).
    pub compressed: Vec<f32>,
    pub compressor: Option<CompressorState>,
    /// `[entries, index_head_dim]` lightning-indexer keys (CSA blocks).
    pub index_keys: Vec<f32>,
    pub index_compressor: Option<CompressorState>,
}

impl LayerState {
    pub fn new(cfg: &ModelConfig, w: &BlockWeights) -> Self {
        LayerState {
            window: vec![0.0; cfg.sliding_window * cfg.head_dim],
            compressed: Vec::new(),
            compressor: w.attn.compressor.as_ref().map(CompressorState::new),
            index_keys: Vec::new(),
            index_compressor: w
                .attn
                .indexer
                .as_ref()
                .map(|i| CompressorState::new(&i.compressor)),
        }
    }

    fn snapshot(&self) -> LayerSnapshot {
        LayerSnapshot {
            window: self.window.clone(),
            compressed_len: self.compressed.len(),
            compressor: self.compressor.clone(),
            index_keys_len: self.index_keys.len(),
            index_compressor: self.index_compressor.clone(),
        }
    }

    fn restore(&mut self, s: &LayerSnapshot) {
        self.window.copy_from_slice(&s.window);
        self.compressed.truncate(s.compressed_len);
        self.compressor.clone_from(&s.compressor);
        self.index_keys.truncate(s.index_keys_len);
        self.index_compressor.clone_from(&s.index_compressor);
    }

    /// Bytes held by this layer's caches.
    pub fn bytes(&self) -> usize {
        4 * (self.window.len() + self.compressed.len() + self.index_keys.len())
    }
}

#[derive(Debug, Clone)]
struct LayerSnapshot {
    window: Vec<f32>,
    compressed_len: usize,
    compressor: Option<CompressorState>,
    index_keys_len: usize,
    index_compressor: Option<CompressorState>,
}

/// The whole decode state of one sequence: the number of tokens consumed and every block's state.
#[derive(Debug, Clone)]
pub struct SeqState {
    pub pos: usize,
    pub layers: Vec<LayerState>,
}

/// The state of a sequence as it was after `pos` tokens; valid to restore while the sequence
/// still holds the same first `pos` tokens.
#[derive(Debug, Clone)]
pub struct SeqSnapshot {
    pub pos: usize,
    layers: Vec<LayerSnapshot>,
}

impl SeqState {
    pub fn snapshot(&self) -> SeqSnapshot {
        SeqSnapshot {
            pos: self.pos,
            layers: self.layers.iter().map(LayerState::snapshot).collect(),
        }
    }

    /// Rewinds to a snapshot taken earlier on this same sequence.
    pub fn restore(&mut self, s: &SeqSnapshot) {
        self.pos = s.pos;
        for (l, ls) in self.layers.iter_mut().zip(&s.layers) {
            l.restore(ls);
        }
    }

    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerState::bytes).sum()
    }
}
