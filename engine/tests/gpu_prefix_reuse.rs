//! Prefix reuse on the GPU the way the engine does it (prefill a prompt, decode a reply, snapshot,
//! wander off, restore, prefill the follow-up, decode) against a fresh prefill of the whole
//! conversation and against the CPU reference fed the same tokens. The two GPU runs take different
//! kernels for the same tokens (the reply went through decode steps in one, through the batched
//! prefill in the other), so they agree to rounding, not bit for bit: each is held to the golden
//! README's gates against the CPU reference, which a wrong snapshot or restore fails by far:
//! reference numerics the bf16-engine gate (median row cosine >= 0.999, argmax agreement >= 0.75),
//! official numerics the official smoke gate (median row max |dlogit| <= 1, agreement >= 0.7).
//! SKIPs without a GPU.
mod gpu_model_util;

use dsv4_engine::api::Numerics;
use dsv4_engine::backend::{Backend, SeqId, Work};
use gpu_model_util::*;

/// Feeds `chunks` in turn (each one forward) and returns the logits after each chunk.
fn feed(b: &mut dyn Backend, seq: SeqId, chunks: &[&[u32]]) -> Vec<Vec<f32>> {
    chunks
        .iter()
        .flat_map(|tokens| b.forward(&[Work { seq, tokens }]).expect("forward"))
        .collect()
}

fn singles(tokens: &[u32]) -> Vec<&[u32]> {
    tokens.iter().map(std::slice::from_ref).collect()
}

#[test]
fn reuse_through_a_snapshot_matches_a_fresh_prefill_and_the_cpu() {
    let Some(case) = golden_or_skip() else { return };
    let (p, f) = (&case.prompt, &case.fed);
    // Turn 1: prompt + a 12-token reply; turn 2 adds 60 prompt tokens, then 20 decode steps.
    let (prompt1, reply, follow, decode) = (&p[..200], &f[..12], &p[200..260], &f[12..32]);
    let detour: Vec<u32> = p[300..340].to_vec();
    for numerics in [Numerics::Reference, Numerics::Official] {
        let mut gpu = gpu_backend(&case, numerics, true);
        let seq = gpu.create_seq().expect("seq");
        feed(&mut gpu, seq, &[prompt1]);
        feed(&mut gpu, seq, &singles(reply));
        let snap = gpu.snapshot(seq).expect("snapshot");
        feed(&mut gpu, seq, &[&detour]);
        gpu.restore(seq, snap).expect("restore");
        let mut reused = feed(&mut gpu, seq, &[follow]);
        reused.extend(feed(&mut gpu, seq, &singles(decode)));

        let whole: Vec<u32> = [prompt1, reply, follow].concat();
        let fresh_seq = gpu.create_seq().expect("seq");
        let mut fresh = feed(&mut gpu, fresh_seq, &[&whole]);
        fresh.extend(feed(&mut gpu, fresh_seq, &singles(decode)));

        let ck = dsv4_engine::model::checkpoint::Checkpoint::open(&case.dir).expect("checkpoint");
        let model = dsv4_engine::reference::Model::from_checkpoint(&ck, numerics).expect("model");
        let mut cpu = dsv4_engine::backend::CpuBackend::new(model, 4096);
        let cs = cpu.create_seq().expect("seq");
        let mut want = feed(&mut cpu, cs, &[&whole]);
        want.extend(feed(&mut cpu, cs, &singles(decode)));

        for (name, got) in [("reused", &reused), ("fresh", &fresh)] {
            let (agree, median, min) = compare(got, &want);
            let (dmed, _) = official_smoke(got, &want);
            eprintln!(
                "{numerics:?} {name}: {} rows, argmax agreement {agree:.3}, median cosine {median:.6}, min {min:.6}, median max|dlogit| {dmed:.4}",
                got.len()
            );
            let pass = match numerics {
                Numerics::Reference => agree >= 0.75 && median >= 0.999,
                Numerics::Official => agree >= 0.7 && dmed <= 1.0,
            };
            assert!(
                pass,
                "{numerics:?} {name} vs CPU: {agree} / {median} / {dmed}"
            );
        }
        let (agree, median, _) = compare(&reused, &fresh);
        eprintln!(
            "{numerics:?} reused vs fresh: argmax agreement {agree:.3}, median cosine {median:.6}"
        );
    }
}
