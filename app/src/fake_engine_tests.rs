use super::*;

fn quick() -> FakeEngineOptions {
    FakeEngineOptions {
        token_delay: Duration::from_millis(1),
        load_step_delay: Duration::from_millis(1),
        ..FakeEngineOptions::default()
    }
}

fn submit(turn: TurnId, thinking: ThinkingMode) -> Command {
    Command::Submit {
        turn,
        conversation: 1,
        messages: vec![ChatMessage {
            role: dsv4_engine::api::Role::User,
            content: "hello there".into(),
            reasoning: None,
        }],
        sampling: Default::default(),
        thinking,
    }
}

/// Events up to and including the first one matching `last` (fails after 5 s).
fn collect_until(rx: &Receiver<Event>, last: impl Fn(&Event) -> bool) -> Vec<Event> {
    let mut events = Vec::new();
    loop {
        let event = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let done = last(&event);
        events.push(event);
        if done {
            return events;
        }
    }
}

#[test]
fn streams_reasoning_then_answer_then_finishes() {
    let (tx, rx, thread) = spawn(quick(), EngineSettings::default(), Box::new(|| {})).unwrap();
    tx.send(Command::LoadModel(ModelSource::Demo)).unwrap();
    tx.send(submit(7, ThinkingMode::High)).unwrap();
    let events = collect_until(&rx, |e| matches!(e, Event::Finished { .. }));
    tx.send(Command::Shutdown).unwrap();
    thread.join().unwrap();
    assert!(matches!(events[0], Event::LoadProgress { .. }));
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Ready(i) if i.is_demo)));
    let (mut reasoning, mut answer) = (String::new(), String::new());
    for e in &events {
        if let Event::Delta { kind, text, .. } = e {
            match kind {
                DeltaKind::Reasoning => reasoning.push_str(text),
                DeltaKind::Answer => answer.push_str(text),
            }
        }
    }
    assert!(reasoning.contains("hello there"));
    assert!(answer.contains("**demo reply**"));
    let Some(Event::Finished { reason, stats, .. }) = events.last() else {
        panic!("last event should be Finished: {:?}", events.last());
    };
    assert_eq!(*reason, FinishReason::EndOfSentence);
    assert!(stats.generated_tokens > 10);
}

#[test]
fn cancel_finishes_the_turn_as_cancelled() {
    let options = FakeEngineOptions {
        token_delay: Duration::from_millis(20),
        answer_repeats: 50,
        ..quick()
    };
    let (tx, rx, thread) = spawn(options, EngineSettings::default(), Box::new(|| {})).unwrap();
    tx.send(submit(3, ThinkingMode::Off)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    tx.send(Command::Cancel(3)).unwrap();
    let finished = rx
        .iter()
        .find_map(|e| match e {
            Event::Finished { reason, .. } => Some(reason),
            _ => None,
        })
        .unwrap();
    assert_eq!(finished, FinishReason::Cancelled);
    drop(tx);
    thread.join().unwrap();
}

#[test]
fn can_be_told_to_fail() {
    let options = FakeEngineOptions {
        fail_load: Some("out of memory".into()),
        fail_turns: Some("prompt too long".into()),
        ..quick()
    };
    let (tx, rx, thread) = spawn(options, EngineSettings::default(), Box::new(|| {})).unwrap();
    tx.send(Command::LoadModel(ModelSource::Demo)).unwrap();
    tx.send(submit(1, ThinkingMode::Off)).unwrap();
    let events = collect_until(&rx, |e| matches!(e, Event::TurnFailed { .. }));
    drop(tx);
    thread.join().unwrap();
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Fatal { message } if message == "out of memory")));
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::TurnFailed { turn: 1, .. })));
}
