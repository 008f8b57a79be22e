//! The window: panels, windows and widgets. Drawing reads state and may edit view-only state
//! (drafts, selection text); everything else goes back to the app as an [`Action`].

mod about;
mod chat_view;
mod composer;
pub mod markdown;
mod markdown_view;
mod message_view;
mod model_picker;
mod settings_panel;
mod sidebar;
mod status_bar;
mod top_bar;

use crate::app::transient::SettingsDraft;
use crate::app::ChatApp;
use dsv4_engine::api::{ConversationId, ModelSource, ThinkingMode};
use std::path::PathBuf;

/// A request from the UI, applied by the app after drawing the frame.
#[derive(Debug, Clone)]
pub enum Action {
    NewConversation,
    Select(ConversationId),
    Rename(ConversationId, String),
    Delete(ConversationId),
    /// Send the composer's text.
    Send,
    Stop,
    Regenerate(ConversationId),
    EditAndResend {
        id: ConversationId,
        index: usize,
        text: String,
    },
    SetThinking(ConversationId, ThinkingMode),
    SetSystemPrompt(ConversationId, String),
    LoadModel(ModelSource),
    ReloadModel,
    AddFolder(PathBuf),
    RemoveFolder(usize),
    Rescan,
    OpenSettings,
    ApplySettings(Box<SettingsDraft>),
    DismissBanner(usize),
}

/// Draws the whole window for one frame.
pub fn draw(ui: &mut egui::Ui, app: &mut ChatApp, actions: &mut Vec<Action>) {
    egui::Panel::top("top_bar").show(ui, |ui| top_bar::draw(ui, app, actions));
    if !app.view.banners.is_empty() || !app.engine.pending_reload.is_empty() {
        egui::Panel::top("banners").show(ui, |ui| top_bar::draw_banners(ui, app, actions));
    }
    egui::Panel::bottom("status_bar").show(ui, |ui| status_bar::draw(ui, app));
    egui::Panel::left("sidebar")
        .resizable(true)
        .default_size(230.0)
        .show(ui, |ui| sidebar::draw(ui, app, actions));
    egui::CentralPanel::default().show(ui, |ui| chat_view::draw(ui, app, actions));

    let ctx = ui.ctx().clone();
    model_picker::window(&ctx, app, actions);
    settings_panel::window(&ctx, app, actions);
    about::window(&ctx, app);
}

/// The label used everywhere the demo model is named.
pub const DEMO_LABEL: &str = "Demo model: random weights, replies are noise";
