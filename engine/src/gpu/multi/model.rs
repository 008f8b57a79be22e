//! One decode step of the model split over ranks, enqueued on every rank's stream with no host sync
//! (graph-capturable), the collectives in between.
//!
//! Tensor mode, per layer: every rank runs HCPre and its heads; (latent exchange); its `wo_b` columns;
//! all-reduce; HCPost; HCPre, routing and its experts and shared rows; all-reduce; HCPost. The mHC
//! streams, norms and routing are replicated (each rank computes them on identical inputs), so after
//! each all-reduce every rank holds the same residual streams. Rank 0 computes the head.
//! Layer mode: rank 0 embeds, each rank runs its layers and hands the streams `[rows, n, D]` to the
//! next; the last computes the head.

use super::collective::GpuCollective;
use super::rank::Rank;
use crate::api::Numerics;
use crate::gpu::prefill::tp::TpPrefillWs;
use crate::gpu::{PrefillWs, RunnerError, StepInput};
use crate::model::ModelConfig;
use crate::parallel::plan::{SplitMode, SplitPlan};
use dsv4_kernels::cudarc::driver::{sys, CudaEvent, CudaSlice};
use dsv4_kernels::HC_STREAMS;

/// Events around every collective of an eager step (the bench's collective time): on rank 0's stream for
/// all-reduces, on the sender's for a hand-off.
#[derive(Default)]
pub struct CollectiveProbe {
    pub spans: Vec<(CudaEvent, CudaEvent)>,
}

impl CollectiveProbe {
    /// Milliseconds inside collectives (waiting for the other ranks included).
    pub fn total_ms(&self) -> Result<f64, RunnerError> {
        let mut ms = 0.0;
        for (a, b) in &self.spans {
            ms += f64::from(a.elapsed_ms(b)?);
        }
        Ok(ms)
    }
}

pub struct MultiModel {
    pub cfg: ModelConfig,
    pub plan: SplitPlan,
    pub numerics: Numerics,
    pub ranks: Vec<Rank>,
    pub comm: Box<dyn GpuCollective>,
    pub seq_slots: usize,
    pub max_rows: usize,
    /// One batched-prefill workspace per rank (empty: prompts run as decode steps; see prefill.rs).
    pub prefill: Vec<PrefillWs>,
    /// Tensor split: each rank's buffers of the split prefill parts (empty otherwise).
    pub prefill_tp: Vec<TpPrefillWs>,
    /// Host staging for the padded step inputs (reused: no per-step allocation).
    staging: [Vec<i32>; 3],
}

impl MultiModel {
    pub fn new(
        plan: SplitPlan,
        numerics: Numerics,
        ranks: Vec<Rank>,
        comm: Box<dyn GpuCollective>,
        seq_slots: usize,
        max_rows: usize,
    ) -> Result<Self, RunnerError> {
        if ranks.len() != plan.world() || comm.world() != plan.world() {
            return Err(RunnerError::Split(format!(
                "{} ranks and a collective of {} for a plan of {}",
                ranks.len(),
                comm.world(),
                plan.world()
            )));
        }
        Ok(MultiModel {
            cfg: plan.cfg.clone(),
            plan,
            numerics,
            ranks,
            comm,
            seq_slots,
            max_rows,
            prefill: Vec::new(),
            prefill_tp: Vec::new(),
            staging: [vec![0; max_rows], vec![0; max_rows], vec![0; max_rows]],
        })
    }

    /// The slot that padding rows write to (never a sequence's).
    pub fn pad_slot(&self) -> usize {
        self.seq_slots
    }

    /// The rank that computes the logits.
    pub fn out_rank(&self) -> usize {
        match self.plan.mode {
            SplitMode::Tensor => 0,
            SplitMode::Layer => self.ranks.len() - 1,
        }
    }

    /// Copies a step's inputs to every rank, padded to `rows` with harmless rows.
    pub fn upload(&mut self, input: &StepInput<'_>, rows: usize) -> Result<(), RunnerError> {
        let n = input.tokens.len();
        if rows > self.max_rows || n > rows {
            return Err(RunnerError::TooManyRows {
                rows,
                max: self.max_rows,
            });
        }
        let pad = [0, self.pad_slot() as i32, 0];
        let srcs = [input.tokens, input.slots, input.positions];
        for ((buf, src), p) in self.staging.iter_mut().zip(srcs).zip(pad) {
            buf[..n].copy_from_slice(src);
            buf[n..rows].iter_mut().for_each(|v| *v = p);
        }
        for r in &mut self.ranks {
            let (s, ws) = (&r.gpu.stream, &mut r.ws);
            s.memcpy_htod(&self.staging[0][..rows], &mut ws.tokens.slice_mut(..rows))?;
            let meta = &mut ws.meta;
            s.memcpy_htod(&self.staging[1][..rows], &mut meta.slots.slice_mut(..rows))?;
            s.memcpy_htod(
                &self.staging[2][..rows],
                &mut meta.positions.slice_mut(..rows),
            )?;
        }
        Ok(())
    }

    /// Enqueues one step over `rows` rows of the uploaded inputs (capturable).
    pub fn step(&mut self, rows: usize) -> Result<(), RunnerError> {
        self.step_probed(rows, None)
    }

    /// [`Self::step`] recording events around each collective into `probe` (eager steps only).
    pub fn step_probed(
        &mut self,
        rows: usize,
        mut probe: Option<&mut CollectiveProbe>,
    ) -> Result<(), RunnerError> {
        if rows == 0 || rows > self.max_rows {
            return Err(RunnerError::TooManyRows {
                rows,
                max: self.max_rows,
            });
        }
        match self.plan.mode {
            SplitMode::Tensor => self.step_tensor(rows, &mut probe),
            SplitMode::Layer => self.step_layer(rows, &mut probe),
        }
    }

    fn step_tensor(
        &mut self,
        rows: usize,
        probe: &mut Option<&mut CollectiveProbe>,
    ) -> Result<(), RunnerError> {
        let (nm, d) = (self.numerics, self.cfg.hidden_size);
        let lat = self.cfg.o_groups * rows * self.cfg.o_lora_rank;
        self.each(|r| r.embed(rows))?;
        for i in 0..self.cfg.num_hidden_layers {
            self.each(|r| r.attn_heads(i, rows, nm))?;
            if self.plan.exchange_latent {
                self.all_reduce(probe, lat, |r| &mut r.tp.out.lat)?;
            }
            self.each(|r| r.attn_project(i, rows, nm))?;
            self.all_reduce(probe, rows * d, |r| &mut r.tp.part)?;
            self.each(|r| r.post(rows))?;
            self.each(|r| r.moe(i, rows, nm))?;
            self.all_reduce(probe, rows * d, |r| &mut r.tp.part)?;
            self.each(|r| r.post(rows))?;
        }
        self.ranks[0].head(rows)
    }

    fn step_layer(
        &mut self,
        rows: usize,
        probe: &mut Option<&mut CollectiveProbe>,
    ) -> Result<(), RunnerError> {
        let len = rows * HC_STREAMS * self.cfg.hidden_size;
        self.ranks[0].embed(rows)?;
        for r in 0..self.ranks.len() {
            if r > 0 {
                let start = self.mark(probe, r - 1)?;
                {
                    let (done, rest) = self.ranks.split_at_mut(r);
                    let (src, dst) = (&done[r - 1].ws.io.x, &mut rest[0].ws.io.x);
                    self.comm.send(r - 1, r, src, dst, len)?;
                }
                self.span(probe, start, r - 1)?;
            }
            self.ranks[r].blocks(rows, self.numerics)?;
        }
        let last = self.ranks.len() - 1;
        self.ranks[last].head(rows)
    }

    fn each(
        &mut self,
        mut f: impl FnMut(&mut Rank) -> Result<(), RunnerError>,
    ) -> Result<(), RunnerError> {
        self.ranks.iter_mut().try_for_each(&mut f)
    }

    /// All-reduces the first `len` elements of the buffer `pick` chooses on every rank.
    fn all_reduce(
        &mut self,
        probe: &mut Option<&mut CollectiveProbe>,
        len: usize,
        pick: impl Fn(&mut Rank) -> &mut CudaSlice<f32>,
    ) -> Result<(), RunnerError> {
        let start = self.mark(probe, 0)?;
        {
            let mut bufs: Vec<_> = self.ranks.iter_mut().map(pick).collect();
            self.comm.all_reduce_sum(&mut bufs, len)?;
        }
        self.span(probe, start, 0)
    }

    fn event(&self, rank: usize) -> Result<CudaEvent, RunnerError> {
        let s = &self.ranks[rank].gpu.stream;
        Ok(s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
    }

    /// An event on `rank`'s stream when probing.
    fn mark(
        &self,
        probe: &Option<&mut CollectiveProbe>,
        rank: usize,
    ) -> Result<Option<CudaEvent>, RunnerError> {
        probe.as_ref().map(|_| self.event(rank)).transpose()
    }

    fn span(
        &self,
        probe: &mut Option<&mut CollectiveProbe>,
        start: Option<CudaEvent>,
        rank: usize,
    ) -> Result<(), RunnerError> {
        if let (Some(p), Some(a)) = (probe.as_deref_mut(), start) {
            p.spans.push((a, self.event(rank)?));
        }
        Ok(())
    }

    /// The rank holding the logits (its workspace takes the device sampler's picks).
    pub fn out_rank_mut(&mut self) -> &mut Rank {
        let i = self.out_rank();
        &mut self.ranks[i]
    }

    /// The greedy tokens of the last step's rows (one device-to-host copy: the step's one sync).
    pub fn read_next(&mut self, rows: usize) -> Result<Vec<i32>, RunnerError> {
        let r = &self.ranks[self.out_rank()];
        let mut out = vec![0i32; rows];
        r.gpu
            .stream
            .memcpy_dtoh(&r.ws.next.slice(..rows), &mut out)?;
        r.gpu.stream.synchronize()?;
        Ok(out)
    }

    /// The last step's logits of `row` (f32 [vocab]).
    pub fn read_logits(&self, row: usize) -> Result<Vec<f32>, RunnerError> {
        let r = &self.ranks[self.out_rank()];
        let v = self.cfg.vocab_size;
        let mut out = vec![0f32; v];
        let src = r.ws.logits.slice(row * v..(row + 1) * v);
        r.gpu.stream.memcpy_dtoh(&src, &mut out)?;
        r.gpu.stream.synchronize()?;
        Ok(out)
    }

    /// Waits for every rank's stream.
    pub fn synchronize(&self) -> Result<(), RunnerError> {
        for r in &self.ranks {
            r.gpu.stream.synchronize()?;
        }
        Ok(())
    }
}
