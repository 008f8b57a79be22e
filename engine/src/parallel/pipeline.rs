//! Layer mode: each rank runs its consecutive layers with the unchanged reference block and
//! hands the residual streams to the next rank.

use super::collective::Collective;
use super::split_model::{layer_states, SplitError, SplitItem, SplitModel};
use crate::reference::attention::{BlockCtx, Segment};
use crate::reference::block;

pub(super) fn run<C: Collective<Buf = [f32]>>(
    m: &SplitModel<C>,
    streams: &mut Vec<f32>,
    tokens: &[u32],
    segs: &[Segment],
    batch: &mut [SplitItem<'_>],
) -> Result<(), SplitError> {
    for (r, rank) in m.ranks.iter().enumerate() {
        if r > 0 {
            // The hand-off: rank r-1's streams arrive in rank r's buffer.
            let mut received = vec![0.0f32; streams.len()];
            m.collective.send(r - 1, r, streams, &mut received)?;
            *streams = received;
        }
        for (i, w) in rank.blocks.iter().enumerate() {
            let layer = rank.layers.start + i;
            let ctx = BlockCtx {
                cfg: &rank.attn_cfg,
                rope: &m.ropes[layer],
                numerics: m.numerics,
            };
            let mut states = layer_states(batch, r, i);
            block::forward(&ctx, w, layer, streams, tokens, segs, &mut states, None);
        }
    }
    Ok(())
}
