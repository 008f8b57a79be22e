//! dsv4-chat: the desktop chat app for DeepSeek-V4-Flash.
//!
//! The binary (`main.rs`) only opens the window; everything else lives here so the headless
//! interaction tests in `tests/` can drive the same app.

pub mod persist;
pub mod scan;
pub mod state;
