//! One decoder block with mHC (spec §2.2): HCPre → norm → attention → HCPost, then
//! HCPre → norm → MoE → HCPost.

use super::attention::{self, BlockCtx, Segment};
use super::mhc::{hc_post, hc_pre};
use super::moe;
use super::ops::rmsnorm_rows;
use super::state::LayerState;
use super::weights::{BlockWeights, HcParams};

/// Receives named intermediate activations (`layers.{i}.attn_input`, ...) for comparison
/// against another implementation. Names follow the golden `activations.safetensors`.
pub trait Probe {
    fn record(&mut self, name: &str, data: &[f32]);
}

/// Records into an optional probe.
pub fn record(probe: &mut Option<&mut dyn Probe>, name: impl FnOnce() -> String, data: &[f32]) {
    if let Some(p) = probe.as_deref_mut() {
        p.record(&name(), data);
    }
}

/// Runs block `layer` in place on `streams` `[T, n, D]`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    ctx: &BlockCtx<'_>,
    w: &BlockWeights,
    layer: usize,
    streams: &mut [f32],
    tokens: &[u32],
    segs: &[Segment],
    states: &mut [&mut LayerState],
    mut probe: Option<&mut dyn Probe>,
) {
    let cfg = ctx.cfg;
    let tag = |s: &str| format!("layers.{layer}.{s}");
    record(&mut probe, || tag("input_streams"), streams);

    let (mut a, mix) = collapse(ctx, &w.hc_attn, streams);
    rmsnorm_rows(&mut a, &w.attn_norm, cfg.rms_norm_eps);
    record(&mut probe, || tag("attn_input"), &a);
    let attn_out = attention::forward(ctx, &w.attn, &a, segs, states);
    record(&mut probe, || tag("attn_out"), &attn_out);
    hc_post(&attn_out, streams, &mix, cfg.hc_mult, cfg.hidden_size);
    record(&mut probe, || tag("after_attn_streams"), streams);

    let (mut m, mix) = collapse(ctx, &w.hc_ffn, streams);
    rmsnorm_rows(&mut m, &w.ffn_norm, cfg.rms_norm_eps);
    record(&mut probe, || tag("ffn_input"), &m);
    let (ffn_out, routes) = moe::forward(cfg, &w.moe, &m, tokens, ctx.numerics);
    record(&mut probe, || tag("ffn_out"), &ffn_out);
    if probe.is_some() {
        let ids: Vec<f32> = routes
            .iter()
            .flat_map(|r| r.experts.iter().map(|&e| e as f32))
            .collect();
        record(&mut probe, || tag("router_experts"), &ids);
    }
    hc_post(&ffn_out, streams, &mix, cfg.hc_mult, cfg.hidden_size);
    record(&mut probe, || tag("output_streams"), streams);
}

fn collapse(
    ctx: &BlockCtx<'_>,
    hc: &HcParams,
    streams: &[f32],
) -> (Vec<f32>, Vec<super::mhc::HcMix>) {
    let cfg = ctx.cfg;
    hc_pre(
        hc,
        streams,
        cfg.hc_mult,
        cfg.hidden_size,
        cfg.rms_norm_eps,
        cfg.hc_eps,
        cfg.hc_sinkhorn_iters,
    )
}
