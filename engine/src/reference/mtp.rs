//! The multi-token-prediction block (spec §2.9): from the main model's final streams at
//! position `t` and the token at `t + 1`, predicts the token at `t + 2`.

use super::attention::Segment;
use super::block;
use super::model::Model;
use super::state::LayerState;

/// The MTP block's own window state for one sequence.
#[derive(Debug, Clone)]
pub struct MtpState {
    pub pos: usize,
    pub layer: LayerState,
}

impl Model {
    pub fn new_mtp_state(&self) -> Option<MtpState> {
        let w = self.weights.mtp.as_ref()?;
        Some(MtpState {
            pos: 0,
            layer: LayerState::new(&self.cfg, &w.block),
        })
    }

    /// MTP logits `[T, vocab]` for main-model final streams `[T, n, D]` at positions
    /// `st.pos..` and the tokens that follow each of those positions. `None` without MTP.
    pub fn mtp_forward(
        &self,
        st: &mut MtpState,
        streams: &[f32],
        next_tokens: &[u32],
    ) -> Option<Vec<f32>> {
        let w = self.weights.mtp.as_ref()?;
        let cfg = &self.cfg;
        let (d, n) = (cfg.hidden_size, cfg.hc_mult);
        let rows = next_tokens.len();
        let e: Vec<f32> = next_tokens
            .iter()
            .flat_map(|&t| {
                self.weights.embed[t as usize * d..(t as usize + 1) * d]
                    .iter()
                    .copied()
            })
            .collect();
        let mut x = w
            .head
            .input(cfg, &e, &streams[..rows * n * d], self.numerics);
        let layer = cfg.num_hidden_layers;
        let segs = [Segment {
            rows: 0..rows,
            start_pos: st.pos,
        }];
        let ctx = self.block_ctx(layer);
        block::forward(
            &ctx,
            &w.block,
            layer,
            &mut x,
            next_tokens,
            &segs,
            &mut [&mut st.layer],
            None,
        );
        st.pos += rows;
        Some(self.project_vocab(&x, &w.head.hc_head, &w.head.norm))
    }
}
