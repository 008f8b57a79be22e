//! dsv4-chat: the desktop chat app for DeepSeek-V4-Flash.
//!
//! The binary (`main.rs`) only opens the window; everything else lives here so the headless
//! interaction tests in `tests/` drive the same app.
//!
//! Layout: `app` (the eframe app and its wiring), `state` (what is saved), `ui` (drawing),
//! `scan` (finding checkpoints), `persist` (crash-safe files), `engine_link` (the only place
//! an engine is started), `fake_engine` (canned-reply stand-in used until the engine lands and
//! by the tests).

pub mod app;
pub mod engine_link;
pub mod fake_engine;
pub mod fonts;
pub mod persist;
pub mod scan;
pub mod state;
pub mod ui;
