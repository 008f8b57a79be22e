//! One rank's device weights. Layer mode: whole blocks of its layers ([`BlockDev`], as unsplit).
//! Tensor mode: every block cut to the rank's share of the plan ([`RankPlan`]): its heads (`wq_b` rows,
//! sinks, the touched groups' `wo_a` columns), its owned groups' `wo_b` columns, its routed experts and
//! its shared-expert rows; everything else replicated.

use crate::gpu::attention::rank::RankOut;
use crate::gpu::attention::Fp8Linear as AttnFp8;
use crate::gpu::weights::{BlockDev, Fp8Linear, HcDev};
use crate::gpu::RunnerError;
use crate::model::ModelConfig;
use crate::parallel::plan::RankPlan;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{bf16, GemvWeights};
use std::ops::Range;
use std::sync::Arc;

/// The vocabulary side: HC head, final norm, head.
pub struct HeadDev {
    pub head: CudaSlice<bf16>,
    pub norm: CudaSlice<f32>,
    pub hc_head: HcDev,
}

/// What a tensor-parallel block holds beyond its [`BlockDev`].
pub struct TpBlock {
    pub out: RankOut,
    /// Routed experts held (global ids); the block's bank holds exactly these.
    pub experts: Range<usize>,
    /// Holds shared-expert rows; without, the block's `moe.shared` is a placeholder never run.
    pub shared: bool,
}

pub struct RankWeights {
    pub rank: usize,
    /// Main layers held (`blocks[i]` is layer `layers.start + i`).
    pub layers: Range<usize>,
    pub blocks: Vec<BlockDev>,
    /// Tensor mode: one per block; empty in layer mode.
    pub tp: Vec<TpBlock>,
    pub embed: Option<CudaSlice<bf16>>,
    pub head: Option<HeadDev>,
}

impl RankWeights {
    /// Device bytes of the rank's weights.
    pub fn bytes(&self) -> usize {
        let hc = |h: &HcDev| h.func.num_bytes() + h.base.num_bytes() + h.scale.num_bytes();
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                let bank = &b.moe.bank;
                let bank_bytes = [&bank.w1, &bank.s1, &bank.w3, &bank.s3, &bank.w2, &bank.s2]
                    .iter()
                    .map(|x| x.num_bytes())
                    .sum::<usize>();
                b.attn.weight_bytes() as usize
                    + crate::gpu::block_dense_bytes(b)
                    + bank_bytes
                    + 4 * (b.attn_norm.len() + b.ffn_norm.len())
            })
            .sum();
        let tp: usize = self
            .tp
            .iter()
            .filter_map(|t| t.out.wo_b.as_ref())
            .map(|w| w.w.num_bytes() + w.scale.num_bytes())
            .sum();
        let head = self.head.as_ref().map_or(0, |h| {
            h.head.num_bytes() + h.norm.num_bytes() + hc(&h.hc_head)
        });
        blocks + tp + head + self.embed.as_ref().map_or(0, |e| e.num_bytes())
    }
}

/// The attention config a tensor-parallel rank's kernels see: its heads, and the output groups they
/// touch as the groups (each must hold the same number of the rank's heads: the attention output is
/// laid out group-major with one width).
pub fn rank_attention_config(
    cfg: &ModelConfig,
    rank: &RankPlan,
) -> Result<ModelConfig, RunnerError> {
    let per = rank.groups.first().map_or(0, |g| g.heads.len());
    if per == 0 || rank.groups.iter().any(|g| g.heads.len() != per) {
        return Err(RunnerError::Split(format!(
            "rank {} holds heads {:?}, unevenly over output groups: the GPU split needs the same \
             number of a rank's heads in each group it touches (choose a GPU count that divides the \
             {} heads by groups)",
            rank.rank, rank.heads, cfg.num_attention_heads
        )));
    }
    let mut c = cfg.clone();
    c.num_attention_heads = rank.heads.len();
    c.o_groups = rank.groups.len();
    Ok(c)
}

/// The config the routed-expert kernels of a rank see: its own experts only.
pub fn rank_moe_config(cfg: &ModelConfig, experts: &Range<usize>) -> ModelConfig {
    let mut c = cfg.clone();
    c.n_routed_experts = experts.len().max(1);
    c
}

/// A one-element FP8 linear standing where a rank holds nothing (never run).
pub fn placeholder_fp8(s: &Arc<CudaStream>) -> Result<Fp8Linear, RunnerError> {
    Ok(Fp8Linear {
        w: s.alloc_zeros(1)?,
        scale: s.alloc_zeros(1)?,
        out: 0,
        inp: 0,
        wt: GemvWeights::Fp8,
    })
}

/// The attention-layer flavour of [`placeholder_fp8`].
pub fn placeholder_attn_fp8(s: &Arc<CudaStream>) -> Result<AttnFp8, RunnerError> {
    Ok(AttnFp8 {
        w: s.alloc_zeros(1)?,
        scale: s.alloc_zeros(1)?,
        n: 0,
        k: 0,
        wt: GemvWeights::Fp8,
    })
}
