//! The split plan: which heads, output groups, experts, shared-expert rows and layers each
//! rank holds, and how many checkpoint bytes that is. Pure arithmetic on the config; shared by
//! the CPU simulation, the sharded loader and (later) the GPU runner.

use super::shares::{rank_shares, share_bytes};
use crate::model::{LinearFormat, ModelConfig};
use crate::reference::weights::ACT_QUANT_BLOCK;
use std::ops::Range;

/// How the model is split over ranks: the engine setting of the same name. `Tensor`: every layer
/// on every rank (attention by heads, routed experts by id, the shared expert by intermediate
/// rows; two all-reduces per layer). `Layer`: consecutive layers per rank (balanced by bytes),
/// the residual streams handed on.
pub use crate::api::SplitMode;

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("a split needs at least one rank")]
    NoRanks,
    #[error("tensor split over {ranks} ranks: the model has only {heads} attention heads (at most one rank per head)")]
    TooManyRanksForHeads { ranks: usize, heads: usize },
    #[error("layer split over {ranks} ranks: the model has only {layers} layers (at least one per rank)")]
    TooManyRanksForLayers { ranks: usize, layers: usize },
}

/// One output group of the attention as one rank sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupShare {
    pub group: usize,
    /// The rank's heads inside this group (absolute head ids).
    pub heads: Range<usize>,
    /// The group's first head is on this rank: it multiplies the group's `wo_b` columns.
    pub owner: bool,
}

/// What one rank holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    pub rank: usize,
    /// Main layers this rank runs (all of them in tensor mode).
    pub layers: Range<usize>,
    /// Attention heads (absolute ids) this rank computes.
    pub heads: Range<usize>,
    /// Output groups touched by `heads`, in order.
    pub groups: Vec<GroupShare>,
    /// Groups whose `wo_b` columns this rank multiplies (contiguous).
    pub owned_groups: Range<usize>,
    /// Routed experts held (whole).
    pub experts: Range<usize>,
    /// Intermediate rows of the shared expert held (`w1`/`w3` rows, `w2` columns).
    pub shared_rows: Range<usize>,
    /// Holds the embedding.
    pub embed: bool,
    /// Holds the HC head, final norm and vocabulary head.
    pub head: bool,
    /// Holds (its share of) the MTP block.
    pub mtp: bool,
    /// Checkpoint bytes of this rank's share, as stored on disk.
    pub weight_bytes: u64,
}

/// The whole split: one [`RankPlan`] per rank.
#[derive(Debug, Clone)]
pub struct SplitPlan {
    pub mode: SplitMode,
    pub cfg: ModelConfig,
    pub ranks: Vec<RankPlan>,
    /// Tensor mode: the `wo_a` latents must be summed over ranks before `wo_b`, because a
    /// group's heads sit on several ranks or the FP8 activation blocks of `wo_b`'s input
    /// straddle groups (the official numerics quantise whole 128-wide blocks).
    pub exchange_latent: bool,
}

impl SplitPlan {
    pub fn new(cfg: &ModelConfig, ranks: usize, mode: SplitMode) -> Result<Self, PlanError> {
        if ranks == 0 {
            return Err(PlanError::NoRanks);
        }
        let mut plan = match mode {
            SplitMode::Tensor => tensor_plan(cfg, ranks)?,
            SplitMode::Layer => layer_plan(cfg, ranks)?,
        };
        for r in 0..plan.ranks.len() {
            let bytes = rank_shares(&plan, r).iter().map(share_bytes).sum();
            plan.ranks[r].weight_bytes = bytes;
        }
        Ok(plan)
    }

    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// Sum of every rank's bytes (replicated tensors counted once per rank).
    pub fn total_bytes(&self) -> u64 {
        self.ranks.iter().map(|r| r.weight_bytes).sum()
    }
}

/// `n` items in `parts` contiguous ranges, the first `n % parts` one longer.
pub fn even_ranges(n: usize, parts: usize) -> Vec<Range<usize>> {
    let (base, extra) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|p| {
            let len = base + usize::from(p < extra);
            start += len;
            start - len..start
        })
        .collect()
}

fn tensor_plan(cfg: &ModelConfig, ranks: usize) -> Result<SplitPlan, PlanError> {
    let (heads, groups) = (cfg.num_attention_heads, cfg.o_groups);
    if ranks > heads {
        return Err(PlanError::TooManyRanksForHeads { ranks, heads });
    }
    let per_group = heads / groups;
    // Whole groups per rank when there are enough of them (no latent exchange needed);
    // otherwise heads as even as possible, groups then straddle ranks.
    let head_ranges: Vec<Range<usize>> = if ranks <= groups {
        even_ranges(groups, ranks)
            .into_iter()
            .map(|g| g.start * per_group..g.end * per_group)
            .collect()
    } else {
        even_ranges(heads, ranks)
    };
    let experts = even_ranges(cfg.n_routed_experts, ranks);
    let shared = shared_row_ranges(cfg.moe_intermediate_size, ranks);
    let ranks: Vec<RankPlan> = head_ranges
        .into_iter()
        .enumerate()
        .map(|(r, h)| {
            let groups = group_shares(&h, per_group);
            let owned: Vec<usize> = groups.iter().filter(|g| g.owner).map(|g| g.group).collect();
            let owned_groups = match (owned.first(), owned.last()) {
                (Some(&a), Some(&b)) => a..b + 1,
                _ => 0..0,
            };
            RankPlan {
                rank: r,
                layers: 0..cfg.num_hidden_layers,
                heads: h,
                groups,
                owned_groups,
                experts: experts[r].clone(),
                shared_rows: shared[r].clone(),
                embed: true,
                head: true,
                mtp: cfg.has_mtp(),
                weight_bytes: 0,
            }
        })
        .collect();
    // A group split over ranks always has a rank that touches it without owning it.
    let split_groups = ranks.iter().any(|r| r.groups.iter().any(|g| !g.owner));
    let quantized = matches!(cfg.linear_format, LinearFormat::Fp8 { .. });
    let unaligned = quantized && !cfg.o_lora_rank.is_multiple_of(ACT_QUANT_BLOCK);
    Ok(SplitPlan {
        mode: SplitMode::Tensor,
        cfg: cfg.clone(),
        ranks,
        exchange_latent: split_groups || unaligned,
    })
}

/// The groups a contiguous head range touches.
fn group_shares(heads: &Range<usize>, per_group: usize) -> Vec<GroupShare> {
    if heads.is_empty() {
        return Vec::new();
    }
    let (first, last) = (heads.start / per_group, (heads.end - 1) / per_group);
    (first..=last)
        .map(|g| {
            let span = g * per_group..(g + 1) * per_group;
            GroupShare {
                group: g,
                heads: span.start.max(heads.start)..span.end.min(heads.end),
                owner: heads.contains(&span.start),
            }
        })
        .collect()
}

/// Shared-expert rows in units of the activation-quantisation block, so each rank's slice
/// of `w2`'s input starts on a block boundary (exact official numerics, aligned FP8 scales).
fn shared_row_ranges(inter: usize, ranks: usize) -> Vec<Range<usize>> {
    let units = inter.div_ceil(ACT_QUANT_BLOCK);
    even_ranges(units, ranks)
        .into_iter()
        .map(|u| (u.start * ACT_QUANT_BLOCK).min(inter)..(u.end * ACT_QUANT_BLOCK).min(inter))
        .collect()
}

fn layer_plan(cfg: &ModelConfig, ranks: usize) -> Result<SplitPlan, PlanError> {
    let layers = cfg.num_hidden_layers;
    if ranks > layers {
        return Err(PlanError::TooManyRanksForLayers { ranks, layers });
    }
    let costs = super::shares::layer_costs(cfg);
    let cuts = balance_layers(&costs.per_layer, costs.first, costs.last, ranks);
    let last = ranks - 1;
    let ranks = cuts
        .into_iter()
        .enumerate()
        .map(|(r, l)| RankPlan {
            rank: r,
            layers: l,
            heads: 0..cfg.num_attention_heads,
            groups: group_shares(
                &(0..cfg.num_attention_heads),
                cfg.num_attention_heads / cfg.o_groups,
            ),
            owned_groups: 0..cfg.o_groups,
            experts: 0..cfg.n_routed_experts,
            shared_rows: 0..cfg.moe_intermediate_size,
            embed: r == 0,
            head: r == last,
            mtp: r == last && cfg.has_mtp(),
            weight_bytes: 0,
        })
        .collect();
    Ok(SplitPlan {
        mode: SplitMode::Layer,
        cfg: cfg.clone(),
        ranks,
        exchange_latent: false,
    })
}

/// Consecutive layer ranges minimising the largest rank's bytes (`first`/`last` are the
/// extra bytes of the first and last rank: embedding, head, MTP). Dynamic programming over
/// (ranks used, layers placed); layers and ranks are few.
pub fn balance_layers(costs: &[u64], first: u64, last: u64, ranks: usize) -> Vec<Range<usize>> {
    let n = costs.len();
    let prefix: Vec<u64> = std::iter::once(0)
        .chain(costs.iter().scan(0u64, |s, &c| {
            *s += c;
            Some(*s)
        }))
        .collect();
    let load = |r: usize, a: usize, b: usize| {
        let extra = if r == 0 { first } else { 0 } + if r == ranks - 1 { last } else { 0 };
        prefix[b] - prefix[a] + extra
    };
    // best[r][i]: smallest max load placing layers 0..i on ranks 0..=r; from[r][i]: cut.
    let mut best = vec![vec![u64::MAX; n + 1]; ranks];
    let mut from = vec![vec![0usize; n + 1]; ranks];
    for (i, b) in best[0].iter_mut().enumerate().skip(1) {
        *b = load(0, 0, i);
    }
    for r in 1..ranks {
        for i in r + 1..=n {
            for j in r..i {
                let cand = best[r - 1][j].max(load(r, j, i));
                if cand < best[r][i] {
                    best[r][i] = cand;
                    from[r][i] = j;
                }
            }
        }
    }
    let mut out = vec![0..0; ranks];
    let mut end = n;
    for r in (0..ranks).rev() {
        let start = if r == 0 { 0 } else { from[r][end] };
        out[r] = start..end;
        end = start;
    }
    out
}
