//! Which part of each checkpoint tensor a rank holds, and its size on disk. The loader reads
//! exactly these parts; the plan sums their bytes.

use super::plan::{RankPlan, SplitMode, SplitPlan};
use crate::model::checkpoint::{expected_tensors, ExpectedTensor};
use crate::model::ModelConfig;
use std::ops::Range;

/// A part of a logical tensor `[rows, cols]` (1-D tensors are `[n, 1]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Part {
    Whole,
    /// Rows (elements of a 1-D tensor), all columns.
    Rows(Range<usize>),
    /// A rectangle.
    Rect {
        rows: Range<usize>,
        cols: Range<usize>,
    },
}

impl Part {
    /// `(rows, cols)` ranges of this part in a logical `[rows, cols]` tensor.
    pub fn ranges(&self, rows: usize, cols: usize) -> (Range<usize>, Range<usize>) {
        match self {
            Part::Whole => (0..rows, 0..cols),
            Part::Rows(r) => (r.clone(), 0..cols),
            Part::Rect { rows, cols } => (rows.clone(), cols.clone()),
        }
    }
}

/// One part of one logical tensor held by a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorShare {
    pub tensor: ExpectedTensor,
    pub part: Part,
}

/// A logical shape seen as `[rows, cols]`.
pub fn as_matrix(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (*n, 1),
        [r, rest @ ..] => (*r, rest.iter().product()),
    }
}

/// Bytes on disk of a share: each stored tensor (weight, scale) in proportion to the part's
/// elements (exact when the part is aligned to the scale blocks, as the plan's parts are).
pub fn share_bytes(s: &TensorShare) -> u64 {
    let (rows, cols) = as_matrix(&s.tensor.shape);
    let (r, c) = s.part.ranges(rows, cols);
    let (part, whole) = ((r.len() * c.len()) as u128, (rows * cols).max(1) as u128);
    s.tensor
        .stored()
        .iter()
        .map(|t| {
            let bytes = (t.shape.iter().product::<usize>() * t.dtype.size()) as u128;
            (bytes * part / whole) as u64
        })
        .sum()
}

/// Where a tensor belongs: a global (embedding / head side) or block `layer`.
enum Owner<'a> {
    Embed,
    Head,
    Block { layer: usize, rest: &'a str },
}

fn owner<'a>(cfg: &ModelConfig, name: &'a str) -> Owner<'a> {
    let block = |prefix: &str, offset: usize| {
        let tail = name.strip_prefix(prefix)?;
        let (num, rest) = tail.split_once('.')?;
        Some((offset + num.parse::<usize>().ok()?, rest))
    };
    if let Some((layer, rest)) =
        block("layers.", 0).or_else(|| block("mtp.", cfg.num_hidden_layers))
    {
        return Owner::Block { layer, rest };
    }
    if name.starts_with("embed.") {
        Owner::Embed
    } else {
        Owner::Head
    }
}

/// Every part rank `r` of `plan` holds, in checkpoint order.
pub fn rank_shares(plan: &SplitPlan, r: usize) -> Vec<TensorShare> {
    let (cfg, rank) = (&plan.cfg, &plan.ranks[r]);
    let mut out = Vec::new();
    for t in expected_tensors(cfg) {
        let parts = match owner(cfg, &t.name) {
            Owner::Embed => whole_if(rank.embed),
            Owner::Head => whole_if(rank.head),
            Owner::Block { layer, rest } => {
                let held = if layer >= cfg.num_hidden_layers {
                    rank.mtp
                } else {
                    rank.layers.contains(&layer)
                };
                match (held, plan.mode) {
                    (false, _) => Vec::new(),
                    (true, SplitMode::Layer) => vec![Part::Whole],
                    (true, SplitMode::Tensor) => tensor_parts(cfg, rank, rest),
                }
            }
        };
        out.extend(parts.into_iter().map(|part| TensorShare {
            tensor: t.clone(),
            part,
        }));
    }
    out
}

fn whole_if(held: bool) -> Vec<Part> {
    if held {
        vec![Part::Whole]
    } else {
        Vec::new()
    }
}

/// The parts of a block tensor (`rest` = name after the block prefix) in tensor mode.
fn tensor_parts(cfg: &ModelConfig, rank: &RankPlan, rest: &str) -> Vec<Part> {
    let (d, lora) = (cfg.head_dim, cfg.o_lora_rank);
    let per_group = cfg.num_attention_heads / cfg.o_groups;
    let nonempty = |p: Part, len: usize| if len > 0 { vec![p] } else { Vec::new() };
    let h = &rank.heads;
    match rest {
        "attn.wq_b.weight" => vec![Part::Rows(h.start * d..h.end * d)],
        "attn.attn_sink" => vec![Part::Rows(h.clone())],
        "attn.wo_a.weight" => rank
            .groups
            .iter()
            .map(|g| {
                let first = g.group * per_group;
                Part::Rect {
                    rows: g.group * lora..(g.group + 1) * lora,
                    cols: (g.heads.start - first) * d..(g.heads.end - first) * d,
                }
            })
            .collect(),
        "attn.wo_b.weight" => {
            let og = &rank.owned_groups;
            let cols = og.start * lora..og.end * lora;
            nonempty(
                Part::Rect {
                    rows: 0..cfg.hidden_size,
                    cols: cols.clone(),
                },
                cols.len(),
            )
        }
        "ffn.shared_experts.w1.weight" | "ffn.shared_experts.w3.weight" => {
            let s = &rank.shared_rows;
            nonempty(Part::Rows(s.clone()), s.len())
        }
        "ffn.shared_experts.w2.weight" => {
            let s = &rank.shared_rows;
            let p = Part::Rect {
                rows: 0..cfg.hidden_size,
                cols: s.clone(),
            };
            nonempty(p, s.len())
        }
        _ => match expert_id(rest) {
            Some(e) => whole_if(rank.experts.contains(&e)),
            None => vec![Part::Whole],
        },
    }
}

/// `ffn.experts.{e}.…` -> `e`.
fn expert_id(rest: &str) -> Option<usize> {
    rest.strip_prefix("ffn.experts.")?
        .split_once('.')?
        .0
        .parse()
        .ok()
}

/// Bytes per main layer, and the extra bytes of the first (embedding) and last (head, MTP)
/// rank, for balancing a layer split.
pub struct LayerCosts {
    pub per_layer: Vec<u64>,
    pub first: u64,
    pub last: u64,
}

pub fn layer_costs(cfg: &ModelConfig) -> LayerCosts {
    let mut c = LayerCosts {
        per_layer: vec![0; cfg.num_hidden_layers],
        first: 0,
        last: 0,
    };
    for t in expected_tensors(cfg) {
        let bytes = share_bytes(&TensorShare {
            part: Part::Whole,
            tensor: t.clone(),
        });
        match owner(cfg, &t.name) {
            Owner::Embed => c.first += bytes,
            Owner::Block { layer, .. } if layer < cfg.num_hidden_layers => {
                c.per_layer[layer] += bytes;
            }
            Owner::Head | Owner::Block { .. } => c.last += bytes,
        }
    }
    c
}
