//! The KV compressor (spec §2.5): pools each window of `ratio` tokens into one entry with a
//! per-channel softmax gate. With overlap (ratio 4) an entry pools the previous window's first
//! channel half together with the current window's second half.

use super::ops::rmsnorm_rows;
use super::rope::Rope;
use super::weights::CompressorWeights;

/// Streaming state of one compressor for one sequence: the projected rows of the window being
/// filled and, with overlap, of the previous complete window.
#[derive(Debug, Clone)]
pub struct CompressorState {
    /// `[ratio, width]` κ rows of the current window, slot `pos mod ratio`.
    cur_kv: Vec<f32>,
    /// `[ratio, width]` gate logits (ape included) of the current window.
    cur_gate: Vec<f32>,
    /// The previous complete window (overlap only).
    prev_kv: Vec<f32>,
    prev_gate: Vec<f32>,
    has_prev: bool,
}

impl CompressorState {
    pub fn new(w: &CompressorWeights) -> Self {
        let width = w.wkv.out;
        let cells = w.ratio * width;
        let prev = if w.overlap { cells } else { 0 };
        CompressorState {
            cur_kv: vec![0.0; cells],
            cur_gate: vec![0.0; cells],
            prev_kv: vec![0.0; prev],
            prev_gate: vec![0.0; prev],
            has_prev: false,
        }
    }

    /// Feeds the projections of the token at `pos`; returns the raw pooled entry `[dim]` when
    /// this token completes a window.
    pub fn push(
        &mut self,
        w: &CompressorWeights,
        pos: usize,
        kv: &[f32],
        gate: &[f32],
    ) -> Option<Vec<f32>> {
        let m = w.ratio;
        let width = kv.len();
        let slot = pos % m;
        let ape = &w.ape[slot * width..(slot + 1) * width];
        self.cur_kv[slot * width..(slot + 1) * width].copy_from_slice(kv);
        for (dst, (g, a)) in self.cur_gate[slot * width..(slot + 1) * width]
            .iter_mut()
            .zip(gate.iter().zip(ape))
        {
            *dst = g + a;
        }
        if slot + 1 != m {
            return None;
        }
        let entry = self.pool(w);
        if w.overlap {
            self.prev_kv.copy_from_slice(&self.cur_kv);
            self.prev_gate.copy_from_slice(&self.cur_gate);
            self.has_prev = true;
        }
        Some(entry)
    }

    fn pool(&self, w: &CompressorWeights) -> Vec<f32> {
        let (m, dim) = (w.ratio, w.dim);
        let width = self.cur_kv.len() / m;
        // Slots as (kv rows, gate rows, channel offset into the row).
        let mut sources: Vec<(&[f32], &[f32], usize)> = Vec::with_capacity(2);
        if w.overlap {
            if self.has_prev {
                sources.push((&self.prev_kv, &self.prev_gate, 0));
            }
            sources.push((&self.cur_kv, &self.cur_gate, dim));
        } else {
            sources.push((&self.cur_kv, &self.cur_gate, 0));
        }
        let mut out = vec![0.0f32; dim];
        for (c, o) in out.iter_mut().enumerate() {
            let mut max = f32::NEG_INFINITY;
            for (_, g, off) in &sources {
                for r in 0..m {
                    max = max.max(g[r * width + off + c]);
                }
            }
            let (mut num, mut den) = (0.0f32, 0.0f32);
            for (kv, g, off) in &sources {
                for r in 0..m {
                    let e = (g[r * width + off + c] - max).exp();
                    den += e;
                    num += e * kv[r * width + off + c];
                }
            }
            *o = num / den;
        }
        out
    }
}

/// Normalises and ropes a freshly pooled entry `w` (position of its window's first token).
pub fn finish_entry(w: &CompressorWeights, entry: &mut [f32], index: usize, rope: &Rope, eps: f32) {
    rmsnorm_rows(entry, &w.norm, eps);
    rope.apply(entry, index * w.ratio, false);
}
