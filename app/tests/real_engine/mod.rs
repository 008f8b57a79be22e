//! Helpers for `ui_real_engine.rs`: start the app on the real engine, wait by stepping frames.
#![allow(clippy::unwrap_used, dead_code)]

use dsv4_chat::app::{AppConfig, ChatApp};
use dsv4_chat::engine_link::EngineChoice;
use dsv4_chat::state::conversations::StoredMessage;
use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use std::path::Path;
use std::sync::Once;
use std::time::{Duration, Instant};

pub type App = Harness<'static, ChatApp>;

/// Deadline for one wait. Generous: a debug build on two busy cores, several engines at once.
/// It only turns a hang into a failure; nothing asserts on how long a step took.
const WAIT: Duration = Duration::from_secs(180);

static DEMO_CACHE: Once = Once::new();

/// Points the engine's demo-model cache at one directory shared by every test of this binary
/// and writes the demo checkpoint there once, before any engine starts. Each engine writing it
/// on first use at the same moment would race on the same `.partial` directory.
fn prepare_demo_cache() {
    DEMO_CACHE.call_once(|| {
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dsv4-demo-cache");
        // Set before any engine thread exists (every test passes through this `Once` first),
        // so no other thread reads the environment while it changes.
        std::env::set_var("DSV4_CACHE_DIR", &cache);
        let demo = dsv4_engine::runtime::load::demo_dir();
        dsv4_engine::runtime::load::ensure_demo(&demo).unwrap();
    });
}

/// A temp data directory; `max_tokens` is saved as the reply budget in its settings, the way
/// the settings window saves it, so replies stay short and the tests fast.
pub fn data_dir(max_tokens: Option<u32>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    if let Some(n) = max_tokens {
        let settings = format!(r#"{{"sampling": {{"max_tokens": {n}}}}}"#);
        std::fs::write(dir.path().join("settings.json"), settings).unwrap();
    }
    dir
}

/// The app on `dir` with the real engine thread.
pub fn start(dir: &Path) -> App {
    prepare_demo_cache();
    let app = ChatApp::new(AppConfig {
        data_dir: Some(dir.to_path_buf()),
        engine: EngineChoice::Real,
    });
    Harness::builder()
        .with_size(egui::vec2(1100.0, 760.0))
        // The demo model samples from the whole vocabulary (CJK, Arabic, ...); the desktop app
        // adds a system CJK font, which a test machine may not have. Boxes are fine here.
        .allow_missing_glyphs()
        .build_ui_state(|ui, app: &mut ChatApp| app.show(ui), app)
}

/// Steps frames until `done` holds; the engine works on its own thread meanwhile.
pub fn step_until(h: &mut App, what: &str, done: impl Fn(&App) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        h.step();
        if done(h) {
            return;
        }
        assert!(Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn has_text(h: &App, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

pub fn wait_ready(h: &mut App) {
    step_until(h, "engine ready", |h| has_text(h, "Engine: ready"));
}

/// Types `text` into the composer and presses Enter.
pub fn type_message(h: &mut App, text: &str) {
    h.get_by_label("Message").focus();
    h.step();
    h.get_by_label("Message").type_text(text);
    h.step();
    h.key_press(egui::Key::Enter);
    h.step();
}

/// The last message of the selected conversation.
pub fn last_reply(h: &App) -> &StoredMessage {
    let conversation = h.state().selected_conversation().unwrap();
    conversation.messages.last().unwrap()
}

pub fn wait_reply_done(h: &mut App) {
    step_until(h, "reply finished", |h| !h.state().is_generating());
    h.step();
}

/// Steps until the running reply ends and returns the distinct non-zero lengths its text had
/// at the frames drawn while it was still running.
pub fn watch_reply_grow(h: &mut App) -> Vec<usize> {
    let mut lengths: Vec<usize> = Vec::new();
    let deadline = Instant::now() + WAIT;
    while h.state().is_generating() {
        let len = last_reply(h).content.len();
        if len > 0 && lengths.last() != Some(&len) {
            lengths.push(len);
        }
        assert!(Instant::now() < deadline, "gave up waiting for the reply");
        std::thread::sleep(Duration::from_millis(2));
        h.step();
    }
    lengths
}

/// Types `value` into the DragValue labelled `label` (a focused DragValue edits as text).
pub fn set_drag_value(h: &mut App, label: &str, value: &str) {
    h.get_by_label(label).focus();
    h.step();
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::A);
    h.step();
    h.get_by_label(label).type_text(value);
    h.step();
    h.key_press(egui::Key::Enter);
    h.step();
}
