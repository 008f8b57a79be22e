//! Random attention weights of the configured dims, generated on the device (no host copies of GBs), for
//! benchmarks at the real size. Values are sane rather than meaningful: FP8 codes of magnitude 2^-3..2^3
//! with a scale of about K^-1/2, bf16 weights uniform in ±K^-1/2, unit norms, zero ape and sink.
use super::dptr_mut;
use super::error::{ensure, GpuError};
use super::layer::{AttnLayer, CompressorDev, Fp8Linear, IndexerDev};
use super::rope::rope_freqs;
use crate::model::{AttentionKind, ModelConfig, CSA_RATIO};
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, GemvWeights, GpuContext};

const KIND_E4M3: i32 = 0;
const KIND_BYTE: i32 = 1;
const KIND_BF16: i32 = 2;
const KIND_F32_CONST: i32 = 3;

struct Synth<'a> {
    ctx: &'a GpuContext,
    seed: u64,
}

impl Synth<'_> {
    fn next_seed(&mut self) -> u64 {
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.seed
    }

    fn fill<
        T: dsv4_kernels::cudarc::driver::DeviceRepr + dsv4_kernels::cudarc::driver::ValidAsZeroBits,
    >(
        &mut self,
        n: usize,
        kind: i32,
        amp: f32,
    ) -> Result<CudaSlice<T>, GpuError> {
        let s = &self.ctx.stream;
        let mut buf = s.alloc_zeros::<T>(n.max(1))?;
        let seed = self.next_seed();
        // SAFETY: buf holds n elements of T, the element type of `kind` (u8 / bf16 / f32 by the callers).
        unsafe {
            self.ctx
                .launch_attn_synth(s, dptr_mut(&mut buf, s), n, kind, seed, amp)
        }?;
        Ok(buf)
    }

    fn fp8(&mut self, n: usize, k: usize) -> Result<Fp8Linear, GpuError> {
        // e4m3 codes have magnitude ~1: a scale of 2^-ceil(log2 sqrt K) keeps outputs of unit size.
        let shift = ((k as f64).sqrt().log2().ceil()) as i32;
        let byte = (127 - shift).clamp(1, 254) as f32;
        Ok(Fp8Linear {
            w: self.fill(n * k, KIND_E4M3, 0.0)?,
            scale: self.fill(n.div_ceil(128) * k.div_ceil(128), KIND_BYTE, byte)?,
            n,
            k,
            wt: GemvWeights::Fp8,
        })
    }

    fn f32_const(&mut self, n: usize, v: f32) -> Result<CudaSlice<f32>, GpuError> {
        self.fill(n, KIND_F32_CONST, v)
    }

    fn compressor(
        &mut self,
        ratio: usize,
        dim: usize,
        off: usize,
    ) -> Result<CompressorDev, GpuError> {
        let overlap = ratio == CSA_RATIO;
        let width = if overlap { 2 * dim } else { dim };
        Ok(CompressorDev {
            ape: self.f32_const(ratio * width, 0.0)?,
            norm: self.f32_const(dim, 1.0)?,
            ratio,
            overlap,
            dim,
            kv_off: off,
            gate_off: off + width,
        })
    }
}

impl AttnLayer {
    /// Random weights of block `layer`'s real dims, made on the device.
    pub fn synthetic(
        ctx: &GpuContext,
        cfg: &ModelConfig,
        layer: usize,
        seed: u64,
    ) -> Result<Self, GpuError> {
        ensure(layer < cfg.num_blocks(), || {
            format!("layer {layer} out of range")
        })?;
        let mut sy = Synth {
            ctx,
            seed: seed ^ (layer as u64).wrapping_mul(0x9e37_79b9),
        };
        let (d, h, hd) = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_attention_heads * cfg.head_dim,
        );
        let kind = cfg.attention_kind(layer);
        let mut rows = 0usize;
        let comp = match kind {
            AttentionKind::Window => None,
            k => {
                let c = sy.compressor(k.ratio(), cfg.head_dim, rows)?;
                rows += 2 * c.width();
                Some(c)
            }
        };
        let index = match kind {
            AttentionKind::Csa { ratio } => {
                let c = sy.compressor(ratio, cfg.index_head_dim, rows)?;
                rows += 2 * c.width();
                let wts_off = rows;
                rows += cfg.index_n_heads;
                Some(IndexerDev {
                    wq_b: sy.fp8(cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank)?,
                    comp: c,
                    wts_off,
                })
            }
            _ => None,
        };
        let amp = 1.0 / (d as f32).sqrt();
        let lin: Option<CudaSlice<bf16>> = if rows > 0 {
            Some(sy.fill(rows * d, KIND_BF16, amp)?)
        } else {
            None
        };
        let wo_a = (0..cfg.o_groups)
            .map(|_| sy.fp8(cfg.o_lora_rank, hd / cfg.o_groups))
            .collect::<Result<Vec<_>, _>>()?;
        let l = AttnLayer {
            layer,
            cfg: cfg.clone(),
            kind,
            wq_a: sy.fp8(cfg.q_lora_rank, d)?,
            wq_b: sy.fp8(hd, cfg.q_lora_rank)?,
            wkv: sy.fp8(cfg.head_dim, d)?,
            wo_a,
            wo_b: sy.fp8(d, cfg.o_groups * cfg.o_lora_rank)?,
            q_norm: sy.f32_const(cfg.q_lora_rank, 1.0)?,
            kv_norm: sy.f32_const(cfg.head_dim, 1.0)?,
            sink: sy.f32_const(h, 0.0)?,
            freqs: ctx.stream.clone_htod(&rope_freqs(cfg, layer))?,
            lin,
            lin_rows: rows,
            comp,
            index,
        };
        l.check_dims(cfg)?;
        Ok(l)
    }
}
