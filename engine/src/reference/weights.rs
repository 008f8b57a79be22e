//! The model's weights as dequantised f32 arrays, loaded by checkpoint name from any
//! [`TensorSource`]: the whole checkpoint, or (for a split model) one rank's loaded shares,
//! where a split tensor comes back as the rank's rows/columns only.

use super::ops::{matmul_t, rmsnorm_rows};
use super::quant::fake_quant_fp8;
use crate::api::Numerics;
use crate::model::checkpoint::{Checkpoint, CheckpointError, DenseTensor};
use crate::model::{AttentionKind, ModelConfig};

/// Block width of the FP8 activation quantisation feeding FP8/FP4 GEMMs.
pub const ACT_QUANT_BLOCK: usize = 128;

/// A `[out, in]` weight (PyTorch `Linear` convention).
#[derive(Debug, Clone)]
pub struct Linear {
    pub w: Vec<f32>,
    pub out: usize,
    pub inp: usize,
    /// Stored as FP8/FP4: the official runtime quantises the activation feeding it.
    pub act_quant: bool,
}

impl Linear {
    /// `y = x · wᵀ` for `x` of shape `[rows, inp]`.
    pub fn forward(&self, x: &[f32], numerics: Numerics) -> Vec<f32> {
        if numerics == Numerics::Official && self.act_quant {
            let mut xq = x.to_vec();
            xq.chunks_mut(self.inp)
                .for_each(|row| fake_quant_fp8(row, ACT_QUANT_BLOCK));
            matmul_t(&xq, &self.w, self.inp, self.out)
        } else {
            matmul_t(x, &self.w, self.inp, self.out)
        }
    }

    /// Rows `[start, start + len)` of the weight as their own linear map.
    pub fn rows(&self, start: usize, len: usize) -> Linear {
        Linear {
            w: self.w[start * self.inp..(start + len) * self.inp].to_vec(),
            out: len,
            inp: self.inp,
            act_quant: self.act_quant,
        }
    }
}

/// mHC mixer parameters (`fn [mix, n·D]`, `base [mix]`, `scale [3]` or `[1]` for the head).
#[derive(Debug, Clone)]
pub struct HcParams {
    pub func: Vec<f32>,
    pub base: Vec<f32>,
    pub scale: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct CompressorWeights {
    pub wkv: Linear,
    pub wgate: Linear,
    /// `[ratio, c·dim]`: learned gate bias per position in the window.
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
    pub ratio: usize,
    /// Output width `d_c`.
    pub dim: usize,
    /// CSA-style overlapping windows (`c = 2`).
    pub overlap: bool,
}

#[derive(Debug, Clone)]
pub struct IndexerWeights {
    pub wq_b: Linear,
    pub weights_proj: Linear,
    pub compressor: CompressorWeights,
}

#[derive(Debug, Clone)]
pub struct AttentionWeights {
    pub wq_a: Linear,
    pub q_norm: Vec<f32>,
    pub wq_b: Linear,
    pub wkv: Linear,
    pub kv_norm: Vec<f32>,
    /// One linear map per output group.
    pub wo_a: Vec<Linear>,
    pub wo_b: Linear,
    pub sink: Vec<f32>,
    pub compressor: Option<CompressorWeights>,
    pub indexer: Option<IndexerWeights>,
}

#[derive(Debug, Clone)]
pub struct ExpertWeights {
    pub w1: Linear,
    pub w2: Linear,
    pub w3: Linear,
}

#[derive(Debug, Clone)]
pub struct MoeWeights {
    pub gate: Linear,
    pub bias: Option<Vec<f32>>,
    /// `[vocab, top_k]` expert ids of hash-routed layers.
    pub tid2eid: Option<Vec<u32>>,
    pub experts: Vec<ExpertWeights>,
    pub shared: ExpertWeights,
}

#[derive(Debug, Clone)]
pub struct BlockWeights {
    pub hc_attn: HcParams,
    pub hc_ffn: HcParams,
    pub attn_norm: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub attn: AttentionWeights,
    pub moe: MoeWeights,
}

/// The MTP block's input projections and its own head side (the vocabulary head is shared).
#[derive(Debug, Clone)]
pub struct MtpHead {
    pub e_proj: Linear,
    pub h_proj: Linear,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    pub norm: Vec<f32>,
    pub hc_head: HcParams,
}

impl MtpHead {
    /// The MTP block's input streams `[T, n, D]`: `h_proj(hnorm(X_t)) + e_proj(enorm(e))` for
    /// final streams `streams` `[T, n, D]` and the next tokens' embedding rows `embed` `[T, D]`.
    pub fn input(
        &self,
        cfg: &ModelConfig,
        embed: &[f32],
        streams: &[f32],
        numerics: Numerics,
    ) -> Vec<f32> {
        let (d, n) = (cfg.hidden_size, cfg.hc_mult);
        let mut e = embed.to_vec();
        rmsnorm_rows(&mut e, &self.enorm, cfg.rms_norm_eps);
        let mut h = streams.to_vec();
        rmsnorm_rows(&mut h, &self.hnorm, cfg.rms_norm_eps);
        let ep = self.e_proj.forward(&e, numerics);
        let mut x = self.h_proj.forward(&h, numerics);
        for (chunk, e) in x.chunks_mut(n * d).zip(ep.chunks(d)) {
            for stream in chunk.chunks_mut(d) {
                stream.iter_mut().zip(e).for_each(|(v, e)| *v += e);
            }
        }
        x
    }
}

#[derive(Debug, Clone)]
pub struct MtpWeights {
    pub head: MtpHead,
    pub block: BlockWeights,
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// `[vocab, D]`
    pub embed: Vec<f32>,
    pub head: Linear,
    pub norm: Vec<f32>,
    pub hc_head: HcParams,
    pub blocks: Vec<BlockWeights>,
    pub mtp: Option<MtpWeights>,
}

/// Where the weights come from, by checkpoint name.
pub trait TensorSource {
    /// The tensor dequantised to f32 (`stored` says how it was stored on disk).
    fn f32(&self, name: &str) -> Result<DenseTensor, CheckpointError>;
    /// An integer tensor (the hash-routing `tid2eid`) as (shape, values).
    fn i64(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>), CheckpointError>;
}

impl TensorSource for Checkpoint {
    fn f32(&self, name: &str) -> Result<DenseTensor, CheckpointError> {
        self.load_f32(name)
    }

    fn i64(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>), CheckpointError> {
        self.load_i64(name)
    }
}

/// Builds the weight structs from a source. Public so that a split model can assemble a
/// rank's blocks from the same pieces (it replaces only the split tensors).
pub struct Loader<'a, S: ?Sized> {
    pub src: &'a S,
}

impl<S: TensorSource + ?Sized> Loader<'_, S> {
    pub fn vec(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        Ok(self.src.f32(name)?.data)
    }

    pub fn linear(&self, prefix: &str) -> Result<Linear, CheckpointError> {
        let t = self.src.f32(&format!("{prefix}.weight"))?;
        let (out, inp) = match t.shape.as_slice() {
            [o, i] => (*o, *i),
            _ => {
                return Err(CheckpointError::Tensor {
                    file: "<dequantised>".into(),
                    tensor: format!("{prefix}.weight"),
                    message: format!("expected a 2-d weight, found shape {:?}", t.shape),
                })
            }
        };
        Ok(Linear {
            w: t.data,
            out,
            inp,
            act_quant: t.stored.is_quantized(),
        })
    }

    /// A weight the official runtime keeps in high precision whatever its storage.
    pub fn linear_plain(&self, prefix: &str) -> Result<Linear, CheckpointError> {
        let mut l = self.linear(prefix)?;
        l.act_quant = false;
        Ok(l)
    }

    pub fn hc(&self, prefix: &str) -> Result<HcParams, CheckpointError> {
        Ok(HcParams {
            func: self.vec(&format!("{prefix}_fn"))?,
            base: self.vec(&format!("{prefix}_base"))?,
            scale: self.vec(&format!("{prefix}_scale"))?,
        })
    }

    pub fn expert(&self, prefix: &str) -> Result<ExpertWeights, CheckpointError> {
        Ok(ExpertWeights {
            w1: self.linear(&format!("{prefix}.w1"))?,
            w2: self.linear(&format!("{prefix}.w2"))?,
            w3: self.linear(&format!("{prefix}.w3"))?,
        })
    }

    pub fn compressor(
        &self,
        p: &str,
        ratio: usize,
        dim: usize,
    ) -> Result<CompressorWeights, CheckpointError> {
        Ok(CompressorWeights {
            wkv: self.linear_plain(&format!("{p}.wkv"))?,
            wgate: self.linear_plain(&format!("{p}.wgate"))?,
            ape: self.vec(&format!("{p}.ape"))?,
            norm: self.vec(&format!("{p}.norm.weight"))?,
            ratio,
            dim,
            overlap: ratio == crate::model::CSA_RATIO,
        })
    }

    pub fn attention(
        &self,
        cfg: &ModelConfig,
        layer: usize,
        p: &str,
    ) -> Result<AttentionWeights, CheckpointError> {
        // wo_a is dequantised at conversion time and run in high precision (spec §4.4).
        let wo_a = self.linear_plain(&format!("{p}wo_a"))?;
        let groups = (0..cfg.o_groups)
            .map(|g| wo_a.rows(g * cfg.o_lora_rank, cfg.o_lora_rank))
            .collect();
        let wo_b = self.linear(&format!("{p}wo_b"))?;
        self.attention_with(cfg, layer, p, groups, wo_b)
    }

    /// The attention with the output projection given by the caller (a split model's rank
    /// holds only its share of it, in another layout).
    pub fn attention_with(
        &self,
        cfg: &ModelConfig,
        layer: usize,
        p: &str,
        wo_a: Vec<Linear>,
        wo_b: Linear,
    ) -> Result<AttentionWeights, CheckpointError> {
        let kind = cfg.attention_kind(layer);
        let compressor = match kind {
            AttentionKind::Window => None,
            k => Some(self.compressor(&format!("{p}compressor"), k.ratio(), cfg.head_dim)?),
        };
        let indexer = match kind {
            AttentionKind::Csa { ratio } => Some(IndexerWeights {
                wq_b: self.linear(&format!("{p}indexer.wq_b"))?,
                weights_proj: self.linear_plain(&format!("{p}indexer.weights_proj"))?,
                compressor: self.compressor(
                    &format!("{p}indexer.compressor"),
                    ratio,
                    cfg.index_head_dim,
                )?,
            }),
            _ => None,
        };
        Ok(AttentionWeights {
            wq_a: self.linear(&format!("{p}wq_a"))?,
            q_norm: self.vec(&format!("{p}q_norm.weight"))?,
            wq_b: self.linear(&format!("{p}wq_b"))?,
            wkv: self.linear(&format!("{p}wkv"))?,
            kv_norm: self.vec(&format!("{p}kv_norm.weight"))?,
            wo_a,
            wo_b,
            sink: self.vec(&format!("{p}attn_sink"))?,
            compressor,
            indexer,
        })
    }

    pub fn moe(
        &self,
        cfg: &ModelConfig,
        layer: usize,
        p: &str,
    ) -> Result<MoeWeights, CheckpointError> {
        let experts = (0..cfg.n_routed_experts)
            .map(|e| self.expert(&format!("{p}experts.{e}")))
            .collect::<Result<_, _>>()?;
        let shared = self.expert(&format!("{p}shared_experts"))?;
        self.moe_with(cfg, layer, p, experts, shared)
    }

    /// The MoE with the experts given by the caller (a split model's rank holds only some).
    pub fn moe_with(
        &self,
        cfg: &ModelConfig,
        layer: usize,
        p: &str,
        experts: Vec<ExpertWeights>,
        shared: ExpertWeights,
    ) -> Result<MoeWeights, CheckpointError> {
        let hash = cfg.is_hash_layer(layer);
        let tid2eid = if hash {
            let (_, ids) = self.src.i64(&format!("{p}gate.tid2eid"))?;
            Some(ids.into_iter().map(|e| e as u32).collect())
        } else {
            None
        };
        let bias = if hash {
            None
        } else {
            Some(self.vec(&format!("{p}gate.bias"))?)
        };
        Ok(MoeWeights {
            gate: self.linear_plain(&format!("{p}gate"))?,
            bias,
            tid2eid,
            experts,
            shared,
        })
    }

    pub fn block(&self, cfg: &ModelConfig, layer: usize) -> Result<BlockWeights, CheckpointError> {
        let p = cfg.block_prefix(layer);
        Ok(BlockWeights {
            hc_attn: self.hc(&format!("{p}hc_attn"))?,
            hc_ffn: self.hc(&format!("{p}hc_ffn"))?,
            attn_norm: self.vec(&format!("{p}attn_norm.weight"))?,
            ffn_norm: self.vec(&format!("{p}ffn_norm.weight"))?,
            attn: self.attention(cfg, layer, &format!("{p}attn."))?,
            moe: self.moe(cfg, layer, &format!("{p}ffn."))?,
        })
    }

    pub fn mtp(&self, cfg: &ModelConfig) -> Result<MtpWeights, CheckpointError> {
        Ok(MtpWeights {
            head: self.mtp_head(cfg)?,
            block: self.block(cfg, cfg.num_hidden_layers)?,
        })
    }

    pub fn mtp_head(&self, cfg: &ModelConfig) -> Result<MtpHead, CheckpointError> {
        let p = cfg.block_prefix(cfg.num_hidden_layers);
        Ok(MtpHead {
            e_proj: self.linear(&format!("{p}e_proj"))?,
            h_proj: self.linear(&format!("{p}h_proj"))?,
            enorm: self.vec(&format!("{p}enorm.weight"))?,
            hnorm: self.vec(&format!("{p}hnorm.weight"))?,
            norm: self.vec(&format!("{p}norm.weight"))?,
            hc_head: self.hc(&format!("{p}hc_head"))?,
        })
    }
}

impl ModelWeights {
    /// Loads and dequantises every weight of the checkpoint.
    pub fn load(ck: &Checkpoint) -> Result<Self, CheckpointError> {
        Self::from_source(ck.config(), ck)
    }

    /// Builds every weight of `cfg` from `src`.
    pub fn from_source<S: TensorSource + ?Sized>(
        cfg: &ModelConfig,
        src: &S,
    ) -> Result<Self, CheckpointError> {
        let l = Loader { src };
        let blocks = (0..cfg.num_hidden_layers)
            .map(|layer| l.block(cfg, layer))
            .collect::<Result<_, _>>()?;
        Ok(ModelWeights {
            embed: l.vec("embed.weight")?,
            head: l.linear_plain("head")?,
            norm: l.vec("norm.weight")?,
            hc_head: l.hc("hc_head")?,
            blocks,
            mtp: if cfg.has_mtp() {
                Some(l.mtp(cfg)?)
            } else {
                None
            },
        })
    }
}
