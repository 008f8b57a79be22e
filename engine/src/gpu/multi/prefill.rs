//! Batched prefill of the layer split: each rank runs the one-GPU per-block prefill
//! ([`crate::gpu::prefill::run_blocks`]) over the call's rows for its layers and hands the residual
//! streams `[rows, 4, hidden]` bf16 on to the next rank (the decode step's hand-off: an NCCL send/receive,
//! or a device copy for ranks simulated on one GPU); the last rank runs the head on each segment's last
//! row. Every rank plans the call on its own workspace (host layout, uploads on its stream), so nothing
//! waits on the host between ranks. Same kernels on the same inputs as on one GPU: bit-identical.
//!
//! The tensor split has no batched prefill yet (its chunks run as decode steps): it needs the prefill
//! attention over a rank's heads with the `wo_b` columns into an f32 partial (and the latent exchange),
//! the prefill MoE over the rank's experts only (localised ids, masked slots, the rank sum) and the
//! shared-expert rows, with an all-reduce of `[rows, hidden]` f32 after each sub-block.

use super::model::MultiModel;
use crate::gpu::prefill::{embed, last_rows_to, plan_call, run_blocks, Blocks, PrefillSeg};
use crate::gpu::prefill::{PrefillHook, PrefillWs};
use crate::gpu::RunnerError;
use crate::parallel::plan::SplitMode;
use dsv4_kernels::HC_STREAMS;

impl MultiModel {
    /// Gives every rank a prefill workspace of `max_tokens` rows (layer split only: see the module doc).
    /// Returns false, holding none, when the split has no batched prefill or a workspace does not fit.
    pub fn enable_prefill(&mut self, max_tokens: usize) -> bool {
        self.prefill.clear();
        if self.plan.mode != SplitMode::Layer {
            return false;
        }
        let limit = self.max_context();
        let made: Result<Vec<PrefillWs>, RunnerError> = self
            .ranks
            .iter()
            .map(|r| PrefillWs::new(&r.gpu, &self.cfg, max_tokens, limit))
            .collect();
        self.prefill = made.unwrap_or_default();
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
        let (limit, cfg) = (self.max_context(), &self.cfg);
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
                Some(prev) => self
                    .comm
                    .send(r - 1, r, &prev.x, &mut ws.x, plan.rows * width)?,
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
        last_rows_to(&out.gpu, &out.cfg, &plan, ws, &mut out.ws.x)?;
        out.head(segs.len())
    }
}
