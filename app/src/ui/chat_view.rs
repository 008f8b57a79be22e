//! The conversation pane: header (title, thinking mode, system prompt, context meter), the
//! messages, and the composer.

use super::{composer, message_view, Action};
use crate::app::ChatApp;
use dsv4_engine::api::{ConversationId, ThinkingMode};

pub fn draw(ui: &mut egui::Ui, app: &mut ChatApp, actions: &mut Vec<Action>) {
    let selected = app.view.selected.filter(|id| app.store.get(*id).is_some());
    egui::Panel::bottom("composer")
        .show_separator_line(true)
        .show(ui, |ui| composer::draw(ui, app, actions));
    let Some(id) = selected else {
        ui.vertical_centered(|ui| {
            ui.add_space(ui.available_height() / 3.0);
            ui.heading("Start a conversation");
            ui.label("Type a message below, or press Ctrl+N for a new conversation.");
        });
        return;
    };
    egui::Panel::top("chat_header").show(ui, |ui| header(ui, app, actions, id));
    message_view::draw_messages(ui, app, actions, id);
}

fn header(ui: &mut egui::Ui, app: &ChatApp, actions: &mut Vec<Action>, id: ConversationId) {
    let Some(conversation) = app.store.get(id) else {
        return;
    };
    ui.horizontal(|ui| {
        ui.heading(&conversation.title);
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            let mut thinking = conversation.thinking;
            egui::ComboBox::from_id_salt("thinking_mode")
                .selected_text(thinking_name(thinking))
                .show_ui(ui, |ui| {
                    for mode in [ThinkingMode::Off, ThinkingMode::High, ThinkingMode::Max] {
                        ui.selectable_value(&mut thinking, mode, thinking_name(mode));
                    }
                })
                .response
                .on_hover_text("Thinking mode for the next reply");
            ui.label("Thinking:");
            if thinking != conversation.thinking {
                actions.push(Action::SetThinking(id, thinking));
            }
        });
    });
    context_meter(ui, app, id);
    egui::CollapsingHeader::new("System prompt")
        .id_salt(("system_prompt", id))
        .show(ui, |ui| {
            let mut prompt = conversation.system_prompt.clone();
            let response = ui
                .add(
                    egui::TextEdit::multiline(&mut prompt)
                        .hint_text("Instructions for the assistant in this conversation")
                        .desired_rows(2)
                        .desired_width(f32::INFINITY),
                )
                .accessible_name("System prompt text");
            if response.changed() {
                actions.push(Action::SetSystemPrompt(id, prompt));
            }
        });
}

/// How full the context is: the live numbers while a reply runs, else the last reply's.
fn context_meter(ui: &mut egui::Ui, app: &ChatApp, id: ConversationId) {
    let live = app
        .engine
        .active
        .as_ref()
        .filter(|a| a.conversation == id)
        .and_then(|a| a.live.as_ref())
        .map(|s| (s.context_used, s.context_limit));
    let stored = app.store.get(id).and_then(|c| c.context_fill());
    let Some((used, limit)) = live.or(stored).filter(|(_, limit)| *limit > 0) else {
        return;
    };
    let fraction = used as f32 / limit as f32;
    ui.add(
        egui::ProgressBar::new(fraction)
            .desired_width(280.0)
            .text(format!("Context: {used} / {limit} tokens")),
    );
}

pub fn thinking_name(mode: ThinkingMode) -> &'static str {
    match mode {
        ThinkingMode::Off => "off",
        ThinkingMode::High => "high",
        ThinkingMode::Max => "max",
    }
}
