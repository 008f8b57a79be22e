//! The per-row intermediates of the attention block, from the block input to the `wo_b` input. Decode
//! ([`super::AttnScratch`]) and prefill (`prefill::ws::AttnBufs`) run the same stages over them, so one
//! struct and one allocation keep both paths' buffers alike.
use crate::model::ModelConfig;
use dsv4_kernels::bf16;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream, DriverError};
use std::sync::Arc;

pub struct AttnActs {
    /// The FP8 fake quantisation of the block input (official numerics, FP8 wq_a) [rows, hidden].
    pub xq: CudaSlice<bf16>,
    pub qr_f32: CudaSlice<f32>,
    pub kv_f32: CudaSlice<f32>,
    pub qr: CudaSlice<bf16>,
    pub q_f32: CudaSlice<f32>,
    pub q: CudaSlice<bf16>,
    /// Stacked bf16 projections (compressors, weights_proj) f32 [rows, lin_max].
    pub proj: CudaSlice<f32>,
    pub iq_f32: CudaSlice<f32>,
    pub iq: CudaSlice<bf16>,
    pub sel: CudaSlice<i32>,
    /// Attention output in group-major layout `[groups, rows, heads·head_dim/groups]`.
    pub o: CudaSlice<bf16>,
    pub u_f32: CudaSlice<f32>,
    pub u: CudaSlice<bf16>,
}

/// The widest stacked bf16 projection of any block (CSA: both compressors and weights_proj).
pub(crate) fn lin_max(cfg: &ModelConfig) -> usize {
    4 * cfg.head_dim + 4 * cfg.index_head_dim + cfg.index_n_heads
}

impl AttnActs {
    /// Bytes per row of the buffers [`AttnActs::new`] allocates (memory planning: keep in step with it).
    pub(crate) fn bytes_per_row(cfg: &ModelConfig) -> usize {
        let hd = cfg.num_attention_heads * cfg.head_dim;
        let iq = cfg.index_n_heads * cfg.index_head_dim;
        let lora = cfg.o_groups * cfg.o_lora_rank;
        // (bytes per element x elements per row) of: xq; qr_f32 + qr; kv_f32; q_f32 + q + o; proj;
        // iq_f32 + iq; sel; u_f32 + u.
        let terms = [
            (2, cfg.hidden_size),
            (4 + 2, cfg.q_lora_rank),
            (4, cfg.head_dim),
            (4 + 2 + 2, hd),
            (4, lin_max(cfg)),
            (4 + 2, iq),
            (4, cfg.index_topk.max(1)),
            (4 + 2, lora),
        ];
        terms.iter().map(|(b, n)| b * n).sum()
    }

    /// Zeroed buffers for `rows` rows, each at least `min_len` elements: prefill passes 1 (its whole
    /// workspace rounds empty buffers up to one element), decode 0 (exact lengths).
    pub(crate) fn new(
        s: &Arc<CudaStream>,
        cfg: &ModelConfig,
        rows: usize,
        min_len: usize,
    ) -> Result<Self, DriverError> {
        let len = |n: usize| n.max(min_len);
        let r = rows;
        let hd = cfg.num_attention_heads * cfg.head_dim;
        let iq = cfg.index_n_heads * cfg.index_head_dim;
        let lora = cfg.o_groups * cfg.o_lora_rank;
        Ok(AttnActs {
            xq: s.alloc_zeros(len(r * cfg.hidden_size))?,
            qr_f32: s.alloc_zeros(len(r * cfg.q_lora_rank))?,
            kv_f32: s.alloc_zeros(len(r * cfg.head_dim))?,
            qr: s.alloc_zeros(len(r * cfg.q_lora_rank))?,
            q_f32: s.alloc_zeros(len(r * hd))?,
            q: s.alloc_zeros(len(r * hd))?,
            proj: s.alloc_zeros(len(r * lin_max(cfg)))?,
            iq_f32: s.alloc_zeros(len(r * iq))?,
            iq: s.alloc_zeros(len(r * iq))?,
            sel: s.alloc_zeros(len(r * cfg.index_topk.max(1)))?,
            o: s.alloc_zeros(len(r * hd))?,
            u_f32: s.alloc_zeros(len(r * lora))?,
            u: s.alloc_zeros(len(r * lora))?,
        })
    }
}
