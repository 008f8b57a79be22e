//! Device weights: per block the mHC mixers, norms, the attention layer and the MoE (gate, router
//! tables, FP4 routed-expert bank, FP8 shared expert); globally the embedding, HC head, final norm and
//! head. Loaded from an FP8/FP4 checkpoint's stored bytes (no dequantised copies), or generated on the
//! device (see `synth.rs`).

use super::attention::AttnLayer;
use super::RunnerError;
use crate::model::checkpoint::{scale_name, Checkpoint, Dtype};
use crate::model::{ExpertFormat, LinearFormat, ModelConfig};
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{bf16, GpuContext, HC_STREAMS};
use std::sync::Arc;

/// mHC mixer: `func` f32 [M, n·D], `base` f32 [M], `scale` f32 [3] (head: [1]).
pub struct HcDev {
    pub func: CudaSlice<f32>,
    pub base: CudaSlice<f32>,
    pub scale: CudaSlice<f32>,
}

/// An FP8 `[out, inp]` linear: e4m3 bytes and UE8M0 128x128 block scales, as stored.
pub struct Fp8Linear {
    pub w: CudaSlice<u8>,
    pub scale: CudaSlice<u8>,
    pub out: usize,
    pub inp: usize,
}

/// The routed experts of one MoE layer (or of several, when a full-size synthetic model shares banks):
/// FP4 `w1`, `w3` [E, I, D/2] and `w2` [E, D, I/2] with per-32 UE8M0 scales.
pub struct ExpertBank {
    pub w1: CudaSlice<u8>,
    pub s1: CudaSlice<u8>,
    pub w3: CudaSlice<u8>,
    pub s3: CudaSlice<u8>,
    pub w2: CudaSlice<u8>,
    pub s2: CudaSlice<u8>,
}

impl ExpertBank {
    /// Bytes one bank occupies for `cfg`.
    pub fn bytes_for(cfg: &ModelConfig) -> usize {
        let (e, d, i) = (
            cfg.n_routed_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
        );
        e * 3 * (d * i / 2 + d * i / 32)
    }
    /// Bytes of one expert's three matrices (what a selected expert costs to read).
    pub fn expert_bytes(cfg: &ModelConfig) -> usize {
        Self::bytes_for(cfg) / cfg.n_routed_experts
    }
}

pub struct MoeDev {
    /// bf16 [E, D], applied in f32.
    pub gate: CudaSlice<bf16>,
    pub bias: Option<CudaSlice<f32>>,
    /// i32 [vocab, topk] for hash-routed layers.
    pub tid2eid: Option<CudaSlice<i32>>,
    pub bank: Arc<ExpertBank>,
    /// Shared expert w1, w3, w2.
    pub shared: [Fp8Linear; 3],
}

pub struct BlockDev {
    pub hc_attn: HcDev,
    pub hc_ffn: HcDev,
    pub attn_norm: CudaSlice<f32>,
    pub ffn_norm: CudaSlice<f32>,
    pub attn: AttnLayer,
    pub moe: MoeDev,
}

/// How many distinct expert banks a model holds and which bank each layer uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BankPlan {
    pub banks: usize,
    /// `bank_of[layer]`.
    pub bank_of: Vec<usize>,
}

impl BankPlan {
    /// One bank per layer.
    pub fn distinct(layers: usize) -> Self {
        BankPlan {
            banks: layers,
            bank_of: (0..layers).collect(),
        }
    }
    /// `banks` banks spread over `layers` layers (layer l uses bank l mod banks).
    pub fn shared(layers: usize, banks: usize) -> Self {
        let banks = banks.clamp(1, layers.max(1));
        BankPlan {
            banks,
            bank_of: (0..layers).map(|l| l % banks).collect(),
        }
    }
    /// Layers that reuse another layer's bank.
    pub fn sharings(&self) -> usize {
        self.bank_of.len().saturating_sub(self.banks)
    }
}

pub struct ModelWeightsDev {
    /// bf16 [vocab, D].
    pub embed: CudaSlice<bf16>,
    /// bf16 [vocab, D].
    pub head: CudaSlice<bf16>,
    pub norm: CudaSlice<f32>,
    pub hc_head: HcDev,
    pub blocks: Vec<BlockDev>,
    pub banks: BankPlan,
}

impl ModelWeightsDev {
    /// Bytes of every weight on the device (shared banks counted once).
    pub fn bytes(&self, cfg: &ModelConfig) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| b.attn.weight_bytes() as usize + block_dense_bytes(b))
            .sum();
        blocks + self.banks.banks * ExpertBank::bytes_for(cfg) + 2 * self.embed.num_bytes()
    }
}

/// Bytes of a block's non-attention, non-routed weights.
pub fn block_dense_bytes(b: &BlockDev) -> usize {
    let hc = |h: &HcDev| h.func.num_bytes() + h.base.num_bytes() + h.scale.num_bytes();
    let lin = |l: &Fp8Linear| l.w.num_bytes() + l.scale.num_bytes();
    hc(&b.hc_attn)
        + hc(&b.hc_ffn)
        + b.moe.gate.num_bytes()
        + b.moe.shared.iter().map(lin).sum::<usize>()
}

/// Checks what the GPU runner supports; the reason names the offending property.
pub fn check_supported(cfg: &ModelConfig) -> Result<(), RunnerError> {
    let bad = |m: String| Err(RunnerError::Unsupported(m));
    if cfg.hc_mult != HC_STREAMS {
        return bad(format!(
            "hc_mult {} (kernels are written for 4)",
            cfg.hc_mult
        ));
    }
    if cfg.linear_format != (LinearFormat::Fp8 { block: 128 }) {
        return bad(
            "linears must be FP8 with 128x128 scales (BF16 checkpoints run on the CPU)".into(),
        );
    }
    if cfg.expert_format != ExpertFormat::Fp4 {
        return bad("routed experts must be FP4".into());
    }
    let (d, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    if d % 32 != 0 || i % 32 != 0 || cfg.n_routed_experts > 1024 || cfg.num_experts_per_tok > 16 {
        return bad(format!(
            "hidden {d} and moe_intermediate {i} must be multiples of 32, E <= 1024, top-k <= 16"
        ));
    }
    Ok(())
}

/// Uploads host data into a new device buffer.
pub fn upload<T: dsv4_kernels::cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    data: &[T],
) -> Result<CudaSlice<T>, RunnerError> {
    Ok(stream.clone_htod(data)?)
}

/// Stored bytes of `name`, checked to be of `dtype`.
pub fn raw_bytes<'a>(
    ck: &'a Checkpoint,
    name: &str,
    dtype: Dtype,
) -> Result<&'a [u8], RunnerError> {
    let t = ck.raw(name)?;
    if t.dtype != dtype {
        return Err(RunnerError::Unsupported(format!(
            "tensor {name} is {:?}, the GPU runner needs {:?}",
            t.dtype, dtype
        )));
    }
    Ok(t.bytes)
}

pub fn load_fp8(ctx: &GpuContext, ck: &Checkpoint, prefix: &str) -> Result<Fp8Linear, RunnerError> {
    let name = format!("{prefix}.weight");
    let t = ck.raw(&name)?;
    let (out, inp) = match t.shape {
        [o, i] => (*o, *i),
        _ => return Err(RunnerError::Unsupported(format!("{name}: not 2-d"))),
    };
    let w = upload(&ctx.stream, raw_bytes(ck, &name, Dtype::F8_E4M3)?)?;
    let scale = upload(
        &ctx.stream,
        raw_bytes(ck, &scale_name(&name), Dtype::F8_E8M0)?,
    )?;
    Ok(Fp8Linear { w, scale, out, inp })
}
