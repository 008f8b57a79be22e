//! The engine thread end to end on a small random model with the real tokenizer: batching,
//! prefix reuse, cancel, stop strings, context refusal and load failures.

use dsv4_engine::api::{
    ChatMessage, Command, EngineSettings, Event, FinishReason, ModelSource, Role, ThinkingMode,
};
use dsv4_tests::engine_harness::{collect, engine_with, greedy, next_event, submit, user};

fn settings(max_batch: usize) -> EngineSettings {
    EngineSettings {
        max_batch,
        prefill_chunk: 16,
        ..EngineSettings::default()
    }
}

#[test]
fn batched_turns_equal_each_turn_alone() {
    let prompts = [
        "Hello there",
        "Write a haiku about rust",
        "1 2 3 4 5 6 7 8 9 10 11 12",
        "¿Qué tal? 你好",
    ];
    let batched = engine_with(settings(4));
    for (i, p) in prompts.iter().enumerate() {
        submit(
            &batched,
            i as u64,
            100 + i as u64,
            vec![user(p)],
            greedy(10),
        );
    }
    let together = collect(&batched, &[0, 1, 2, 3]);
    let alone_engine = engine_with(settings(1));
    for (i, p) in prompts.iter().enumerate() {
        submit(
            &alone_engine,
            10 + i as u64,
            200 + i as u64,
            vec![user(p)],
            greedy(10),
        );
        let alone = collect(&alone_engine, &[10 + i as u64]);
        let (a, b) = (&together[&(i as u64)], &alone[&(10 + i as u64)]);
        assert_eq!(a.answer, b.answer, "prompt {p:?}");
        let (ra, sa) = a.finished.clone().expect("finished");
        assert_eq!(ra, FinishReason::MaxTokens);
        assert_eq!(sa.generated_tokens, 10);
    }
}

/// A follow-up turn reuses the cached prefix and gives the same tokens as a fresh prefill of
/// the whole conversation, in both thinking modes (thinking drops earlier reasoning).
#[test]
fn follow_up_with_prefix_reuse_equals_full_prefill() {
    for thinking in [ThinkingMode::Off, ThinkingMode::High] {
        let h = engine_with(settings(2));
        let first = vec![user("Tell me about the sea.")];
        h.send(Command::Submit {
            turn: 1,
            conversation: 7,
            messages: first.clone(),
            sampling: greedy(6),
            thinking,
        });
        let r1 = collect(&h, &[1]).remove(&1).expect("turn 1");
        let reply = ChatMessage {
            role: Role::Assistant,
            content: r1.answer.clone(),
            reasoning: (!r1.reasoning.is_empty()).then(|| r1.reasoning.clone()),
        };
        let follow = vec![first[0].clone(), reply, user("And the mountains?")];
        h.send(Command::Submit {
            turn: 2,
            conversation: 7,
            messages: follow.clone(),
            sampling: greedy(8),
            thinking,
        });
        let reused = collect(&h, &[2]).remove(&2).expect("turn 2");
        h.send(Command::Submit {
            turn: 3,
            conversation: 8,
            messages: follow,
            sampling: greedy(8),
            thinking,
        });
        let fresh = collect(&h, &[3]).remove(&3).expect("turn 3");
        let cached = reused
            .finished
            .as_ref()
            .expect("finished")
            .1
            .cached_prompt_tokens;
        assert!(cached > 0, "{thinking:?}: nothing reused");
        assert_eq!(
            fresh
                .finished
                .as_ref()
                .expect("finished")
                .1
                .cached_prompt_tokens,
            0
        );
        assert_eq!(
            (reused.answer, reused.reasoning),
            (fresh.answer, fresh.reasoning),
            "{thinking:?}"
        );
    }
}

#[test]
fn cancel_takes_effect_within_a_step() {
    let h = engine_with(settings(2));
    submit(&h, 1, 1, vec![user("Count to a thousand")], greedy(100_000));
    h.send(Command::Cancel(1));
    let r = collect(&h, &[1]).remove(&1).expect("turn");
    let (reason, stats) = r.finished.expect("finished");
    assert_eq!(reason, FinishReason::Cancelled);
    assert!(
        stats.generated_tokens <= 1,
        "generated {} after an immediate cancel",
        stats.generated_tokens
    );

    // Cancel a turn that is already decoding: it stops at the next step boundary.
    submit(&h, 2, 2, vec![user("Count to a thousand")], greedy(100_000));
    loop {
        if let Event::Delta { turn: 2, .. } = next_event(&h) {
            break;
        }
    }
    h.send(Command::Cancel(2));
    let r = collect(&h, &[2]).remove(&2).expect("turn");
    assert_eq!(r.finished.expect("finished").0, FinishReason::Cancelled);
}

#[test]
fn stop_string_ends_the_answer_before_it() {
    let h = engine_with(settings(1));
    submit(&h, 1, 1, vec![user("Say something")], greedy(24));
    let full = collect(&h, &[1]).remove(&1).expect("turn").answer;
    let chars: Vec<char> = full.chars().collect();
    assert!(
        chars.len() > 8,
        "answer too short to pick a stop string: {full:?}"
    );
    let stop: String = chars[5..8].iter().collect();
    let mut sampling = greedy(24);
    sampling.stop_strings = vec![stop.clone()];
    submit(&h, 2, 2, vec![user("Say something")], sampling);
    let r = collect(&h, &[2]).remove(&2).expect("turn");
    let cut = full.find(&stop).expect("stop string occurs");
    assert_eq!(r.answer, full[..cut]);
    assert_eq!(r.finished.expect("finished").0, FinishReason::StopString);
}

#[test]
fn over_long_request_is_refused_with_a_reason() {
    let h = engine_with(EngineSettings {
        max_context: 64,
        ..settings(1)
    });
    let long = "word ".repeat(200);
    submit(&h, 1, 1, vec![user(&long)], greedy(4));
    let r = collect(&h, &[1]).remove(&1).expect("turn");
    let msg = r.failed.expect("refused");
    assert!(msg.contains("context limit of 64"), "{msg}");
    // The engine still serves afterwards.
    submit(&h, 2, 2, vec![user("hi")], greedy(3));
    assert!(collect(&h, &[2])[&2].finished.is_some());
}

#[test]
fn bad_model_path_is_reported_and_engine_keeps_answering() {
    let h = engine_with(settings(1));
    h.send(Command::LoadModel(ModelSource::Dir(
        "/nonexistent/dsv4-model".into(),
    )));
    let message = loop {
        match next_event(&h) {
            Event::Fatal { message } => break message,
            Event::Ready(_) => panic!("loaded a missing model"),
            _ => {}
        }
    };
    assert!(message.contains("/nonexistent/dsv4-model"), "{message}");
    submit(&h, 1, 1, vec![user("hi")], greedy(3));
    let r = collect(&h, &[1]).remove(&1).expect("turn");
    assert!(r.failed.expect("no model").contains("no model"));
    h.send(Command::LoadModel(ModelSource::Dir(
        dsv4_tests::engine_harness::small_real_vocab_model(),
    )));
    loop {
        if let Event::Ready(_) = next_event(&h) {
            break;
        }
    }
    submit(&h, 2, 2, vec![user("hi")], greedy(3));
    assert!(collect(&h, &[2])[&2].finished.is_some());
}

#[test]
fn concurrent_first_starts_create_one_usable_demo_model() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("demo-model");
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let d = dir.clone();
            std::thread::spawn(move || dsv4_engine::runtime::load::ensure_demo(&d))
        })
        .collect();
    for t in threads {
        t.join().expect("thread").expect("demo model created");
    }
    dsv4_engine::model::checkpoint::Checkpoint::open(&dir).expect("demo model opens");
}
