//! Multi-token prediction on the split model, as [`crate::reference::Model::mtp_forward`]:
//! the MTP block runs on the last rank in layer mode (the next tokens' embedding rows are
//! sent there from the first rank, which holds the embedding), and split like any block in
//! tensor mode (the input projections are replicated).

use super::collective::Collective;
use super::plan::SplitMode;
use super::rank::MtpHead;
use super::split_model::{SplitError, SplitModel};
use super::state::SplitMtpState;
use super::tp::RankLayer;
use crate::reference::attention::{BlockCtx, Segment};
use crate::reference::block;
use crate::reference::state::LayerState;

impl<C: Collective<Buf = [f32]>> SplitModel<C> {
    /// A fresh MTP state (`None` without MTP).
    pub fn new_mtp_state(&self) -> Option<SplitMtpState> {
        self.globals.mtp.as_ref()?;
        let ranks = self
            .ranks
            .iter()
            .map(|r| r.mtp.as_ref().map(|m| LayerState::new(&self.cfg, &m.block)))
            .collect();
        Some(SplitMtpState { pos: 0, ranks })
    }

    /// MTP logits `[T, vocab]` for final streams `[T, n, D]` at positions `st.pos..` and the
    /// tokens that follow each of those positions. `None` without MTP.
    pub fn mtp_forward(
        &self,
        st: &mut SplitMtpState,
        streams: &[f32],
        next_tokens: &[u32],
    ) -> Result<Option<Vec<f32>>, SplitError> {
        let Some(head) = &self.globals.mtp else {
            return Ok(None);
        };
        let mut x = self.mtp_input(head, streams, next_tokens)?;
        let layer = self.cfg.num_hidden_layers;
        let segs = [Segment {
            rows: 0..next_tokens.len(),
            start_pos: st.pos,
        }];
        let rope = &self.ropes[layer];
        match self.plan.mode {
            SplitMode::Tensor => {
                let mut ranks = self.mtp_ranks(st)?;
                super::tp::block(self, rope, &mut ranks, &mut x, next_tokens, &segs)?;
            }
            SplitMode::Layer => {
                for (rank, state) in self.ranks.iter().zip(st.ranks.iter_mut()) {
                    let (Some(m), Some(s)) = (&rank.mtp, state) else {
                        continue;
                    };
                    let ctx = BlockCtx {
                        cfg: &rank.attn_cfg,
                        rope,
                        numerics: self.numerics,
                    };
                    let segs = &segs;
                    block::forward(
                        &ctx,
                        &m.block,
                        layer,
                        &mut x,
                        next_tokens,
                        segs,
                        &mut [s],
                        None,
                    );
                }
            }
        }
        st.pos += next_tokens.len();
        Ok(Some(self.vocab(&x, &head.hc_head, &head.norm)))
    }

    /// The MTP block's input streams: `h_proj(hnorm(h)) + e_proj(enorm(embed(next)))`.
    fn mtp_input(
        &self,
        head: &MtpHead,
        streams: &[f32],
        next_tokens: &[u32],
    ) -> Result<Vec<f32>, SplitError> {
        let cfg = &self.cfg;
        let (d, n, rows) = (cfg.hidden_size, cfg.hc_mult, next_tokens.len());
        let h = streams.get(..rows * n * d).ok_or(SplitError::MtpStreams {
            rows,
            got: streams.len(),
        })?;
        let e = self.mtp_embedding(next_tokens)?;
        Ok(head.input(cfg, &e, h, self.numerics))
    }

    /// `[T, D]` embedding rows of `tokens`, on the rank that runs MTP.
    fn mtp_embedding(&self, tokens: &[u32]) -> Result<Vec<f32>, SplitError> {
        let d = self.cfg.hidden_size;
        let e: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| self.globals.embed[t as usize * d..(t as usize + 1) * d].to_vec())
            .collect();
        let last = self.plan.world() - 1;
        if self.plan.mode == SplitMode::Tensor || last == 0 {
            return Ok(e);
        }
        // Layer mode: the embedding lives on the first rank, MTP on the last.
        let mut received = vec![0.0f32; e.len()];
        self.collective.send(0, last, &e, &mut received)?;
        Ok(received)
    }

    /// Every rank's share of the MTP block with its state (tensor mode).
    fn mtp_ranks<'a>(
        &'a self,
        st: &'a mut SplitMtpState,
    ) -> Result<Vec<RankLayer<'a>>, SplitError> {
        self.ranks
            .iter()
            .zip(&self.plan.ranks)
            .zip(st.ranks.iter_mut())
            .map(|((rank, rp), state)| {
                let missing = SplitError::NothingHolds("the MTP block");
                let (Some(m), Some(s)) = (&rank.mtp, state) else {
                    return Err(missing);
                };
                let out = m.out.as_ref().ok_or(missing)?;
                Ok(RankLayer {
                    cfg: &rank.attn_cfg,
                    block: &m.block,
                    out,
                    owned: rp.owned_groups.clone(),
                    states: vec![s],
                })
            })
            .collect()
    }
}
