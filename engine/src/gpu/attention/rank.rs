//! The output projection of one tensor-parallel rank (the GPU side of `parallel::tp`): the rank's heads
//! (in `sc.act.o` after [`super::decode_heads`]) through its groups' `wo_a` columns into latents, then its
//! owned groups' `wo_b` columns into an f32 partial `[rows, hidden]` that the ranks sum.
//!
//! Without a latent exchange (every rank holds whole groups and the FP8 activation blocks of `wo_b`'s
//! input do not straddle groups) the latents stay local: `latent` writes the owned groups only and
//! `project` quantises exactly the blocks the unsplit row has there. With an exchange, `latent` writes a
//! full-width latent (zeros where the rank has no heads) that the caller all-reduces before `project`
//! quantises the whole row and gathers the owned columns, as the unsplit model does.
use super::error::{ensure, GpuError};
use super::layer::{AttnLayer, Fp8Linear};
use super::scratch::AttnScratch;
use super::step::{Job, Step};
use super::{dptr, dptr_mut, row_prep};
use crate::api::Numerics;
use dsv4_kernels::cudarc::driver::{CudaSlice, CudaStream};
use dsv4_kernels::{bf16, GpuContext};
use dsv4_kernels::{GemvWeights, GEMV_GROUPS};
use std::ops::Range;

/// A rank's share of the grouped output projection. The rank's `AttnLayer` has `o_groups` = the groups
/// its heads touch (equal heads in each) and `wo_a` = those groups' columns of its heads.
pub struct RankOut {
    /// Absolute ids of the touched groups, in the order of `AttnLayer::wo_a`.
    pub groups: Vec<usize>,
    /// Groups whose `wo_b` columns the rank multiplies.
    pub owned: Range<usize>,
    /// `wo_b` columns of the owned groups `[hidden, owned·o_lora_rank]` (None when it owns none).
    pub wo_b: Option<Fp8Linear>,
    /// The latents are summed over ranks between `latent` and `project`.
    pub exchange: bool,
    /// Output groups of the whole model.
    pub total_groups: usize,
}

/// Per-rank buffers of the split projection, sized for `max_rows`.
pub struct RankOutScratch {
    /// f32 latents `[groups, rows, o_lora_rank]` (all groups when exchanging).
    pub lat: CudaSlice<f32>,
    /// The quantised latent rows and their owned columns (bf16).
    pub u: CudaSlice<bf16>,
    pub cols: CudaSlice<bf16>,
}

impl RankOutScratch {
    pub fn new(
        stream: &std::sync::Arc<CudaStream>,
        total_groups: usize,
        lora: usize,
        max_rows: usize,
    ) -> Result<Self, GpuError> {
        let n = (max_rows * total_groups * lora).max(1);
        Ok(RankOutScratch {
            lat: stream.alloc_zeros(n)?,
            u: stream.alloc_zeros(n)?,
            cols: stream.alloc_zeros(n)?,
        })
    }
}

impl RankOut {
    /// Latent slot of touched group `i`: its absolute group when exchanging, else its local index.
    fn slot(&self, i: usize) -> usize {
        if self.exchange {
            self.groups[i]
        } else {
            i
        }
    }

    /// Elements of the latent the ranks sum when exchanging.
    pub fn exchange_len(&self, rows: usize, lora: usize) -> usize {
        self.total_groups * rows * lora
    }
}

fn step<'a>(
    ctx: &'a GpuContext,
    s: &'a CudaStream,
    layer: &'a AttnLayer,
    rows: usize,
    numerics: Numerics,
) -> Step<'a> {
    Step {
        ctx,
        s,
        cfg: &layer.cfg,
        rows,
        official: numerics == Numerics::Official,
        slots: 0,
        positions: 0,
        marks: None,
    }
}

/// `wo_a` of the rank's touched groups (one grouped GEMV, no activation quant) into `ro.lat`.
#[allow(clippy::too_many_arguments)]
pub fn latent(
    ctx: &GpuContext,
    s: &std::sync::Arc<CudaStream>,
    layer: &AttnLayer,
    out: &RankOut,
    rows: usize,
    sc: &mut AttnScratch,
    ro: &mut RankOutScratch,
    numerics: Numerics,
) -> Result<(), GpuError> {
    let st = step(ctx, s, layer, rows, numerics);
    let cfg = &layer.cfg;
    let lora = cfg.o_lora_rank;
    let g_in = cfg.num_attention_heads * cfg.head_dim / cfg.o_groups;
    ensure(
        layer.wo_a.len() == out.groups.len() && out.groups.len() <= GEMV_GROUPS,
        || {
            format!(
                "{} wo_a parts for {} groups",
                layer.wo_a.len(),
                out.groups.len()
            )
        },
    )?;
    if out.exchange {
        let n = out.exchange_len(rows, lora);
        s.memset_zeros(&mut ro.lat.slice_mut(..n))?;
    }
    let (o, lat) = (dptr(&sc.act.o, s), dptr_mut(&mut ro.lat, s));
    let mut jobs = [Job::default(); GEMV_GROUPS];
    for (i, w) in layer.wo_a.iter().enumerate() {
        let x = o + (2 * i * rows * g_in) as u64;
        jobs[i] = Job::linear(w, x, lat + (4 * out.slot(i) * rows * lora) as u64, s);
    }
    st.gemv(GemvWeights::Fp8, g_in, false, &jobs[..out.groups.len()], sc)
}

/// The owned groups' `wo_b` columns of the (summed, when exchanging) latents into `part` f32
/// `[rows, hidden]` (zeros when the rank owns no group).
#[allow(clippy::too_many_arguments)]
pub fn project(
    ctx: &GpuContext,
    s: &std::sync::Arc<CudaStream>,
    layer: &AttnLayer,
    out: &RankOut,
    rows: usize,
    sc: &mut AttnScratch,
    ro: &mut RankOutScratch,
    part: &mut CudaSlice<f32>,
    numerics: Numerics,
) -> Result<(), GpuError> {
    let st = step(ctx, s, layer, rows, numerics);
    let (lora, d) = (layer.cfg.o_lora_rank, layer.cfg.hidden_size);
    let Some(wo_b) = &out.wo_b else {
        s.memset_zeros(&mut part.slice_mut(..rows * d))?;
        return Ok(());
    };
    let groups = if out.exchange {
        out.total_groups
    } else {
        out.owned.len()
    };
    let mut p = row_prep::regroup(
        dptr(&ro.lat, s),
        dptr_mut(&mut ro.u, s),
        groups,
        rows,
        lora,
        st.official,
    );
    // The FP8-activation GEMV as on one GPU, where this rank's wo_b reads u whole (with the latent exchange it
    // reads a gathered column range, whose codes are not gathered).
    let q8 = !out.exchange && st.with_codes(&mut p, st.q8(st.official, wo_b.k), sc);
    // SAFETY: lat holds groups x rows x lora f32 and u rows x groups*lora bf16 (RankOutScratch sizes them
    // for every group at max_rows); x8 / x8_scales max_rows x (q_lora or all groups x lora) when q8.
    unsafe { ctx.launch_attn_row_prep(s, &p) }?;
    let x = if out.exchange {
        let width = groups * lora;
        let cols = out.owned.start * lora..out.owned.end * lora;
        ctx.launch_gather_cols_bf16(s, rows, width, cols, &ro.u, &mut ro.cols)?;
        dptr(&ro.cols, s)
    } else {
        dptr(&ro.u, s)
    };
    let job = Job::linear(wo_b, x, dptr_mut(part, s), s);
    st.gemv_maybe_q8(q8, GemvWeights::Fp8, wo_b.k, false, &[job], sc)
}
