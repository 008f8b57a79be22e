//! Device weights from a checkpoint: stored bytes uploaded as they are (FP8/FP4 + UE8M0 scales, or BF16
//! linears and experts, each linear's format taken from its tensor's dtype), small tensors converted on
//! the host (bf16 -> f32 norms, i64 -> i32 tid2eid).

use super::attention::AttnLayer;
use super::weights::{
    check_supported, load_fp8, raw_bytes, upload, BankPlan, BlockDev, ExpertBank, HcDev,
    ModelWeightsDev, MoeDev,
};
use super::RunnerError;
use crate::model::checkpoint::{scale_name, Checkpoint, Dtype};
use crate::model::{ExpertFormat, ModelConfig};
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, GpuContext};
use std::sync::Arc;

fn f32s(ctx: &GpuContext, ck: &Checkpoint, name: &str) -> Result<CudaSlice<f32>, RunnerError> {
    upload(&ctx.stream, &ck.load_f32(name)?.data)
}

/// A BF16 tensor uploaded as bf16 (the mapping is unaligned: decode the bytes).
fn bf16s(ctx: &GpuContext, ck: &Checkpoint, name: &str) -> Result<CudaSlice<bf16>, RunnerError> {
    let bytes = raw_bytes(ck, name, Dtype::BF16)?;
    let v: Vec<bf16> = bytes
        .chunks_exact(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    upload(&ctx.stream, &v)
}

fn hc(ctx: &GpuContext, ck: &Checkpoint, prefix: &str) -> Result<HcDev, RunnerError> {
    Ok(HcDev {
        func: f32s(ctx, ck, &format!("{prefix}_fn"))?,
        base: f32s(ctx, ck, &format!("{prefix}_base"))?,
        scale: f32s(ctx, ck, &format!("{prefix}_scale"))?,
    })
}

/// One matrix of every expert, concatenated on the device: (weights, scales). FP4 weights come with their
/// UE8M0 scales; BF16 weights with a 1-byte placeholder scale.
fn expert_matrix(
    ctx: &GpuContext,
    ck: &Checkpoint,
    p: &str,
    which: &str,
    experts: usize,
    format: ExpertFormat,
) -> Result<(CudaSlice<u8>, CudaSlice<u8>), RunnerError> {
    let (wdt, scaled) = match format {
        ExpertFormat::Fp4 => (Dtype::I8, true),
        ExpertFormat::Bf16 => (Dtype::BF16, false),
        ExpertFormat::Fp8 => {
            return Err(RunnerError::Unsupported(
                "FP8 routed experts: the GPU runs FP4 or BF16 experts".into(),
            ))
        }
    };
    let first = format!("{p}experts.0.{which}.weight");
    let wlen = ck.raw(&first)?.bytes.len();
    let slen = if scaled {
        ck.raw(&scale_name(&first))?.bytes.len()
    } else {
        1
    };
    let s = &ctx.stream;
    let (mut w, mut sc) = (
        s.alloc_zeros::<u8>(experts * wlen)?,
        s.alloc_zeros::<u8>(if scaled { experts * slen } else { 1 })?,
    );
    for e in 0..experts {
        let name = format!("{p}experts.{e}.{which}.weight");
        let wb = raw_bytes(ck, &name, wdt)?;
        if wb.len() != wlen {
            return Err(RunnerError::Unsupported(format!(
                "{}: {name}: size differs from expert 0",
                ck.dir().display()
            )));
        }
        s.memcpy_htod(wb, &mut w.slice_mut(e * wlen..(e + 1) * wlen))?;
        if scaled {
            let sb = raw_bytes(ck, &scale_name(&name), Dtype::F8_E8M0)?;
            if sb.len() != slen {
                return Err(RunnerError::Unsupported(format!(
                    "{}: {name}: scale size differs from expert 0",
                    ck.dir().display()
                )));
            }
            s.memcpy_htod(sb, &mut sc.slice_mut(e * slen..(e + 1) * slen))?;
        }
    }
    Ok((w, sc))
}

fn bank(ctx: &GpuContext, ck: &Checkpoint, p: &str, e: usize) -> Result<ExpertBank, RunnerError> {
    let cfg = ck.config();
    let format = cfg.expert_format;
    let (w1, s1) = expert_matrix(ctx, ck, p, "w1", e, format)?;
    let (w3, s3) = expert_matrix(ctx, ck, p, "w3", e, format)?;
    let (w2, s2) = expert_matrix(ctx, ck, p, "w2", e, format)?;
    ExpertBank {
        w1,
        s1,
        w3,
        s3,
        w2,
        s2,
        format,
    }
    .into_device_layout(ctx, e, cfg.hidden_size, cfg.moe_intermediate_size)
}

fn moe(ctx: &GpuContext, ck: &Checkpoint, layer: usize, p: &str) -> Result<MoeDev, RunnerError> {
    let cfg = ck.config();
    let (tid2eid, bias) = if cfg.is_hash_layer(layer) {
        let (_, ids) = ck.load_i64(&format!("{p}gate.tid2eid"))?;
        let ids: Vec<i32> = ids.into_iter().map(|v| v as i32).collect();
        (Some(upload(&ctx.stream, &ids)?), None)
    } else {
        (None, Some(f32s(ctx, ck, &format!("{p}gate.bias"))?))
    };
    let shared = |w: &str| load_fp8(ctx, ck, &format!("{p}shared_experts.{w}"));
    let dev = MoeDev {
        gate: bf16s(ctx, ck, &format!("{p}gate.weight"))?,
        bias,
        tid2eid,
        bank: Arc::new(bank(ctx, ck, p, cfg.n_routed_experts)?),
        shared: [shared("w1")?, shared("w3")?, shared("w2")?],
    };
    super::moe::check_shared_formats(&dev, layer)?;
    Ok(dev)
}

fn block(ctx: &GpuContext, ck: &Checkpoint, layer: usize) -> Result<BlockDev, RunnerError> {
    let p = ck.config().block_prefix(layer);
    Ok(BlockDev {
        hc_attn: hc(ctx, ck, &format!("{p}hc_attn"))?,
        hc_ffn: hc(ctx, ck, &format!("{p}hc_ffn"))?,
        attn_norm: f32s(ctx, ck, &format!("{p}attn_norm.weight"))?,
        ffn_norm: f32s(ctx, ck, &format!("{p}ffn_norm.weight"))?,
        attn: AttnLayer::from_checkpoint(ctx, ck, layer)?,
        moe: moe(ctx, ck, layer, &format!("{p}ffn."))?,
    })
}

impl ModelWeightsDev {
    /// Loads every main block (MTP is not run by the GPU runner yet).
    pub fn from_checkpoint(ctx: &GpuContext, ck: &Checkpoint) -> Result<Self, RunnerError> {
        let cfg: &ModelConfig = ck.config();
        check_supported(cfg)?;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|l| block(ctx, ck, l))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ModelWeightsDev {
            embed: bf16s(ctx, ck, "embed.weight")?,
            head: bf16s(ctx, ck, "head.weight")?,
            norm: f32s(ctx, ck, "norm.weight")?,
            hc_head: hc(ctx, ck, "hc_head")?,
            blocks,
            banks: BankPlan::distinct(cfg.num_hidden_layers),
        })
    }
}
