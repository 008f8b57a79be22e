//! Full-size synthetic rank weights for `dsv4 bench --gpus`: each rank's share generated on its own GPU
//! with the single-GPU generator's scaling. Every layer of a rank holds its own experts unless the caller asks
//! for fewer banks (ranks simulated on one GPU, where the model does not fit twice: layers then share banks).

use super::weights::{
    placeholder_attn_fp8, placeholder_fp8, rank_attention_config, rank_moe_config, HeadDev,
    RankWeights, TpBlock,
};
use crate::gpu::attention::rank::RankOut;
use crate::gpu::attention::AttnLayer;
use crate::gpu::synth::Gen;
use crate::gpu::weights::{check_supported, BankPlan, BlockDev, ExpertBank};
use crate::gpu::RunnerError;
use crate::parallel::plan::{SplitMode, SplitPlan};
use dsv4_kernels::{Fill, GpuContext, HC_MIX, HC_STREAMS};
use std::sync::Arc;

/// Rank `r` of `plan` with random weights on `gpu`. Replicated parts use the same seed on every rank.
/// `banks`: routed-expert banks of the rank (None: one per layer); layer i of the rank uses bank i mod banks.
pub fn synthetic_rank(
    gpu: &GpuContext,
    plan: &SplitPlan,
    r: usize,
    seed: u64,
    banks: Option<usize>,
) -> Result<RankWeights, RunnerError> {
    let cfg = &plan.cfg;
    check_supported(cfg)?;
    let rank = &plan.ranks[r];
    let tensor = plan.mode == SplitMode::Tensor;
    if tensor && plan.exchange_latent {
        return Err(RunnerError::Split(
            "synthetic weights need whole output groups per GPU (no latent exchange)".into(),
        ));
    }
    let attn_cfg = if tensor {
        rank_attention_config(cfg, rank)?
    } else {
        cfg.clone()
    };
    let mut shared_cfg = cfg.clone();
    shared_cfg.moe_intermediate_size = rank.shared_rows.len();
    let mut g = Gen {
        ctx: gpu,
        seed,
        counter: 0,
    };
    let (d, v) = (cfg.hidden_size, cfg.vocab_size);
    let nd = HC_STREAMS * d;
    let (mut blocks, mut tp) = (Vec::new(), Vec::new());
    let bank_plan = match banks {
        Some(n) => BankPlan::shared(rank.layers.len(), n),
        None => BankPlan::distinct(rank.layers.len()),
    };
    let mut made: Vec<Option<Arc<ExpertBank>>> = vec![None; bank_plan.banks];
    for (i, layer) in rank.layers.clone().enumerate() {
        let slot = &mut made[bank_plan.bank_of[i]];
        let bank = match slot {
            Some(b) => b.clone(),
            None => slot
                .insert(Arc::new(g.bank(&rank_moe_config(cfg, &rank.experts))?))
                .clone(),
        };
        let mut moe = g.moe(&shared_cfg, layer, bank)?;
        if rank.shared_rows.is_empty() {
            let s = &gpu.stream;
            moe.shared = [
                placeholder_fp8(s)?,
                placeholder_fp8(s)?,
                placeholder_fp8(s)?,
            ];
        }
        let mut attn = AttnLayer::synthetic(gpu, &attn_cfg, layer, seed ^ layer as u64)?;
        if tensor {
            let wo_b = std::mem::replace(&mut attn.wo_b, placeholder_attn_fp8(&gpu.stream)?);
            tp.push(TpBlock {
                out: RankOut {
                    groups: rank.groups.iter().map(|x| x.group).collect(),
                    owned: rank.owned_groups.clone(),
                    wo_b: Some(wo_b),
                    exchange: false,
                    total_groups: cfg.o_groups,
                },
                experts: rank.experts.clone(),
                shared: !rank.shared_rows.is_empty(),
            });
        }
        blocks.push(BlockDev {
            hc_attn: g.hc(HC_MIX, nd)?,
            hc_ffn: g.hc(HC_MIX, nd)?,
            attn_norm: g.f32s(d, 0.0, 1.0)?,
            ffn_norm: g.f32s(d, 0.0, 1.0)?,
            attn,
            moe,
        });
    }
    let table = |g: &mut Gen<'_>, std: f32| g.buf(v * d, Fill::Bf16 { std, mean: 0.0 });
    let embed = rank.embed.then(|| table(&mut g, 1.0)).transpose()?;
    let head = if rank.head {
        Some(HeadDev {
            head: table(&mut g, 1.0 / (d as f32).sqrt())?,
            norm: g.f32s(d, 0.0, 1.0)?,
            hc_head: g.hc(HC_STREAMS, nd)?,
        })
    } else {
        None
    };
    Ok(RankWeights {
        rank: r,
        layers: rank.layers.clone(),
        blocks,
        tp,
        embed,
        head,
    })
}
