//! A rank's device weights from its committed shares ([`RankStore`]): whole blocks in layer mode, the
//! rank's cut of every block in tensor mode (see `weights.rs`). The FP8 weights are already on the
//! device (cropped while loading); small tensors are converted here on the host.

use super::stage::RankStore;
use super::weights::{
    placeholder_attn_fp8, placeholder_fp8, rank_attention_config, HeadDev, RankWeights, TpBlock,
};
use crate::gpu::attention::rank::RankOut;
use crate::gpu::attention::{
    rope_freqs, stack_compressors, AttnLayer, AttnWeightSource, Fp8Linear as AttnFp8,
};
use crate::gpu::weights::{BlockDev, ExpertBank, Fp8Linear, HcDev, MoeDev};
use crate::gpu::RunnerError;
use crate::model::{ExpertFormat, ModelConfig};
use crate::parallel::plan::{RankPlan, SplitMode, SplitPlan};
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{bf16, GpuContext};
use std::sync::Arc;

struct Builder<'a> {
    gpu: &'a GpuContext,
    plan: &'a SplitPlan,
    rank: &'a RankPlan,
    st: RankStore,
}

/// Builds rank `store.rank` of `plan` on `gpu`, using every tensor it loaded.
pub fn build_rank(
    plan: &SplitPlan,
    gpu: &GpuContext,
    store: RankStore,
) -> Result<RankWeights, RunnerError> {
    let rank = &plan.ranks[store.rank];
    let mut b = Builder {
        gpu,
        plan,
        rank,
        st: store,
    };
    let tensor = plan.mode == SplitMode::Tensor;
    let mut blocks = Vec::with_capacity(rank.layers.len());
    let mut tp = Vec::new();
    for layer in rank.layers.clone() {
        let (blk, out) = b.block(layer)?;
        blocks.push(blk);
        if let (true, Some(out)) = (tensor, out) {
            tp.push(TpBlock {
                out,
                experts: rank.experts.clone(),
                shared: !rank.shared_rows.is_empty(),
            });
        }
    }
    let embed = rank
        .embed
        .then(|| b.st.dev_bf16(gpu, "embed.weight"))
        .transpose()?;
    let head = rank.head.then(|| b.head()).transpose()?;
    b.st.finish()?;
    Ok(RankWeights {
        rank: rank.rank,
        layers: rank.layers.clone(),
        blocks,
        tp,
        embed,
        head,
    })
}

impl Builder<'_> {
    fn cfg(&self) -> &ModelConfig {
        &self.plan.cfg
    }

    fn hc(&mut self, prefix: &str) -> Result<HcDev, RunnerError> {
        Ok(HcDev {
            func: self.st.dev_f32(self.gpu, &format!("{prefix}_fn"))?,
            base: self.st.dev_f32(self.gpu, &format!("{prefix}_base"))?,
            scale: self.st.dev_f32(self.gpu, &format!("{prefix}_scale"))?,
        })
    }

    fn head(&mut self) -> Result<HeadDev, RunnerError> {
        Ok(HeadDev {
            head: self.st.dev_bf16(self.gpu, "head.weight")?,
            norm: self.st.dev_f32(self.gpu, "norm.weight")?,
            hc_head: self.hc("hc_head")?,
        })
    }

    fn block(&mut self, layer: usize) -> Result<(BlockDev, Option<RankOut>), RunnerError> {
        let p = self.cfg().block_prefix(layer);
        let (attn, out) = self.attention(layer, &format!("{p}attn."))?;
        let blk = BlockDev {
            hc_attn: self.hc(&format!("{p}hc_attn"))?,
            hc_ffn: self.hc(&format!("{p}hc_ffn"))?,
            attn_norm: self.st.dev_f32(self.gpu, &format!("{p}attn_norm.weight"))?,
            ffn_norm: self.st.dev_f32(self.gpu, &format!("{p}ffn_norm.weight"))?,
            attn,
            moe: self.moe(layer, &format!("{p}ffn."))?,
        };
        Ok((blk, out))
    }

    /// The attention layer as the rank's kernels see it, and (tensor mode) its output projection.
    fn attention(
        &mut self,
        layer: usize,
        p: &str,
    ) -> Result<(AttnLayer, Option<RankOut>), RunnerError> {
        let tensor = self.plan.mode == SplitMode::Tensor;
        let cfg = if tensor {
            rank_attention_config(self.cfg(), self.rank)?
        } else {
            self.cfg().clone()
        };
        let kind = cfg.attention_kind(layer);
        let st = stack_compressors(self, p, kind, &cfg)?;
        let wo_a = self.st.fp8_parts(self.gpu, &format!("{p}wo_a"))?;
        let (wo_a, wo_b, out) = if tensor {
            let out = self.rank_out(&format!("{p}wo_b"))?;
            (wo_a, placeholder_attn_fp8(&self.gpu.stream)?, Some(out))
        } else {
            let groups = split_groups(self.gpu, wo_a, cfg.o_groups)?;
            (groups, self.st.fp8(self.gpu, &format!("{p}wo_b"))?, None)
        };
        let g = self.gpu;
        let l = AttnLayer {
            layer,
            kind,
            wq_a: self.st.fp8(g, &format!("{p}wq_a"))?,
            wq_b: self.st.fp8(g, &format!("{p}wq_b"))?,
            wkv: self.st.fp8(g, &format!("{p}wkv"))?,
            wo_a,
            wo_b,
            q_norm: self.st.dev_f32(g, &format!("{p}q_norm.weight"))?,
            kv_norm: self.st.dev_f32(g, &format!("{p}kv_norm.weight"))?,
            sink: self.st.dev_f32(g, &format!("{p}attn_sink"))?,
            freqs: g.stream.clone_htod(&rope_freqs(&cfg, layer))?,
            lin: st.upload(&g.stream)?,
            lin_rows: st.rows,
            comp: st.comp,
            index: st.index,
            cfg,
        };
        if !tensor {
            l.check_dims(&l.cfg)?;
        }
        Ok((l, out))
    }

    /// The rank's owned `wo_b` columns and where its latents go.
    fn rank_out(&mut self, prefix: &str) -> Result<RankOut, RunnerError> {
        let wo_b = if self.st.holds(&format!("{prefix}.weight")) {
            Some(self.st.fp8(self.gpu, prefix)?)
        } else {
            None
        };
        Ok(RankOut {
            groups: self.rank.groups.iter().map(|g| g.group).collect(),
            owned: self.rank.owned_groups.clone(),
            wo_b,
            exchange: self.plan.exchange_latent,
            total_groups: self.cfg().o_groups,
        })
    }

    fn moe(&mut self, layer: usize, p: &str) -> Result<MoeDev, RunnerError> {
        let (g, s) = (self.gpu, &self.gpu.stream);
        let hash = self.cfg().is_hash_layer(layer);
        let experts = self.cfg().n_routed_experts;
        let tid2eid = hash
            .then(|| self.st.expert_ids(g, &format!("{p}gate.tid2eid"), experts))
            .transpose()?;
        let bias = (!hash)
            .then(|| self.st.dev_f32(g, &format!("{p}gate.bias")))
            .transpose()?;
        let bank = match self.st.banks.remove(&layer) {
            Some(b) => b,
            None if self.rank.experts.is_empty() => empty_bank(g)?,
            None => return Err(RunnerError::Split(format!("layer {layer}: no expert bank"))),
        };
        let shared = if self.rank.shared_rows.is_empty() {
            [
                placeholder_fp8(s)?,
                placeholder_fp8(s)?,
                placeholder_fp8(s)?,
            ]
        } else {
            let mut lin = |w: &str| {
                self.st
                    .fp8(g, &format!("{p}shared_experts.{w}"))
                    .map(linear)
            };
            [lin("w1")?, lin("w3")?, lin("w2")?]
        };
        Ok(MoeDev {
            gate: self.st.dev_bf16(g, &format!("{p}gate.weight"))?,
            bias,
            tid2eid,
            bank: Arc::new(bank),
            shared,
        })
    }
}

/// The attention flavour of an FP8 linear as the MoE's.
fn linear(l: AttnFp8) -> Fp8Linear {
    Fp8Linear {
        w: l.w,
        scale: l.scale,
        out: l.n,
        inp: l.k,
        wt: l.wt,
    }
}

/// A bank of one byte per matrix for a rank that holds no experts (never read).
fn empty_bank(g: &GpuContext) -> Result<ExpertBank, RunnerError> {
    let z = || g.stream.alloc_zeros::<u8>(1);
    Ok(ExpertBank {
        w1: z()?,
        s1: z()?,
        w3: z()?,
        s3: z()?,
        w2: z()?,
        s2: z()?,
        format: ExpertFormat::Fp4,
    })
}

/// A whole `wo_a` `[G·L, K]` as G weights `[L, K]` (device copies of its rows and their scales).
fn split_groups(
    g: &GpuContext,
    parts: Vec<AttnFp8>,
    groups: usize,
) -> Result<Vec<AttnFp8>, RunnerError> {
    let [whole]: [AttnFp8; 1] = parts
        .try_into()
        .map_err(|_| RunnerError::Split("wo_a held in several parts in layer mode".into()))?;
    let (n, k) = (whole.n, whole.k);
    let l = n / groups.max(1);
    let kb = k.div_ceil(128);
    // A 128-row block of a group must take its scales from one block of the whole weight.
    let straddles = |i: usize| {
        (0..l.div_ceil(128)).any(|b| {
            let (a, z) = (i * l + b * 128, i * l + ((b + 1) * 128).min(l) - 1);
            a / 128 != z / 128
        })
    };
    if groups == 0 || !n.is_multiple_of(groups) || (0..groups).any(straddles) {
        return Err(RunnerError::Split(format!(
            "wo_a [{n}, {k}]: {groups} groups straddle scale blocks"
        )));
    }
    let scale = g.stream.clone_dtoh(&whole.scale)?;
    (0..groups)
        .map(|i| {
            let rows = i * l * k..(i + 1) * l * k;
            let sc: Vec<u8> = (0..l.div_ceil(128))
                .flat_map(|b| {
                    let src = (i * l + b * 128) / 128;
                    scale[src * kb..(src + 1) * kb].iter().copied()
                })
                .collect();
            Ok(AttnFp8 {
                w: g.stream.clone_dtod(&whole.w.slice(rows))?,
                scale: g.stream.clone_htod(&sc)?,
                n: l,
                k,
                wt: whole.wt,
            })
        })
        .collect()
}

impl AttnWeightSource for Builder<'_> {
    type Error = RunnerError;

    fn bf16_rows(&mut self, name: &str, into: &mut Vec<bf16>) -> Result<usize, RunnerError> {
        let v = self.st.host_f32(name)?;
        let n = v.len() / self.cfg().hidden_size;
        into.extend(v.iter().map(|&x| bf16::from_f32(x)));
        Ok(n)
    }

    fn f32(&mut self, name: &str) -> Result<CudaSlice<f32>, RunnerError> {
        self.st.dev_f32(self.gpu, name)
    }

    fn fp8(&mut self, prefix: &str) -> Result<AttnFp8, RunnerError> {
        self.st.fp8(self.gpu, prefix)
    }
}
