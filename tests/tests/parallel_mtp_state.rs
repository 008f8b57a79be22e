//! The split model's MTP block gives the reference `mtp_forward` logits (prefill, then
//! decode steps past the MTP window), and a rewound `SplitState` continued with other tokens
//! equals a fresh run.

mod parallel_common;

use dsv4_engine::api::Numerics;
use dsv4_engine::parallel::{SplitItem, SplitMode, SplitModel, SplitMtpState, SplitState};
use dsv4_engine::reference::{BatchItem, ForwardOptions, Model, MtpState, SeqState};
use dsv4_tests::{golden_set, max_abs_diff};
use parallel_common::tokens;
use std::path::Path;

/// f32 reassociation of the all-reduces only.
const TOL: f32 = 1e-4;
/// Official numerics fake-quantise activations: the main model's reassociation (~1e-6 in
/// the final streams) can flip one FP8 rounding of `h_proj`'s input (seen: 0.44 in tensor x3
/// on the golden model). The end-to-end check of such splits is a smoke test; the MTP
/// block itself is held to `TOL` on the reference's streams.
const FLIP_TOL: f32 = 1.0;

/// What the MTP driver needs of either model.
trait Mtp {
    type State;
    type MtpState;
    fn width(&self) -> usize;
    fn state(&self) -> Self::State;
    fn mtp_state(&self) -> Self::MtpState;
    fn streams(&self, s: &mut Self::State, tokens: &[u32]) -> Vec<f32>;
    fn mtp(&self, m: &mut Self::MtpState, streams: &[f32], next: &[u32]) -> Vec<f32>;
}

impl Mtp for Model {
    type State = SeqState;
    type MtpState = MtpState;
    fn width(&self) -> usize {
        self.cfg.hc_mult * self.cfg.hidden_size
    }
    fn state(&self) -> SeqState {
        self.new_state()
    }
    fn mtp_state(&self) -> MtpState {
        self.new_mtp_state().expect("the golden model has MTP")
    }
    fn streams(&self, state: &mut SeqState, tokens: &[u32]) -> Vec<f32> {
        self.forward_streams(&mut [BatchItem { state, tokens }], None)
    }
    fn mtp(&self, m: &mut MtpState, streams: &[f32], next: &[u32]) -> Vec<f32> {
        self.mtp_forward(m, streams, next).expect("mtp")
    }
}

impl Mtp for SplitModel {
    type State = SplitState;
    type MtpState = SplitMtpState;
    fn width(&self) -> usize {
        self.cfg.hc_mult * self.cfg.hidden_size
    }
    fn state(&self) -> SplitState {
        self.new_state()
    }
    fn mtp_state(&self) -> SplitMtpState {
        self.new_mtp_state().expect("the golden model has MTP")
    }
    fn streams(&self, state: &mut SplitState, tokens: &[u32]) -> Vec<f32> {
        let mut batch = [SplitItem { state, tokens }];
        self.forward_streams(&mut batch).expect("forward")
    }
    fn mtp(&self, m: &mut SplitMtpState, streams: &[f32], next: &[u32]) -> Vec<f32> {
        self.mtp_forward(m, streams, next)
            .expect("mtp")
            .expect("has mtp")
    }
}

/// The main model's final streams of `seq`: a prefill of `prefill` tokens, then one
/// decode step per token.
fn main_streams<M: Mtp>(m: &M, seq: &[u32], prefill: usize) -> Vec<f32> {
    let mut s = m.state();
    let mut streams = m.streams(&mut s, &seq[..prefill]);
    for t in prefill..seq.len() {
        streams.extend(m.streams(&mut s, &seq[t..t + 1]));
    }
    streams
}

/// MTP logits over final `streams` of `seq`: one call for the prefill's positions but the
/// last (whose next token is not known yet), then one row per decoded token.
fn mtp_steps<M: Mtp>(m: &M, streams: &[f32], seq: &[u32], prefill: usize) -> Vec<Vec<f32>> {
    let w = m.width();
    let mut ms = m.mtp_state();
    let first = &streams[..(prefill - 1) * w];
    let mut out = vec![m.mtp(&mut ms, first, &seq[1..prefill])];
    for t in prefill..seq.len() {
        out.push(m.mtp(&mut ms, &streams[(t - 1) * w..t * w], &seq[t..t + 1]));
    }
    out
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], limit: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (step, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: MTP step {step}");
        let d = max_abs_diff(g, w);
        assert!(d <= limit, "{what}: MTP step {step}: max |d| {d}");
    }
}

fn check_mtp(dir: &Path, numerics: Numerics) {
    let reference = Model::load(dir, numerics).expect("reference");
    // 134 tokens: the MTP block's window (128) wraps.
    let seq = tokens(134, reference.cfg.vocab_size, 9);
    let streams = main_streams(&reference, &seq, 130);
    let want = mtp_steps(&reference, &streams, &seq, 130);
    for (mode, ranks) in [
        (SplitMode::Layer, 2),
        (SplitMode::Layer, 4),
        (SplitMode::Tensor, 1),
        (SplitMode::Tensor, 2),
        (SplitMode::Tensor, 3),
    ] {
        let model = SplitModel::load(dir, ranks, mode, numerics).expect("split");
        let exact = mode == SplitMode::Layer || ranks == 1;
        let what = format!("{mode:?} x{ranks} {numerics:?}");
        // The MTP block alone: same input streams as the reference.
        let before = model.collective.traffic().sends;
        let isolated = mtp_steps(&model, &streams, &seq, 130);
        assert_close(&isolated, &want, if exact { 0.0 } else { TOL }, &what);
        // Layer mode: each MTP call sends its embedding rows from the first rank to the last.
        let sends = model.collective.traffic().sends - before;
        let layered = mode == SplitMode::Layer && ranks > 1;
        assert_eq!(sends, if layered { want.len() as u64 } else { 0 }, "{what}");
        // End to end: the split main model's own streams.
        let own = main_streams(&model, &seq, 130);
        let got = mtp_steps(&model, &own, &seq, 130);
        let limit = match (exact, numerics) {
            (true, _) => 0.0,
            (false, Numerics::Reference) => TOL,
            (false, _) => FLIP_TOL,
        };
        assert_close(&got, &want, limit, &format!("{what} end to end"));
    }
}

#[test]
fn golden_mtp_matches_reference() {
    let Some(set) = golden_set("tiny-v4-small") else {
        return;
    };
    check_mtp(&set.join("bf16"), Numerics::Reference);
    check_mtp(&set.join("quant"), Numerics::Official);
}

/// Feeds `tokens` one at a time; returns each step's logits.
fn decode(model: &SplitModel, state: &mut SplitState, tokens: &[u32]) -> Vec<Vec<f32>> {
    tokens
        .iter()
        .map(|t| {
            let mut batch = [SplitItem {
                state: &mut *state,
                tokens: std::slice::from_ref(t),
            }];
            let out = model.forward(&mut batch, ForwardOptions::default());
            out.expect("forward").remove(0).logits
        })
        .collect()
}

fn prefill(model: &SplitModel, state: &mut SplitState, tokens: &[u32]) {
    let mut batch = [SplitItem { state, tokens }];
    model
        .forward(&mut batch, ForwardOptions::default())
        .expect("prefill");
}

#[test]
fn rewound_split_state_continues_like_a_fresh_run() {
    let Some(set) = golden_set("tiny-v4-small") else {
        return;
    };
    let dir = set.join("bf16");
    for (mode, ranks) in [(SplitMode::Tensor, 3), (SplitMode::Layer, 2)] {
        let model = SplitModel::load(&dir, ranks, mode, Numerics::Reference).expect("split");
        let vocab = model.cfg.vocab_size;
        // 124 + 6 decode steps: crosses CSA (4) and HCA (128) compression boundaries.
        let (prefix, first, second) = (
            tokens(124, vocab, 1),
            tokens(6, vocab, 2),
            tokens(6, vocab, 3),
        );
        let mut state = model.new_state();
        prefill(&model, &mut state, &prefix);
        let snap = state.snapshot();
        let bytes = state.rank_bytes();
        decode(&model, &mut state, &first);
        assert_ne!(state.rank_bytes(), bytes, "the caches grew");
        state.restore(&snap);
        assert_eq!(state.pos, 124);
        assert_eq!(state.rank_bytes(), bytes);
        let rewound = decode(&model, &mut state, &second);

        let mut fresh = model.new_state();
        prefill(&model, &mut fresh, &prefix);
        let want = decode(&model, &mut fresh, &second);
        assert_eq!(rewound, want, "{mode:?} x{ranks}");
        assert_eq!(state.rank_bytes(), fresh.rank_bytes());
    }
}
