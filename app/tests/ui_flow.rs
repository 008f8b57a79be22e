//! Headless interaction tests: the real app UI driven through egui_kittest against the fake
//! engine, with a temp data directory. No display, no GPU.
#![allow(clippy::unwrap_used)]

use dsv4_chat::app::{AppConfig, ChatApp};
use dsv4_chat::engine_link::EngineChoice;
use dsv4_chat::fake_engine::FakeEngineOptions;
use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use std::path::Path;
use std::time::{Duration, Instant};

fn fast_options() -> FakeEngineOptions {
    FakeEngineOptions {
        token_delay: Duration::from_millis(3),
        load_steps: 3,
        load_step_delay: Duration::from_millis(2),
        ..FakeEngineOptions::default()
    }
}

fn start(dir: &Path, options: FakeEngineOptions) -> Harness<'static, ChatApp> {
    let app = ChatApp::new(AppConfig {
        data_dir: Some(dir.to_path_buf()),
        engine: EngineChoice::Fake(options),
    });
    Harness::builder()
        .with_size(egui::vec2(1100.0, 760.0))
        .build_ui_state(|ui, app: &mut ChatApp| app.show(ui), app)
}

/// Steps frames (the engine runs on its own thread) until `done` holds, or fails after 10 s.
fn step_until(
    h: &mut Harness<'static, ChatApp>,
    what: &str,
    done: impl Fn(&Harness<'static, ChatApp>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        h.step();
        if done(h) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn has_text(h: &Harness<'static, ChatApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

fn type_message(h: &mut Harness<'static, ChatApp>, text: &str) {
    h.get_by_label("Message").focus();
    h.step();
    h.get_by_label("Message").type_text(text);
    h.step();
    h.key_press(egui::Key::Enter);
    h.step();
}

fn wait_ready(h: &mut Harness<'static, ChatApp>) {
    step_until(h, "engine ready", |h| has_text(h, "Engine: ready"));
}

fn with_thinking(dir: &Path) {
    std::fs::write(dir.join("settings.json"), r#"{"thinking": "high"}"#).unwrap();
}

#[test]
fn enter_sends_and_the_reply_streams_with_a_thinking_section() {
    let dir = tempfile::tempdir().unwrap();
    with_thinking(dir.path());
    let mut h = start(dir.path(), fast_options());
    wait_ready(&mut h);
    assert!(
        has_text(&h, "replies are noise"),
        "the demo model must be labelled"
    );

    type_message(&mut h, "Hello engine");
    assert!(h.state().is_generating());
    step_until(&mut h, "answer text", |h| has_text(h, "demo reply"));
    assert!(h.query_by_label("Thinking").is_some());
    assert!(has_text(&h, "The user wrote"));
    step_until(&mut h, "reply finished", |h| !h.state().is_generating());
    h.step();
    assert!(has_text(&h, "decode"), "stats line under the reply");
    assert!(has_text(&h, "Context:"), "context meter");
    let conversation = h.state().selected_conversation().unwrap();
    assert_eq!(conversation.title, "Hello engine");
    assert_eq!(conversation.messages.len(), 2);
    assert!(conversation.messages[1].reasoning.is_some());
    assert_eq!(h.get_by_label("Message").value().unwrap_or_default(), "");
}

#[test]
fn shift_enter_adds_a_line_instead_of_sending() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), fast_options());
    wait_ready(&mut h);
    h.get_by_label("Message").focus();
    h.step();
    h.get_by_label("Message").type_text("line one");
    h.step();
    h.key_press_modifiers(egui::Modifiers::SHIFT, egui::Key::Enter);
    h.step();
    assert!(!h.state().is_generating());
    assert!(h.state().conversations().is_empty());
    assert_eq!(
        h.get_by_label("Message").value().unwrap_or_default(),
        "line one\n"
    );
}

#[test]
fn escape_stops_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let options = FakeEngineOptions {
        token_delay: Duration::from_millis(15),
        answer_repeats: 100,
        ..fast_options()
    };
    let mut h = start(dir.path(), options);
    wait_ready(&mut h);
    type_message(&mut h, "Tell me a long story");
    step_until(&mut h, "first answer text", |h| has_text(h, "This is a"));
    h.key_press(egui::Key::Escape);
    step_until(&mut h, "turn cancelled", |h| !h.state().is_generating());
    h.step();
    assert!(h.query_by_label("Stopped.").is_some());
    let reply = &h.state().selected_conversation().unwrap().messages[1];
    assert_eq!(reply.note.as_deref(), Some("Stopped."));
}

#[test]
fn ctrl_n_starts_a_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), fast_options());
    h.step();
    assert!(h.state().conversations().is_empty());
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::N);
    h.step();
    assert_eq!(h.state().conversations().len(), 1);
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::N);
    h.step();
    assert_eq!(h.state().conversations().len(), 2);
    assert!(has_text(&h, "New conversation"));
}

#[test]
fn a_fatal_engine_error_shows_the_banner() {
    let dir = tempfile::tempdir().unwrap();
    let options = FakeEngineOptions {
        fail_load: Some("out of GPU memory".into()),
        ..fast_options()
    };
    let mut h = start(dir.path(), options);
    step_until(&mut h, "error banner", |h| {
        has_text(h, "Engine error: out of GPU memory")
    });
    assert!(h.query_by_label("Dismiss").is_some());
}

#[test]
fn a_failed_turn_is_reported_and_the_app_keeps_going() {
    let dir = tempfile::tempdir().unwrap();
    let options = FakeEngineOptions {
        fail_turns: Some("prompt longer than the context".into()),
        ..fast_options()
    };
    let mut h = start(dir.path(), options);
    wait_ready(&mut h);
    type_message(&mut h, "hi");
    step_until(&mut h, "turn failed banner", |h| {
        has_text(h, "The reply failed")
    });
    assert!(!h.state().is_generating());
}

#[test]
fn conversations_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut h = start(dir.path(), fast_options());
        wait_ready(&mut h);
        type_message(&mut h, "Remember me");
        step_until(&mut h, "reply finished", |h| !h.state().is_generating());
        h.step();
    } // dropping the app waits for queued writes
    let mut h = start(dir.path(), fast_options());
    h.step();
    let conversations = h.state().conversations();
    assert_eq!(conversations.len(), 1);
    assert_eq!(conversations[0].title, "Remember me");
    assert!(conversations[0].messages[1].content.contains("demo reply"));
    assert!(conversations[0].messages[1].stats.is_some());
}

#[test]
fn a_damaged_history_file_is_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let conversations = dir.path().join("conversations");
    std::fs::create_dir_all(&conversations).unwrap();
    std::fs::write(conversations.join("5.json"), "{ broken").unwrap();
    let mut h = start(dir.path(), fast_options());
    h.step();
    assert!(has_text(&h, "damaged conversation file was set aside"));
}

#[test]
fn settings_refuse_invalid_values_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), fast_options());
    wait_ready(&mut h);
    h.get_by_label("Settings").click();
    // A new window spends its first frame measuring itself.
    h.run_steps(3);
    h.check_accessibility();
    let buckets = h.get_by_label("Graph batch buckets");
    buckets.focus();
    h.step();
    h.get_by_label("Graph batch buckets").type_text(", 2");
    h.step();
    h.get_by_label("Apply").click();
    h.step();
    h.step();
    assert!(has_text(&h, "strictly increasing"));
    assert_eq!(h.state().settings().engine.graph_buckets, vec![1, 2, 4, 8]);
}

#[test]
fn model_picker_lists_the_demo_and_explains_bad_folders() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), fast_options());
    wait_ready(&mut h);
    h.get_by_label("Models").click();
    h.run_steps(3);
    h.check_accessibility();
    assert!(h.query_by_label("Load demo").is_some());
    let missing = dir.path().join("no-such-folder");
    h.get_by_label("Model folder path").focus();
    h.step();
    h.get_by_label("Model folder path")
        .type_text(&missing.display().to_string());
    h.step();
    h.get_by_label("Add folder").click();
    step_until(&mut h, "scan result", |h| {
        has_text(h, "Cannot use: folder not found")
    });
    assert_eq!(h.state().settings().model_folders, vec![missing]);
}

#[test]
fn regenerate_and_edit_replace_the_last_reply() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), fast_options());
    wait_ready(&mut h);
    type_message(&mut h, "first question");
    step_until(&mut h, "reply finished", |h| !h.state().is_generating());
    h.step();

    h.get_by_label("Regenerate").click();
    h.step();
    assert!(h.state().is_generating());
    step_until(&mut h, "regenerated", |h| !h.state().is_generating());
    h.step();
    assert_eq!(h.state().selected_conversation().unwrap().messages.len(), 2);

    h.get_by_label("Edit").click();
    h.run_steps(2);
    h.get_by_label("Edit message").focus();
    h.step();
    h.get_by_label("Edit message").type_text(" again");
    h.step();
    h.get_by_label("Send edited").click();
    h.step();
    step_until(&mut h, "edited reply", |h| !h.state().is_generating());
    let messages = &h.state().selected_conversation().unwrap().messages;
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0].content, "first question again");
    assert!(messages[1].content.contains("first question again"));
}

#[test]
fn delete_removes_the_conversation_and_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), fast_options());
    wait_ready(&mut h);
    type_message(&mut h, "to be deleted");
    step_until(&mut h, "reply finished", |h| !h.state().is_generating());
    h.run_steps(2);
    h.get_by_label("Delete").click();
    h.step();
    assert!(h.state().conversations().is_empty());
    drop(h);
    let files = std::fs::read_dir(dir.path().join("conversations"))
        .unwrap()
        .count();
    assert_eq!(files, 0);
}

#[test]
fn gpus_in_use_are_shown() {
    let dir = tempfile::tempdir().unwrap();
    let options = FakeEngineOptions {
        gpus: vec![dsv4_engine::api::GpuStatus {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            memory_used_bytes: 90_000_000_000,
            memory_total_bytes: 141_000_000_000,
        }],
        ..fast_options()
    };
    let mut h = start(dir.path(), options);
    wait_ready(&mut h);
    assert!(has_text(&h, "GPU 0 NVIDIA H200: 90.0 GB / 141.0 GB"));
}
