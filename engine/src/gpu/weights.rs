//! Device weights: per block the mHC mixers, norms, the attention layer and the MoE (gate, router
//! tables, routed-expert bank, shared expert); globally the embedding, HC head, final norm and head.
//! Loaded from the checkpoint's stored bytes (no dequantised copies): FP8 linears + FP4 experts, or
//! BF16 linears + BF16 experts; or generated on the device (see `synth.rs`).

use super::attention::{upload_linear, AttnLayer};
use super::RunnerError;
use crate::model::checkpoint::{Checkpoint, Dtype};
use crate::model::{ExpertFormat, LinearFormat, ModelConfig};
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{bf16, GemvWeights, GpuContext, HC_STREAMS};
use std::sync::Arc;

/// mHC mixer: `func` f32 [M, n·D], `base` f32 [M], `scale` f32 [3] (head: [1]).
pub struct HcDev {
    pub func: CudaSlice<f32>,
    pub base: CudaSlice<f32>,
    pub scale: CudaSlice<f32>,
}

/// An `[out, inp]` linear as stored (`wt`): e4m3 bytes and UE8M0 128x128 block scales, or bf16 values as
/// their bytes with a 1-byte placeholder scale (never read).
pub struct Fp8Linear {
    pub w: CudaSlice<u8>,
    pub scale: CudaSlice<u8>,
    pub out: usize,
    pub inp: usize,
    pub wt: GemvWeights,
}

/// The routed experts of one MoE layer (or of several, when a full-size synthetic model shares banks):
/// `format` Fp4: `w1`, `w3` [E, I, D/2] and `w2` [E, D, I/2] with per-32 UE8M0 scales, the weights in the
/// device layout of `cuda/fp4_layout.cu` once [`ExpertBank::into_device_layout`] ran (every constructor
/// calls it); `format` Bf16: the bf16 `w1`, `w3` [E, I, D] and `w2` [E, D, I] as their bytes, the scales
/// 1-byte placeholders.
pub struct ExpertBank {
    pub w1: CudaSlice<u8>,
    pub s1: CudaSlice<u8>,
    pub w3: CudaSlice<u8>,
    pub s3: CudaSlice<u8>,
    pub w2: CudaSlice<u8>,
    pub s2: CudaSlice<u8>,
    pub format: ExpertFormat,
}

impl ExpertBank {
    /// Rewrites freshly uploaded FP4 weights and scales (checkpoint order) into the device layouts the expert
    /// kernels read (`cuda/fp4_layout.cu`); BF16 banks are returned as they are. Call exactly once per bank.
    /// `experts` in the bank, `hidden` = w1/w3's K = w2's N, `inter` = w1/w3's N = w2's K.
    pub fn into_device_layout(
        mut self,
        ctx: &GpuContext,
        experts: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<Self, RunnerError> {
        if self.format != ExpertFormat::Fp4 {
            return Ok(self);
        }
        let s = &ctx.stream;
        for (w, n, k) in [
            (&mut self.w1, inter, hidden),
            (&mut self.w3, inter, hidden),
            (&mut self.w2, hidden, inter),
        ] {
            ctx.launch_fp4_to_device_layout(s, w, experts, n, k)?;
        }
        self.s1 = ctx.fp4_scales_to_device_layout(s, &self.s1, experts, inter, hidden)?;
        self.s3 = ctx.fp4_scales_to_device_layout(s, &self.s3, experts, inter, hidden)?;
        self.s2 = ctx.fp4_scales_to_device_layout(s, &self.s2, experts, hidden, inter)?;
        Ok(self)
    }

    /// Bytes one bank occupies for `cfg`.
    pub fn bytes_for(cfg: &ModelConfig) -> usize {
        let (e, d, i) = (
            cfg.n_routed_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
        );
        match cfg.expert_format {
            ExpertFormat::Bf16 => e * 3 * d * i * 2,
            _ => e * 3 * (d * i / 2 + d * i / 32),
        }
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
    let pair = (cfg.linear_format, cfg.expert_format);
    if pair != (LinearFormat::Fp8 { block: 128 }, ExpertFormat::Fp4)
        && pair != (LinearFormat::Bf16, ExpertFormat::Bf16)
    {
        return bad(format!(
            "linears {:?} with experts {:?}: the GPU runs FP8 linears (128x128 scales) with FP4 experts, \
             or BF16 linears with BF16 experts",
            cfg.linear_format, cfg.expert_format
        ));
    }
    let (d, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    if d % 32 != 0 || i % 32 != 0 || cfg.n_routed_experts > 1024 || cfg.num_experts_per_tok > 16 {
        return bad(format!(
            "hidden {d} and moe_intermediate {i} must be multiples of 32, E <= 1024, top-k <= 16"
        ));
    }
    Ok(())
}

/// The multi-GPU split runner loads FP8 linears and FP4 experts only.
pub fn check_quantized(cfg: &ModelConfig) -> Result<(), RunnerError> {
    if cfg.linear_format != (LinearFormat::Fp8 { block: 128 })
        || cfg.expert_format != ExpertFormat::Fp4
    {
        return Err(RunnerError::Unsupported(
            "the multi-GPU split runner needs FP8 linears and FP4 experts (BF16 checkpoints run on one GPU \
             or on the CPU)"
                .into(),
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
            "{}: tensor {name} is {:?}, the GPU runner needs {:?}",
            ck.dir().display(),
            t.dtype,
            dtype
        )));
    }
    Ok(t.bytes)
}

/// A linear as stored (FP8 with scales, or BF16), named by its prefix.
pub fn load_fp8(ctx: &GpuContext, ck: &Checkpoint, prefix: &str) -> Result<Fp8Linear, RunnerError> {
    let l = upload_linear(&ctx.stream, ck, prefix)?;
    Ok(Fp8Linear {
        w: l.w,
        scale: l.scale,
        out: l.n,
        inp: l.k,
        wt: l.wt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn golden(variant: &str) -> Option<ModelConfig> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/tiny-v4-small")
            .join(variant);
        dir.exists().then(|| {
            Checkpoint::open(&dir)
                .expect("golden checkpoint")
                .config()
                .clone()
        })
    }

    /// One GPU takes both golden variants; the split runner only the FP8/FP4 one, naming why.
    #[test]
    fn formats_the_runners_take() {
        let (Some(bf16), Some(quant)) = (golden("bf16"), golden("quant")) else {
            eprintln!("SKIP: tests/data/tiny-v4-small not found");
            return;
        };
        check_supported(&bf16).expect("BF16 on one GPU");
        check_supported(&quant).expect("FP8/FP4 on one GPU");
        check_quantized(&quant).expect("FP8/FP4 split");
        let err = check_quantized(&bf16).expect_err("BF16 split").to_string();
        assert!(err.contains("BF16"), "{err}");
        let mut mixed = bf16.clone();
        mixed.expert_format = ExpertFormat::Fp4;
        let err = check_supported(&mixed)
            .expect_err("BF16 linears, FP4 experts")
            .to_string();
        assert!(err.contains("Bf16") && err.contains("Fp4"), "{err}");
    }

    /// Bank bytes follow the stored format: 2 bytes per BF16 weight, 0.5 + 1/32 per FP4 weight.
    #[test]
    fn bank_bytes_follow_the_format() {
        let Some(mut cfg) = golden("bf16") else {
            eprintln!("SKIP: tests/data/tiny-v4-small not found");
            return;
        };
        let (e, d, i) = (8, 32, 64);
        assert_eq!(ExpertBank::bytes_for(&cfg), e * 3 * d * i * 2);
        cfg.expert_format = ExpertFormat::Fp4;
        assert_eq!(
            ExpertBank::bytes_for(&cfg),
            e * 3 * (d * i / 2 + d * i / 32)
        );
    }
}
