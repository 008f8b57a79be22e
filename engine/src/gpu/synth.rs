//! Full-size synthetic device weights for `dsv4 bench`: random values generated on the device (150+ GB
//! never cross PCIe), scaled so activations stay near unit RMS: FP8/FP4 block scales are chosen so each
//! matrix has std ~1/sqrt(in). Routed-expert banks may be shared between layers when they do not all fit.

use super::attention::AttnLayer;
use super::weights::{
    check_supported, BankPlan, BlockDev, ExpertBank, Fp8Linear, HcDev, ModelWeightsDev, MoeDev,
};
use super::RunnerError;
use crate::model::{ExpertFormat, ModelConfig};
use dsv4_kernels::cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use dsv4_kernels::{bf16, Fill, GemvWeights, GpuContext, HC_MIX, HC_STREAMS};
use std::sync::Arc;

/// RMS of a random e4m3 code from `Fill::E4m3` and of a random e2m1 code from `Fill::Fp4`.
const E4M3_RMS: f64 = 1.2;
const E2M1_RMS: f64 = 2.93;

pub(crate) struct Gen<'a> {
    pub(crate) ctx: &'a GpuContext,
    pub(crate) seed: u64,
    pub(crate) counter: u64,
}

impl Gen<'_> {
    pub(crate) fn buf<T: DeviceRepr + ValidAsZeroBits>(
        &mut self,
        len: usize,
        fill: Fill,
    ) -> Result<CudaSlice<T>, RunnerError> {
        let s = &self.ctx.stream;
        // SAFETY: every element is written by the fill launched right after, on the same stream.
        let mut b = unsafe { s.alloc::<T>(len) }?;
        self.counter += 1;
        let seed = self.seed ^ self.counter.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.ctx.launch_synth_fill(s, &mut b, seed, fill)?;
        Ok(b)
    }

    pub(crate) fn f32s(
        &mut self,
        len: usize,
        std: f32,
        mean: f32,
    ) -> Result<CudaSlice<f32>, RunnerError> {
        self.buf(len, Fill::F32 { std, mean })
    }

    pub(crate) fn hc(&mut self, mixes: usize, nd: usize) -> Result<HcDev, RunnerError> {
        Ok(HcDev {
            func: self.f32s(mixes * nd, 1.0 / (nd as f32).sqrt(), 0.0)?,
            base: self.f32s(mixes, 0.1, 0.0)?,
            scale: self.f32s(3, 0.0, 1.0)?,
        })
    }

    /// UE8M0 byte of the power of two closest to `1 / (rms * sqrt(inp))`.
    fn scale_byte(rms: f64, inp: usize) -> u8 {
        let e = (1.0 / (rms * (inp as f64).sqrt())).log2().round() as i32;
        (127 + e).clamp(1, 254) as u8
    }

    pub(crate) fn fp8(&mut self, out: usize, inp: usize) -> Result<Fp8Linear, RunnerError> {
        let sb = Self::scale_byte(E4M3_RMS, inp);
        Ok(Fp8Linear {
            w: self.buf(out * inp, Fill::E4m3)?,
            scale: self.buf(out.div_ceil(128) * inp.div_ceil(128), Fill::Byte(sb))?,
            out,
            inp,
            wt: GemvWeights::Fp8,
        })
    }

    pub(crate) fn bank(&mut self, cfg: &ModelConfig) -> Result<ExpertBank, RunnerError> {
        let (e, d, i) = (
            cfg.n_routed_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
        );
        let (b_in, b_mid) = (Self::scale_byte(E2M1_RMS, d), Self::scale_byte(E2M1_RMS, i));
        ExpertBank {
            w1: self.buf(e * i * d / 2, Fill::Fp4)?,
            s1: self.buf(e * i * d / 32, Fill::Byte(b_in))?,
            w3: self.buf(e * i * d / 2, Fill::Fp4)?,
            s3: self.buf(e * i * d / 32, Fill::Byte(b_in))?,
            w2: self.buf(e * d * i / 2, Fill::Fp4)?,
            s2: self.buf(e * d * i / 32, Fill::Byte(b_mid))?,
            format: ExpertFormat::Fp4,
        }
        .into_device_layout(self.ctx, e, d, i)
    }

    pub(crate) fn moe(
        &mut self,
        cfg: &ModelConfig,
        layer: usize,
        bank: Arc<ExpertBank>,
    ) -> Result<MoeDev, RunnerError> {
        let (e, d, i) = (
            cfg.n_routed_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
        );
        let hash = cfg.is_hash_layer(layer);
        let tid2eid = if hash {
            Some(self.buf(
                cfg.vocab_size * cfg.num_experts_per_tok,
                Fill::Below(e as u32),
            )?)
        } else {
            None
        };
        let bias = if hash {
            None
        } else {
            Some(self.f32s(e, 0.01, 0.0)?)
        };
        let std = 1.0 / (d as f32).sqrt();
        Ok(MoeDev {
            gate: self.buf::<bf16>(e * d, Fill::Bf16 { std, mean: 0.0 })?,
            bias,
            tid2eid,
            bank,
            shared: [self.fp8(i, d)?, self.fp8(i, d)?, self.fp8(d, i)?],
        })
    }
}

impl ModelWeightsDev {
    /// A random model of `cfg`'s dimensions on the device, with `plan.banks` routed-expert banks.
    pub fn synthetic(
        ctx: &GpuContext,
        cfg: &ModelConfig,
        plan: BankPlan,
        seed: u64,
    ) -> Result<Self, RunnerError> {
        check_supported(cfg)?;
        let mut g = Gen {
            ctx,
            seed,
            counter: 0,
        };
        let (d, v) = (cfg.hidden_size, cfg.vocab_size);
        let nd = HC_STREAMS * d;
        let banks = (0..plan.banks)
            .map(|_| g.bank(cfg).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
        for layer in 0..cfg.num_hidden_layers {
            blocks.push(BlockDev {
                hc_attn: g.hc(HC_MIX, nd)?,
                hc_ffn: g.hc(HC_MIX, nd)?,
                attn_norm: g.f32s(d, 0.0, 1.0)?,
                ffn_norm: g.f32s(d, 0.0, 1.0)?,
                attn: AttnLayer::synthetic(ctx, cfg, layer, seed ^ layer as u64)?,
                moe: g.moe(cfg, layer, banks[plan.bank_of[layer]].clone())?,
            });
        }
        Ok(ModelWeightsDev {
            embed: g.buf(
                v * d,
                Fill::Bf16 {
                    std: 1.0,
                    mean: 0.0,
                },
            )?,
            head: g.buf(
                v * d,
                Fill::Bf16 {
                    std: 1.0 / (d as f32).sqrt(),
                    mean: 0.0,
                },
            )?,
            norm: g.f32s(d, 0.0, 1.0)?,
            hc_head: g.hc(HC_STREAMS, nd)?,
            blocks,
            banks: plan,
        })
    }
}
