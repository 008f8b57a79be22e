//! Batched prefill of the split runner, in calls of several sequences' chunks like one GPU's.
//!
//! Layer split: each rank runs the one-GPU per-block prefill ([`crate::gpu::prefill::run_blocks`]) over the
//! call's rows for its layers and hands the residual streams `[rows, 4, hidden]` bf16 on to the next rank
//! (the decode step's hand-off: an NCCL send/receive, or a device copy for ranks simulated on one GPU); the
//! last rank runs the head on each segment's last row. Every rank plans the call on its own workspace (host
//! layout, uploads on its stream), so nothing waits on the host between ranks. Same kernels on the same
//! inputs as on one GPU: bit-identical. Tensor split: prefill_tp.rs.

use super::model::MultiModel;
use crate::gpu::prefill::tp::TpPrefillWs;
use crate::gpu::prefill::{embed, last_rows_to, plan_call, run_blocks, Blocks, PrefillSeg};
use crate::gpu::prefill::{PrefillHook, PrefillWs};
use crate::gpu::RunnerError;
use crate::parallel::plan::SplitMode;
use dsv4_kernels::HC_STREAMS;

impl MultiModel {
    /// Gives every rank a prefill workspace of `max_tokens` rows (and the tensor split's buffers).
    /// Returns false, holding none, when a workspace does not fit.
    pub fn enable_prefill(&mut self, max_tokens: usize) -> bool {
        self.prefill.clear();
        self.prefill_tp.clear();
        let (limit, cfg) = (self.max_context(), &self.cfg);
        let tensor = self.plan.mode == SplitMode::Tensor;
        let made: Result<Vec<_>, RunnerError> = self
            .ranks
            .iter()
            .map(|r| {
                let ws = PrefillWs::new(&r.gpu, cfg, max_tokens, limit)?;
                let tp = tensor
                    .then(|| TpPrefillWs::new(&r.gpu, cfg, max_tokens))
                    .transpose()?;
                Ok((ws, tp))
            })
            .collect();
        for (ws, tp) in made.unwrap_or_default() {
            self.prefill.push(ws);
            self.prefill_tp.extend(tp);
        }
        !self.prefill.is_empty()
    }

    /// Most rows of one prefill call (0: no batched prefill).
    pub fn prefill_tokens(&self) -> usize {
        self.prefill.first().map_or(0, |ws| ws.max_tokens)
    }

    /// The context every rank's attention states were made for.
    fn max_context(&self) -> usize {
        self.ranks
            .iter()
            .filter_map(|r| r.states.first())
            .map(|st| st.max_context)
            .max()
            .unwrap_or(0)
    }

    /// Feeds every segment's tokens (distinct slots) through the ranks' layers, then runs the HC head,
    /// head and argmax on each segment's last row into rows 0..segs.len() of the output rank's decode
    /// workspace: read them with [`MultiModel::read_next`] / [`MultiModel::read_logits`].
    pub fn prefill(&mut self, segs: &[PrefillSeg<'_>]) -> Result<(), RunnerError> {
        self.prefill_with(segs, &mut |_| Ok(()))
    }

    /// [`MultiModel::prefill`] calling `hook` after each stage of every rank.
    pub fn prefill_with(
        &mut self,
        segs: &[PrefillSeg<'_>],
        hook: PrefillHook<'_>,
    ) -> Result<(), RunnerError> {
        if self.prefill.len() != self.ranks.len() {
            return Err(RunnerError::Unsupported(
                "no batched prefill on this split (enable_prefill)".into(),
            ));
        }
        if segs.len() > self.max_rows {
            return Err(RunnerError::TooManyRows {
                rows: segs.len(),
                max: self.max_rows,
            });
        }
        let limit = self.max_context();
        if self.plan.mode == SplitMode::Tensor {
            return self.prefill_tensor(segs, limit, hook);
        }
        let cfg = &self.cfg;
        let width = HC_STREAMS * cfg.hidden_size;
        let mut last = None;
        for r in 0..self.ranks.len() {
            let (done, rest) = self.prefill.split_at_mut(r);
            let ws = &mut rest[0];
            let rank = &mut self.ranks[r];
            let plan = plan_call(&rank.gpu, cfg, ws, segs, limit)?;
            match done.last() {
                None => {
                    let table =
                        rank.w.embed.as_ref().ok_or_else(|| {
                            RunnerError::Split(format!("rank {r} has no embedding"))
                        })?;
                    embed(&rank.gpu, cfg, &plan, ws, table)?;
                }
                Some(prev) => {
                    self.comm
                        .send(r - 1, r, &prev.io.x, &mut ws.io.x, plan.rows * width)?
                }
            }
            let blocks = Blocks {
                blocks: &rank.w.blocks,
                states: &mut rank.states,
                numerics: self.numerics,
            };
            run_blocks(&rank.gpu, cfg, &plan, blocks, ws, hook)?;
            last = Some(plan);
        }
        let (Some(plan), Some(ws), Some(out)) = (last, self.prefill.last(), self.ranks.last_mut())
        else {
            return Err(RunnerError::Split("no ranks".into()));
        };
        last_rows_to(&out.gpu, &out.cfg, &plan, ws, &mut out.ws.io.x)?;
        out.head(segs.len())
    }
}
