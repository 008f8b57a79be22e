//! Batched prefill of the tensor split, the decode step's order over a call's rows
//! ([`crate::gpu::prefill::tp`] holds the rank parts): every rank embeds and plans the call on its own
//! workspace; per layer each runs HCPre and its heads into latents, (latent exchange), its `wo_b` columns
//! into the partial, all-reduce, HCPost; HCPre, routing, its experts and shared rows into the partial,
//! all-reduce, HCPost. The mHC streams, norms, routing, compressors and indexer are replicated, so after
//! each all-reduce every rank holds the same streams. Rank 0 runs the head on each segment's last row.

use super::collective::GpuCollective;
use super::model::MultiModel;
use super::rank::Rank;
use crate::api::Numerics;
use crate::gpu::prefill::tp::{self, TpCall, TpPrefillWs};
use crate::gpu::prefill::{embed, last_rows_to, plan_call, Plan};
use crate::gpu::prefill::{PrefillHook, PrefillSeg, PrefillWs};
use crate::gpu::RunnerError;
use crate::model::ModelConfig;
use dsv4_kernels::cudarc::driver::CudaSlice;

/// The ranks of one tensor-split prefill call, each with its planned call and workspaces.
struct TpRun<'a> {
    cfg: &'a ModelConfig,
    numerics: Numerics,
    plans: Vec<Plan>,
    ranks: &'a mut [Rank],
    ws: &'a mut [PrefillWs],
    tp: &'a mut [TpPrefillWs],
    comm: &'a dyn GpuCollective,
}

type RankPart<'f> = dyn FnMut(&TpCall<'_>, &mut Rank, &mut PrefillWs, &mut TpPrefillWs) -> Result<(), RunnerError>
    + 'f;

impl TpRun<'_> {
    /// Enqueues `f` on every rank in turn.
    fn each(&mut self, f: &mut RankPart<'_>) -> Result<(), RunnerError> {
        let ranks = self.ranks.iter_mut().zip(self.ws.iter_mut());
        for ((rank, ws), (tp, plan)) in ranks.zip(self.tp.iter_mut().zip(&self.plans)) {
            let gpu = rank.gpu.clone();
            let tc = TpCall {
                ctx: &gpu,
                plan,
                cfg: self.cfg,
                numerics: self.numerics,
                wbf: ws.wbf_scratch(&gpu.stream),
            };
            f(&tc, rank, ws, tp)?;
        }
        Ok(())
    }

    /// Sums the first `len` elements of the buffer `pick` chooses over the ranks.
    fn all_reduce(
        &mut self,
        len: usize,
        pick: fn(&mut TpPrefillWs) -> &mut CudaSlice<f32>,
    ) -> Result<(), RunnerError> {
        let mut bufs: Vec<&mut CudaSlice<f32>> = self.tp.iter_mut().map(pick).collect();
        self.comm.all_reduce_sum(&mut bufs, len)
    }

    /// One layer (`i`: the ranks' local block, every rank holding every layer).
    fn layer(
        &mut self,
        i: usize,
        exchange: bool,
        hook: PrefillHook<'_>,
    ) -> Result<(), RunnerError> {
        let rows = self.plans.first().map_or(0, |p| p.rows);
        let (lat, d) = (
            self.cfg.o_groups * rows * self.cfg.o_lora_rank,
            self.cfg.hidden_size,
        );
        self.each(&mut |tc, r, ws, t| {
            let out = &r.w.tp[i].out;
            tp::attn_heads(tc, &r.w.blocks[i], out, &mut r.states[i], ws, t, hook)
        })?;
        if exchange {
            self.all_reduce(lat, |t| &mut t.lat)?;
        }
        self.each(&mut |tc, r, _, t| tp::attn_project(tc, &r.w.tp[i].out, t))?;
        self.all_reduce(rows * d, |t| &mut t.part)?;
        self.each(&mut |tc, _, ws, t| tp::post(tc, ws, t))?;
        self.each(&mut |tc, r, ws, t| {
            let x = &r.w.tp[i];
            tp::moe(tc, &r.w.blocks[i], x.experts.clone(), x.shared, ws, t, hook)
        })?;
        self.all_reduce(rows * d, |t| &mut t.part)?;
        self.each(&mut |tc, _, ws, t| tp::post(tc, ws, t))
    }
}

impl MultiModel {
    /// The tensor split's [`MultiModel::prefill_with`] (workspaces checked by the caller).
    pub(super) fn prefill_tensor(
        &mut self,
        segs: &[PrefillSeg<'_>],
        limit: usize,
        hook: PrefillHook<'_>,
    ) -> Result<(), RunnerError> {
        if self.prefill_tp.len() != self.ranks.len() {
            return Err(RunnerError::Unsupported(
                "no tensor-split prefill buffers (enable_prefill)".into(),
            ));
        }
        let mut plans = Vec::with_capacity(self.ranks.len());
        for (r, (rank, ws)) in self.ranks.iter().zip(self.prefill.iter_mut()).enumerate() {
            let plan = plan_call(&rank.gpu, &self.cfg, ws, segs, limit)?;
            let table = rank
                .w
                .embed
                .as_ref()
                .ok_or_else(|| RunnerError::Split(format!("rank {r} has no embedding")))?;
            embed(&rank.gpu, &self.cfg, &plan, ws, table)?;
            plans.push(plan);
        }
        let mut run = TpRun {
            cfg: &self.cfg,
            numerics: self.numerics,
            plans,
            ranks: &mut self.ranks,
            ws: &mut self.prefill,
            tp: &mut self.prefill_tp,
            comm: self.comm.as_ref(),
        };
        for i in 0..self.cfg.num_hidden_layers {
            run.layer(i, self.plan.exchange_latent, hook)?;
        }
        let TpRun { plans, .. } = run;
        let (Some(plan), Some(ws), Some(out)) =
            (plans.first(), self.prefill.first(), self.ranks.first_mut())
        else {
            return Err(RunnerError::Split("no ranks".into()));
        };
        last_rows_to(&out.gpu, &self.cfg, plan, ws, &mut out.ws.io.x)?;
        out.head(segs.len())
    }
}
