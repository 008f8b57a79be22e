//! Per-sequence caches of one attention block on the device (spec §3), for `slots` sequences at once.
//!
//! Growing caches (compressed KV, indexer keys) are append-only and their live length is a function of the
//! position (`(pos + 1) / ratio` entries after the token at `pos`), so no device counters exist: the kernels
//! derive every count from `StepMeta::positions`. A snapshot therefore only copies the fixed-size part
//! (window ring, compressor states); restoring it and feeding positions from the snapshot point on rewinds
//! the slot.
use super::error::GpuError;
use crate::model::{AttentionKind, ModelConfig, CSA_RATIO};
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{bf16, GpuContext};
use std::sync::Arc;

/// One compressor's streaming state and its output cache.
pub struct CompCache {
    /// `[slots, cap, dim]` bf16 entries.
    pub cache: CudaSlice<bf16>,
    pub cap: usize,
    pub dim: usize,
    /// `[slots, srows, width]` κ and γ (ape included) of the rows being pooled.
    pub kv: CudaSlice<f32>,
    pub sc: CudaSlice<f32>,
    /// f32 per slot in each of `kv` / `sc`.
    pub per_slot: usize,
}

impl CompCache {
    fn new(
        s: &Arc<CudaStream>,
        slots: usize,
        max_context: usize,
        ratio: usize,
        dim: usize,
    ) -> Result<Self, GpuError> {
        let ovl = if ratio == CSA_RATIO { 2 } else { 1 };
        let cap = max_context / ratio;
        let per_slot = ovl * ratio * ovl * dim;
        Ok(CompCache {
            cache: s.alloc_zeros(slots * cap.max(1) * dim)?,
            cap,
            dim,
            kv: s.alloc_zeros(slots * per_slot)?,
            sc: s.alloc_zeros(slots * per_slot)?,
            per_slot,
        })
    }

    fn bytes(&self) -> u64 {
        2 * self.cache.len() as u64 + 4 * (self.kv.len() + self.sc.len()) as u64
    }
}

pub struct AttnState {
    pub slots: usize,
    pub max_context: usize,
    pub window: usize,
    pub dim: usize,
    /// `[slots, window, head_dim]` ring buffer, row `pos mod window`.
    pub ring: CudaSlice<bf16>,
    pub comp: Option<CompCache>,
    pub index: Option<CompCache>,
    /// `[slots, max_context / 4]` indexer scores of the current step (CSA only).
    pub scores: Option<CudaSlice<f32>>,
}

/// The fixed-size state of one slot.
pub struct AttnSnapshot {
    ring: CudaSlice<bf16>,
    comp: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    index: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
}

impl AttnState {
    pub fn new(
        ctx: &GpuContext,
        cfg: &ModelConfig,
        layer: usize,
        slots: usize,
        max_context: usize,
    ) -> Result<Self, GpuError> {
        let s = &ctx.stream;
        let (w, d) = (cfg.sliding_window, cfg.head_dim);
        let kind = cfg.attention_kind(layer);
        let comp = match kind {
            AttentionKind::Window => None,
            k => Some(CompCache::new(s, slots, max_context, k.ratio(), d)?),
        };
        let (index, scores) = match kind {
            AttentionKind::Csa { ratio } => (
                Some(CompCache::new(
                    s,
                    slots,
                    max_context,
                    ratio,
                    cfg.index_head_dim,
                )?),
                Some(s.alloc_zeros(slots * (max_context / ratio).max(1))?),
            ),
            _ => (None, None),
        };
        let mut st = AttnState {
            slots,
            max_context,
            window: w,
            dim: d,
            ring: s.alloc_zeros(slots * w * d)?,
            comp,
            index,
            scores,
        };
        for slot in 0..slots {
            st.reset_slot(s, slot)?;
        }
        Ok(st)
    }

    pub fn bytes(&self) -> u64 {
        2 * self.ring.len() as u64
            + self.comp.as_ref().map_or(0, CompCache::bytes)
            + self.index.as_ref().map_or(0, CompCache::bytes)
            + self.scores.as_ref().map_or(0, |s| 4 * s.len() as u64)
    }

    fn check_slot(&self, slot: usize) -> Result<(), GpuError> {
        super::error::ensure(slot < self.slots, || {
            format!("slot {slot} >= {}", self.slots)
        })
    }

    /// Empties `slot` for a new sequence: compressor κ = 0, γ = −∞ (an empty previous window weighs 0).
    /// Not graph-capturable (copies −∞ from the host); called between requests.
    pub fn reset_slot(&mut self, stream: &Arc<CudaStream>, slot: usize) -> Result<(), GpuError> {
        self.check_slot(slot)?;
        let rl = self.window * self.dim;
        stream.memset_zeros(&mut self.ring.slice_mut(slot * rl..(slot + 1) * rl))?;
        for c in [self.comp.as_mut(), self.index.as_mut()]
            .into_iter()
            .flatten()
        {
            let r = slot * c.per_slot..(slot + 1) * c.per_slot;
            stream.memset_zeros(&mut c.kv.slice_mut(r.clone()))?;
            let neg_inf = vec![f32::NEG_INFINITY; c.per_slot];
            stream.memcpy_htod(&neg_inf, &mut c.sc.slice_mut(r))?;
        }
        Ok(())
    }

    pub fn snapshot(
        &self,
        stream: &Arc<CudaStream>,
        slot: usize,
    ) -> Result<AttnSnapshot, GpuError> {
        self.check_slot(slot)?;
        let rl = self.window * self.dim;
        let pair = |c: &CompCache| -> Result<(CudaSlice<f32>, CudaSlice<f32>), GpuError> {
            let r = slot * c.per_slot..(slot + 1) * c.per_slot;
            let mut kv = stream.alloc_zeros(c.per_slot)?;
            let mut sc = stream.alloc_zeros(c.per_slot)?;
            stream.memcpy_dtod(&c.kv.slice(r.clone()), &mut kv)?;
            stream.memcpy_dtod(&c.sc.slice(r), &mut sc)?;
            Ok((kv, sc))
        };
        let mut ring = stream.alloc_zeros(rl)?;
        stream.memcpy_dtod(&self.ring.slice(slot * rl..(slot + 1) * rl), &mut ring)?;
        Ok(AttnSnapshot {
            ring,
            comp: self.comp.as_ref().map(pair).transpose()?,
            index: self.index.as_ref().map(pair).transpose()?,
        })
    }

    pub fn restore(
        &mut self,
        stream: &Arc<CudaStream>,
        slot: usize,
        s: &AttnSnapshot,
    ) -> Result<(), GpuError> {
        self.check_slot(slot)?;
        let rl = self.window * self.dim;
        stream.memcpy_dtod(
            &s.ring,
            &mut self.ring.slice_mut(slot * rl..(slot + 1) * rl),
        )?;
        for (c, saved) in [
            (self.comp.as_mut(), &s.comp),
            (self.index.as_mut(), &s.index),
        ] {
            if let (Some(c), Some((kv, sc))) = (c, saved) {
                let r = slot * c.per_slot..(slot + 1) * c.per_slot;
                stream.memcpy_dtod(kv, &mut c.kv.slice_mut(r.clone()))?;
                stream.memcpy_dtod(sc, &mut c.sc.slice_mut(r))?;
            }
        }
        Ok(())
    }
}

/// Device buffers `[rows]` the runner fills before each step (so a captured graph stays valid).
pub struct StepMeta {
    pub slots: CudaSlice<i32>,
    pub positions: CudaSlice<i32>,
}

impl StepMeta {
    pub fn new(stream: &Arc<CudaStream>, max_rows: usize) -> Result<Self, GpuError> {
        Ok(StepMeta {
            slots: stream.alloc_zeros(max_rows.max(1))?,
            positions: stream.alloc_zeros(max_rows.max(1))?,
        })
    }

    /// Copies host values in (tests, or a runner without graphs).
    pub fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        slots: &[i32],
        positions: &[i32],
    ) -> Result<(), GpuError> {
        stream.memcpy_htod(slots, &mut self.slots.slice_mut(..slots.len()))?;
        stream.memcpy_htod(positions, &mut self.positions.slice_mut(..positions.len()))?;
        Ok(())
    }
}
