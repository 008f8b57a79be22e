//! Device weights of one attention block (spec §2.4-2.6, §4.4): FP8 linears kept as stored (e4m3 bytes +
//! UE8M0 128x128 scales, read directly by `fp8_gemv`), `wo_a` split per output group, the bf16 linears
//! (compressor wkv/wgate, indexer compressor, weights_proj) stacked into one matrix so one GEMV serves them
//! all, norms/ape/sink as f32.
use super::error::{ensure, GpuError};
use super::rope::rope_freqs;
use super::stack::{stack_compressors, AttnWeightSource};
use crate::model::checkpoint::{Checkpoint, Dtype};
use crate::model::{AttentionKind, ModelConfig};
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{bf16, GemvWeights, GpuContext};
use std::sync::Arc;

/// A `[n, k]` linear as the checkpoint stores it (`wt`): FP8 e4m3 bytes with `[ceil(n/128), ceil(k/128)]`
/// UE8M0 scales, or bf16 values (as their little-endian bytes) with a 1-byte placeholder `scale` that the
/// bf16 GEMV never reads.
pub struct Fp8Linear {
    pub w: CudaSlice<u8>,
    pub scale: CudaSlice<u8>,
    pub n: usize,
    pub k: usize,
    pub wt: GemvWeights,
}

impl Fp8Linear {
    /// Whether the official numerics quantise this linear's input (FP8 act_quant): only for FP8-stored
    /// weights (the official `linear` dispatches on the weight dtype; golden README, "Official numerics").
    pub fn act_quant(&self) -> bool {
        self.wt == GemvWeights::Fp8
    }
}

/// One KV compressor: gate bias, norm, and where its κ/γ columns sit in the stacked bf16 projection.
pub struct CompressorDev {
    pub ape: CudaSlice<f32>,
    pub norm: CudaSlice<f32>,
    pub ratio: usize,
    pub overlap: bool,
    /// Output width `d_c`.
    pub dim: usize,
    pub kv_off: usize,
    pub gate_off: usize,
}

impl CompressorDev {
    /// κ (and γ) width: `2·d_c` with overlap.
    pub fn width(&self) -> usize {
        if self.overlap {
            2 * self.dim
        } else {
            self.dim
        }
    }
}

pub struct IndexerDev {
    pub wq_b: Fp8Linear,
    pub comp: CompressorDev,
    /// Column of `weights_proj` in the stacked bf16 projection.
    pub wts_off: usize,
}

/// Device weights of attention block `layer` (`layer == num_hidden_layers` is the MTP block).
pub struct AttnLayer {
    pub layer: usize,
    /// The model config (dims of every kernel launch).
    pub cfg: ModelConfig,
    pub kind: AttentionKind,
    pub wq_a: Fp8Linear,
    pub wq_b: Fp8Linear,
    pub wkv: Fp8Linear,
    /// One `[o_lora_rank, heads·head_dim/o_groups]` weight per group; run without activation quant.
    pub wo_a: Vec<Fp8Linear>,
    pub wo_b: Fp8Linear,
    pub q_norm: CudaSlice<f32>,
    pub kv_norm: CudaSlice<f32>,
    pub sink: CudaSlice<f32>,
    pub freqs: CudaSlice<f32>,
    /// Stacked bf16 linears `[lin_rows, hidden]` (compressors, weights_proj); None on window-only blocks.
    pub lin: Option<CudaSlice<bf16>>,
    pub lin_rows: usize,
    pub comp: Option<CompressorDev>,
    pub index: Option<IndexerDev>,
}

struct Loader<'a> {
    stream: &'a Arc<CudaStream>,
    ck: &'a Checkpoint,
}

impl Loader<'_> {
    /// `wo_a` `[G·L, K]` as G weights `[L, K]`, each with its own scale rows (FP8) or none (bf16).
    fn fp8_groups(&self, prefix: &str, groups: usize) -> Result<Vec<Fp8Linear>, GpuError> {
        let name = format!("{prefix}.weight");
        let w = self.ck.raw(&name)?;
        let wt = linear_format(self.ck, &name, w.dtype)?;
        ensure(w.shape.len() == 2 && w.shape[0] % groups == 0, || {
            format!("`{name}` is {} {:?}", w.dtype, w.shape)
        })?;
        let (n, k) = (w.shape[0], w.shape[1]);
        let (l, esize) = (n / groups, w.dtype.size());
        let fp8 = wt == GemvWeights::Fp8;
        let s = if fp8 {
            Some(self.ck.raw(&format!("{prefix}.scale"))?)
        } else {
            None
        };
        let kb = k.div_ceil(128);
        ensure(
            s.is_none_or(|s| s.bytes.len() == n.div_ceil(128) * kb),
            || format!("`{prefix}.scale` size"),
        )?;
        (0..groups)
            .map(|g| {
                let scale = match &s {
                    Some(s) => group_scales(s.bytes, g * l, l, kb).ok_or_else(|| {
                        GpuError::Unsupported(format!(
                            "`{prefix}`: group rows straddle scale blocks"
                        ))
                    })?,
                    None => vec![0u8],
                };
                let rows = g * l * k * esize..(g + 1) * l * k * esize;
                Ok(Fp8Linear {
                    w: self.stream.clone_htod(&w.bytes[rows])?,
                    scale: self.stream.clone_htod(&scale)?,
                    n: l,
                    k,
                    wt,
                })
            })
            .collect()
    }
}

impl AttnWeightSource for Loader<'_> {
    type Error = GpuError;

    /// Exact: a bf16-stored tensor loaded as f32 and rounded back.
    fn bf16_rows(&mut self, name: &str, into: &mut Vec<bf16>) -> Result<usize, GpuError> {
        let t = self.ck.load_f32(name)?;
        into.extend(t.data.iter().map(|&v| bf16::from_f32(v)));
        Ok(t.shape.first().copied().unwrap_or(0))
    }

    fn f32(&mut self, name: &str) -> Result<CudaSlice<f32>, GpuError> {
        Ok(self.stream.clone_htod(&self.ck.load_f32(name)?.data)?)
    }

    fn fp8(&mut self, prefix: &str) -> Result<Fp8Linear, GpuError> {
        upload_linear(self.stream, self.ck, prefix)
    }
}

/// The GEMV format of a stored linear weight: FP8 e4m3 or BF16; anything else is refused naming the tensor.
fn linear_format(ck: &Checkpoint, name: &str, dtype: Dtype) -> Result<GemvWeights, GpuError> {
    match dtype {
        Dtype::F8_E4M3 => Ok(GemvWeights::Fp8),
        Dtype::BF16 => Ok(GemvWeights::Bf16),
        other => Err(GpuError::Unsupported(format!(
            "{}: `{name}` is {other}: the GPU runs FP8 e4m3 (UE8M0 128x128 scales) or BF16 linears",
            ck.dir().display()
        ))),
    }
}

/// Uploads linear `{prefix}.weight` as stored: FP8 with its `{prefix}.scale`, or BF16 (no scale).
pub(crate) fn upload_linear(
    stream: &Arc<CudaStream>,
    ck: &Checkpoint,
    prefix: &str,
) -> Result<Fp8Linear, GpuError> {
    let name = format!("{prefix}.weight");
    let w = ck.raw(&name)?;
    let wt = linear_format(ck, &name, w.dtype)?;
    ensure(w.shape.len() == 2, || {
        format!("`{name}` is {} {:?}: not 2-d", w.dtype, w.shape)
    })?;
    let (n, k) = (w.shape[0], w.shape[1]);
    let scale = if wt == GemvWeights::Fp8 {
        let s = ck.raw(&format!("{prefix}.scale"))?;
        ensure(
            s.dtype == Dtype::F8_E8M0 && s.bytes.len() == n.div_ceil(128) * k.div_ceil(128),
            || {
                format!(
                    "`{prefix}.scale`: expected UE8M0 [{}, {}]",
                    n.div_ceil(128),
                    k.div_ceil(128)
                )
            },
        )?;
        stream.clone_htod(s.bytes)?
    } else {
        stream.alloc_zeros::<u8>(1)?
    };
    Ok(Fp8Linear {
        w: stream.clone_htod(w.bytes)?,
        scale,
        n,
        k,
        wt,
    })
}

/// The scale rows of weight rows `[r0, r0 + l)` as a standalone `[ceil(l/128), kb]` table, or None when a
/// 128-row block of the group would need two different source scale rows.
fn group_scales(scale: &[u8], r0: usize, l: usize, kb: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(l.div_ceil(128) * kb);
    for b in 0..l.div_ceil(128) {
        let first = (r0 + b * 128) / 128;
        let last = (r0 + ((b + 1) * 128).min(l) - 1) / 128;
        if first != last {
            return None;
        }
        out.extend_from_slice(scale.get(first * kb..(first + 1) * kb)?);
    }
    Some(out)
}

impl AttnLayer {
    pub fn from_checkpoint(
        ctx: &GpuContext,
        ck: &Checkpoint,
        layer: usize,
    ) -> Result<Self, GpuError> {
        let cfg = ck.config();
        ensure(layer < cfg.num_blocks(), || {
            format!("layer {layer} out of range")
        })?;
        let mut ld = Loader {
            stream: &ctx.stream,
            ck,
        };
        let p = format!("{}attn.", cfg.block_prefix(layer));
        let kind = cfg.attention_kind(layer);
        let st = stack_compressors(&mut ld, &p, kind, cfg)?;
        let layer = AttnLayer {
            layer,
            cfg: cfg.clone(),
            kind,
            wq_a: ld.fp8(&format!("{p}wq_a"))?,
            wq_b: ld.fp8(&format!("{p}wq_b"))?,
            wkv: ld.fp8(&format!("{p}wkv"))?,
            wo_a: ld.fp8_groups(&format!("{p}wo_a"), cfg.o_groups)?,
            wo_b: ld.fp8(&format!("{p}wo_b"))?,
            q_norm: ld.f32(&format!("{p}q_norm.weight"))?,
            kv_norm: ld.f32(&format!("{p}kv_norm.weight"))?,
            sink: ld.f32(&format!("{p}attn_sink"))?,
            freqs: ctx.stream.clone_htod(&rope_freqs(cfg, layer))?,
            lin: st.upload(&ctx.stream)?,
            lin_rows: st.rows,
            comp: st.comp,
            index: st.index,
        };
        layer.check_dims(cfg)?;
        Ok(layer)
    }

    /// Every weight's shape against the config (a mismatch would make the kernels read out of bounds).
    pub(crate) fn check_dims(&self, cfg: &ModelConfig) -> Result<(), GpuError> {
        let (d, h) = (cfg.hidden_size, cfg.num_attention_heads);
        let hd = h * cfg.head_dim;
        let mut want = vec![
            ("wq_a", &self.wq_a, cfg.q_lora_rank, d),
            ("wq_b", &self.wq_b, hd, cfg.q_lora_rank),
            ("wkv", &self.wkv, cfg.head_dim, d),
            ("wo_b", &self.wo_b, d, cfg.o_groups * cfg.o_lora_rank),
        ];
        for g in &self.wo_a {
            want.push(("wo_a", g, cfg.o_lora_rank, hd / cfg.o_groups));
        }
        if let Some(i) = &self.index {
            want.push((
                "indexer.wq_b",
                &i.wq_b,
                cfg.index_n_heads * cfg.index_head_dim,
                cfg.q_lora_rank,
            ));
        }
        // Matrices that share one grouped GEMV launch must share its weight format.
        let mut launches = vec![("wq_a and wkv", vec![&self.wq_a, &self.wkv])];
        launches.push(("the wo_a groups", self.wo_a.iter().collect()));
        if let Some(i) = &self.index {
            launches.push(("wq_b and indexer.wq_b", vec![&self.wq_b, &i.wq_b]));
        }
        for (what, ls) in launches {
            ensure(ls.iter().all(|l| l.wt == ls[0].wt), || {
                format!(
                    "layer {}: {what} are stored in different formats (one GEMV launch reads them together)",
                    self.layer
                )
            })?;
        }
        for (name, w, n, k) in want {
            ensure(w.n == n && w.k == k && k % 16 == 0, || {
                format!(
                    "layer {}: {name} is [{}, {}], expected [{n}, {k}] with K % 16 == 0",
                    self.layer, w.n, w.k
                )
            })?;
        }
        ensure(
            self.lin
                .as_ref()
                .is_none_or(|l| l.len() == self.lin_rows * d)
                && d % 8 == 0,
            || format!("layer {}: stacked bf16 linears", self.layer),
        )
    }

    /// Device bytes of every weight of the block.
    pub fn weight_bytes(&self) -> u64 {
        let fp8 = |l: &Fp8Linear| (l.w.len() + l.scale.len()) as u64;
        let f32s = |s: &CudaSlice<f32>| 4 * s.len() as u64;
        let comp = |c: &CompressorDev| f32s(&c.ape) + f32s(&c.norm);
        fp8(&self.wq_a)
            + fp8(&self.wq_b)
            + fp8(&self.wkv)
            + fp8(&self.wo_b)
            + self.wo_a.iter().map(fp8).sum::<u64>()
            + f32s(&self.q_norm)
            + f32s(&self.kv_norm)
            + f32s(&self.sink)
            + f32s(&self.freqs)
            + self.lin.as_ref().map_or(0, |l| 2 * l.len() as u64)
            + self.comp.as_ref().map_or(0, comp)
            + self
                .index
                .as_ref()
                .map_or(0, |i| fp8(&i.wq_b) + comp(&i.comp))
    }
}
