//! The engine thread on the CUDA backend (skipped without a GPU): the demo model (FP8/FP4) loads
//! onto the GPU, replies stream, and a follow-up turn reuses the cached prefix through GPU
//! snapshots and runs to its full length, as does a fresh prefill of the whole conversation.
//! (Their texts are not compared: on the GPU the reused reply went through decode kernels and the
//! fresh one through the batched prefill, which round differently, and the random demo model's
//! near-tied logits turn rounding into other tokens. That reuse restores the right state is
//! checked against the CPU reference in engine/tests/gpu_prefix_reuse.rs; the texts are compared
//! exactly on the CPU backend in engine_turns.rs.)

use dsv4_engine::api::{
    ChatMessage, Command, EngineSettings, Event, ModelSource, Role, ThinkingMode,
};
use dsv4_engine::gpu::{probe_gpu, GpuProbe};
use dsv4_engine::handle::spawn;
use dsv4_tests::engine_harness::{collect, greedy, next_event, user};
use std::sync::Arc;

#[test]
fn engine_runs_the_demo_model_on_the_gpu_with_prefix_reuse() {
    if let GpuProbe::Unavailable(why) = probe_gpu() {
        eprintln!("SKIP: {why}");
        return;
    }
    let cache = tempfile::tempdir().expect("tempdir");
    std::env::set_var("DSV4_CACHE_DIR", cache.path());
    let h = spawn(EngineSettings::default(), Arc::new(|| {})).expect("spawn");
    h.send(Command::LoadModel(ModelSource::Demo));
    let info = loop {
        match next_event(&h) {
            Event::Ready(info) => break info,
            Event::Fatal { message } => panic!("{message}"),
            _ => {}
        }
    };
    eprintln!("backend: {}", info.backend);
    assert!(
        info.backend.to_lowercase().contains("cuda"),
        "not on the GPU: {}",
        info.backend
    );
    assert!(!info.gpus.is_empty());

    for thinking in [ThinkingMode::Off, ThinkingMode::High] {
        let first = vec![user("Tell me about the sea.")];
        let submit = |turn, conversation, messages: Vec<ChatMessage>, n| Command::Submit {
            turn,
            conversation,
            messages,
            sampling: greedy(n),
            thinking,
        };
        let base = if thinking == ThinkingMode::Off { 0 } else { 10 };
        h.send(submit(base + 1, base + 7, first.clone(), 12));
        let r1 = collect(&h, &[base + 1])
            .remove(&(base + 1))
            .expect("turn 1");
        assert_eq!(
            r1.finished.as_ref().expect("finished").1.generated_tokens,
            12
        );
        let reply = ChatMessage {
            role: Role::Assistant,
            content: r1.answer.clone(),
            reasoning: (!r1.reasoning.is_empty()).then(|| r1.reasoning.clone()),
        };
        let follow = vec![first[0].clone(), reply, user("And the mountains?")];
        h.send(submit(base + 2, base + 7, follow.clone(), 16));
        let reused = collect(&h, &[base + 2])
            .remove(&(base + 2))
            .expect("turn 2");
        h.send(submit(base + 3, base + 8, follow, 16));
        let fresh = collect(&h, &[base + 3])
            .remove(&(base + 3))
            .expect("turn 3");
        let done = |r: &dsv4_tests::engine_harness::TurnResult| {
            r.finished.as_ref().expect("finished").1.clone()
        };
        let (reused, fresh) = (done(&reused), done(&fresh));
        assert!(reused.cached_prompt_tokens > 0, "{thinking:?}: no reuse");
        assert_eq!(fresh.cached_prompt_tokens, 0, "{thinking:?}");
        assert_eq!(reused.prompt_tokens, fresh.prompt_tokens, "{thinking:?}");
        assert_eq!(
            (reused.generated_tokens, fresh.generated_tokens),
            (16, 16),
            "{thinking:?}"
        );
    }
}
