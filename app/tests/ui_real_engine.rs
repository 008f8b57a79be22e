//! Headless interaction tests against the REAL engine thread (`EngineChoice::Real`) running
//! the built-in demo model on the CPU: no display, no GPU, no wgpu.
//!
//! The demo model has random weights, so nothing here looks at what a reply says, only at
//! what the app and engine do with it. Every wait steps frames until a condition holds (with a
//! generous deadline); no assertion depends on how long anything took.
//!
//! The UI thread never blocks on the engine: each test drives the app one frame at a time from
//! the test thread while the engine loads and generates on its own thread, and sees the states
//! in between (loading, a reply growing over several frames, typing and switching conversations
//! while a reply streams). A blocking call would skip straight from "sent" to "finished".
#![allow(clippy::unwrap_used)]

mod real_engine;

use egui_kittest::kittest::Queryable;
use real_engine::*;

#[test]
fn the_demo_model_loads_and_a_reply_streams_in() {
    let dir = data_dir(Some(64));
    let mut h = start(dir.path());
    // The app shows the load in progress before the engine says it is ready.
    step_until(&mut h, "loading or ready", |h| {
        has_text(h, "Engine: loading") || has_text(h, "Engine: ready")
    });
    wait_ready(&mut h);
    assert!(!h.state().is_fake_engine());
    assert!(
        has_text(&h, "replies are noise"),
        "the demo must be labelled"
    );

    type_message(&mut h, "Hello engine");
    assert!(h.state().is_generating(), "sending returns at once");
    let lengths = watch_reply_grow(&mut h);
    assert!(
        lengths.len() >= 2,
        "the reply must arrive over several frames, saw lengths {lengths:?}"
    );
    h.step();
    let conversation = h.state().selected_conversation().unwrap();
    assert_eq!(conversation.title, "Hello engine");
    assert_eq!(conversation.messages.len(), 2);
    let stats = conversation.messages[1].stats.clone().unwrap();
    assert!(stats.generated_tokens >= 1 && stats.generated_tokens <= 64);
    assert!(stats.prompt_tokens > 0);
    assert!(has_text(&h, "decode"), "stats line under the reply");
    assert!(has_text(&h, "Context:"), "context meter");
    assert_eq!(h.get_by_label("Message").value().unwrap_or_default(), "");
}

#[test]
fn stop_ends_a_long_reply() {
    // A budget the demo model cannot finish while the test watches.
    let dir = data_dir(Some(100_000));
    let mut h = start(dir.path());
    wait_ready(&mut h);
    type_message(&mut h, "Tell me a very long story");
    step_until(&mut h, "some streamed text", |h| {
        h.state().is_generating() && !last_reply(h).content.is_empty()
    });
    // The composer still takes typing while the reply streams.
    h.get_by_label("Message").focus();
    h.step();
    h.get_by_label("Message").type_text("next question");
    h.step();
    assert!(h.state().is_generating());
    h.get_by_label("Stop (Esc)").click();
    step_until(&mut h, "turn cancelled", |h| !h.state().is_generating());
    h.step();
    assert!(h.query_by_label("Stopped.").is_some());
    let reply = last_reply(&h);
    assert_eq!(reply.note.as_deref(), Some("Stopped."));
    assert!(reply.stats.as_ref().unwrap().generated_tokens < 100_000);
    assert_eq!(
        h.get_by_label("Message").value().unwrap_or_default(),
        "next question"
    );
    // The engine serves the next turn after a cancel.
    h.get_by_label("Send").click();
    h.step();
    assert!(h.state().is_generating());
    h.step(); // Send turns into Stop on the next frame
    h.get_by_label("Stop (Esc)").click();
    step_until(&mut h, "second turn ended", |h| !h.state().is_generating());
    assert_eq!(h.state().selected_conversation().unwrap().messages.len(), 4);
}

#[test]
fn regenerate_and_edit_ask_the_engine_again() {
    let dir = data_dir(Some(16));
    let mut h = start(dir.path());
    wait_ready(&mut h);
    type_message(&mut h, "first question");
    wait_reply_done(&mut h);

    h.get_by_label("Regenerate").click();
    h.step();
    assert!(h.state().is_generating());
    assert!(
        last_reply(&h).content.is_empty(),
        "the old reply is replaced"
    );
    wait_reply_done(&mut h);
    assert_eq!(h.state().selected_conversation().unwrap().messages.len(), 2);
    assert!(last_reply(&h).stats.is_some());

    h.get_by_label("Edit").click();
    h.run_steps(2);
    h.get_by_label("Edit message").focus();
    h.step();
    h.get_by_label("Edit message").type_text(" again");
    h.step();
    h.get_by_label("Send edited").click();
    h.step();
    assert!(h.state().is_generating());
    wait_reply_done(&mut h);
    let messages = &h.state().selected_conversation().unwrap().messages;
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0].content, "first question again");
    let stats = messages[1].stats.as_ref().unwrap();
    assert!(stats.generated_tokens >= 1);
}

#[test]
fn switching_conversations_while_a_reply_streams() {
    let dir = data_dir(Some(100_000));
    let mut h = start(dir.path());
    wait_ready(&mut h);
    type_message(&mut h, "Topic A");
    step_until(&mut h, "A streams", |h| !last_reply(h).content.is_empty());
    h.key_press(egui::Key::Escape);
    step_until(&mut h, "A stopped", |h| !h.state().is_generating());
    h.step();
    let first_a = last_reply(&h).content.clone();

    h.get_by_label("New conversation").click();
    h.step();
    type_message(&mut h, "Topic B");
    step_until(&mut h, "B streams", |h| !last_reply(h).content.is_empty());
    // Switch to A mid-reply: A's history shows, B keeps streaming into B.
    h.get_by_label("Topic A").click();
    h.run_steps(2);
    assert_eq!(h.state().selected_conversation().unwrap().title, "Topic A");
    assert!(h.state().is_generating());
    assert_eq!(last_reply(&h).content, first_a, "A is untouched");
    h.key_press(egui::Key::Escape);
    step_until(&mut h, "B stopped", |h| !h.state().is_generating());
    h.step();

    h.get_by_label("Topic B").click();
    h.step();
    let b = h.state().selected_conversation().unwrap();
    assert_eq!(b.title, "Topic B");
    assert_eq!(b.messages[1].note.as_deref(), Some("Stopped."));
    assert!(!b.messages[1].content.is_empty());
    assert_eq!(h.state().conversations().len(), 2);
}

#[test]
fn a_changed_setting_reaches_the_engine_and_persists() {
    let dir = data_dir(None);
    {
        let mut h = start(dir.path());
        wait_ready(&mut h);
        h.get_by_label("Settings").click();
        h.run_steps(3);
        // A settings row's name labels its last widget: here the "reference" radio button.
        h.get_by_label("Numerics (CPU)").click();
        h.step();
        set_drag_value(&mut h, "Maximum reply tokens", "5");
        h.get_by_label("Apply").click();
        h.run_steps(2);
        assert!(!has_text(&h, "Not applied"), "the settings were refused");
        assert_eq!(h.state().settings().sampling.max_tokens, 5);

        // The real engine honours the new limit.
        type_message(&mut h, "count to ten");
        wait_reply_done(&mut h);
        let stats = last_reply(&h).stats.clone().unwrap();
        assert!(stats.generated_tokens <= 5, "{stats:?}");
    } // dropping the app waits for queued writes
    let mut h = start(dir.path());
    wait_ready(&mut h);
    let settings = h.state().settings();
    assert_eq!(settings.sampling.max_tokens, 5);
    assert_eq!(
        settings.engine.numerics,
        dsv4_engine::api::Numerics::Reference
    );
    h.get_by_label("Settings").click();
    h.run_steps(3);
    assert_eq!(
        h.get_by_label("Maximum reply tokens")
            .value()
            .unwrap_or_default(),
        "5"
    );
}

#[test]
fn a_broken_model_folder_shows_its_reason() {
    let dir = data_dir(Some(16));
    let models = dir.path().join("models");
    let broken = models.join("broken-v4");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("config.json"),
        r#"{"model_type": "deepseek_v4", "compress_ratios": [0]}"#,
    )
    .unwrap();

    let mut h = start(dir.path());
    wait_ready(&mut h);
    h.get_by_label("Models").click();
    h.run_steps(3);
    h.get_by_label("Model folder path").focus();
    h.step();
    h.get_by_label("Model folder path")
        .type_text(&models.display().to_string());
    h.step();
    h.get_by_label("Add folder").click();
    step_until(&mut h, "scan reason", |h| {
        has_text(h, "Cannot use: config.json: `num_hidden_layers` missing")
    });
    assert!(h.query_by_label("Load broken-v4").is_none());
    assert_eq!(h.state().settings().model_folders, vec![models]);
}

#[test]
fn a_saved_model_the_engine_cannot_load_is_explained_and_the_demo_still_loads() {
    let dir = data_dir(Some(16));
    let broken = dir.path().join("half-downloaded");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("config.json"), "{ not json").unwrap();
    let settings = std::fs::read_to_string(dir.path().join("settings.json")).unwrap();
    let mut settings: serde_json::Value = serde_json::from_str(&settings).unwrap();
    settings["model"] = serde_json::json!({ "Dir": broken });
    std::fs::write(dir.path().join("settings.json"), settings.to_string()).unwrap();

    let mut h = start(dir.path());
    step_until(&mut h, "engine error banner", |h| {
        has_text(h, "Engine error:")
    });
    assert!(has_text(&h, "Engine: error"));
    assert!(h.query_by_label("Dismiss").is_some());
    h.get_by_label("Models").click();
    h.run_steps(3);
    h.get_by_label("Load demo").click();
    wait_ready(&mut h);
    type_message(&mut h, "still works?");
    wait_reply_done(&mut h);
    assert!(last_reply(&h).stats.is_some());
}

#[test]
fn history_survives_a_restart_and_the_engine_continues_it() {
    let dir = data_dir(Some(16));
    let first_reply = {
        let mut h = start(dir.path());
        wait_ready(&mut h);
        type_message(&mut h, "Remember me");
        wait_reply_done(&mut h);
        last_reply(&h).clone()
    }; // dropping the app waits for queued writes and stops the engine
    let mut h = start(dir.path());
    wait_ready(&mut h);
    let conversations = h.state().conversations();
    assert_eq!(conversations.len(), 1);
    assert_eq!(conversations[0].title, "Remember me");
    let restored = &conversations[0].messages[1];
    assert_eq!(restored.content, first_reply.content);
    assert_eq!(restored.note, first_reply.note);
    assert!(restored.stats.is_some());
    assert!(has_text(&h, "Remember me"));

    // A follow-up sends the restored history to the new engine as the prompt.
    type_message(&mut h, "And now?");
    wait_reply_done(&mut h);
    let messages = &h.state().selected_conversation().unwrap().messages;
    assert_eq!(messages.len(), 4);
    let stats = messages[3].stats.as_ref().unwrap();
    assert!(stats.prompt_tokens > first_reply.stats.as_ref().unwrap().prompt_tokens);
}
