//! State that lives only while the window is open: selection, drafts, open windows, banners,
//! and what the engine is doing. None of it is saved.

use crate::scan::ScannedModel;
use crate::state::settings::AppSettings;
use dsv4_engine::api::{ConversationId, ModelInfo, TurnId, TurnStats};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BannerKind {
    Error,
    Notice,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Banner {
    pub kind: BannerKind,
    pub message: String,
}

impl Banner {
    pub fn error(message: impl Into<String>) -> Self {
        Banner {
            kind: BannerKind::Error,
            message: message.into(),
        }
    }

    pub fn notice(message: impl Into<String>) -> Self {
        Banner {
            kind: BannerKind::Notice,
            message: message.into(),
        }
    }
}

/// The settings window's working copy, with list fields as the text the user typed.
#[derive(Debug, Clone)]
pub struct SettingsDraft {
    pub settings: AppSettings,
    pub buckets_text: String,
    pub gpus_text: String,
    pub use_cuda: bool,
    pub problems: Vec<String>,
}

/// The model picker's state: scan results arrive from a background thread.
#[derive(Default)]
pub struct PickerState {
    pub results: Vec<ScannedModel>,
    pub scanning: Option<crossbeam_channel::Receiver<Vec<ScannedModel>>>,
    pub new_folder: String,
    pub scanned_once: bool,
}

#[derive(Default)]
pub struct ViewState {
    pub selected: Option<ConversationId>,
    pub search: String,
    pub composer: String,
    /// (conversation, title being typed)
    pub renaming: Option<(ConversationId, String)>,
    /// (conversation, message index, text being edited)
    pub editing: Option<(ConversationId, usize, String)>,
    pub banners: Vec<Banner>,
    pub show_models: bool,
    pub show_settings: bool,
    pub show_about: bool,
    pub settings_draft: Option<SettingsDraft>,
    pub picker: PickerState,
    /// Set after sending so the composer keeps keyboard focus.
    pub focus_composer: bool,
}

impl ViewState {
    /// Adds a banner unless the same one is already showing.
    pub fn push_banner(&mut self, banner: Banner) {
        if !self.banners.contains(&banner) {
            self.banners.push(banner);
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum EngineStatus {
    Starting,
    Loading {
        fraction: f32,
        message: String,
        eta: Option<Duration>,
    },
    Ready,
    Failed(String),
}

/// The reply being generated.
#[derive(Debug, Clone)]
pub struct ActiveTurn {
    pub turn: TurnId,
    pub conversation: ConversationId,
    pub started: Instant,
    /// The latest `Progress` numbers.
    pub live: Option<TurnStats>,
    /// When the partial reply was last queued for saving (so a crash keeps most of it).
    pub last_partial_save: Instant,
}

#[derive(Debug)]
pub struct EngineView {
    pub status: EngineStatus,
    pub model: Option<ModelInfo>,
    pub active: Option<ActiveTurn>,
    pub next_turn: TurnId,
    /// Changed settings that wait for the next model load.
    pub pending_reload: Vec<&'static str>,
    /// GPUs the engine found at start, and why there are none when empty.
    pub detected_gpus: Vec<dsv4_engine::api::GpuStatus>,
    pub gpu_note: Option<String>,
}

impl Default for EngineView {
    fn default() -> Self {
        EngineView {
            status: EngineStatus::Starting,
            model: None,
            active: None,
            next_turn: 1,
            pending_reload: Vec::new(),
            detected_gpus: Vec::new(),
            gpu_note: None,
        }
    }
}

impl EngineView {
    pub fn is_busy_with(&self, conversation: ConversationId) -> bool {
        self.active
            .as_ref()
            .is_some_and(|a| a.conversation == conversation)
    }
}
