//! State that outlives the window: conversations and settings, each saved as JSON in the
//! data directory. Transient UI state (focus, drafts, the running turn) lives in `app`/`ui`.

pub mod conversations;
pub mod settings;
pub mod validate;

use std::path::PathBuf;

/// Environment variable that overrides the data directory (used by tests and screenshots).
pub const DATA_DIR_ENV: &str = "DSV4_CHAT_DATA_DIR";

/// Where conversations and settings live: `$DSV4_CHAT_DATA_DIR`, else `<data dir>/dsv4-chat`.
/// `None` when the platform has no data directory (the app then keeps history in memory only).
pub fn data_dir() -> Option<PathBuf> {
    match std::env::var_os(DATA_DIR_ENV) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => dirs::data_dir().map(|d| d.join("dsv4-chat")),
    }
}

/// Seconds since the Unix epoch (0 if the clock is before 1970).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
