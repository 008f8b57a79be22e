//! The messages of one conversation: user bubbles (editable), replies with a collapsible
//! Thinking section, Markdown answer, stats and regenerate.

use super::{markdown_view, Action};
use crate::app::ChatApp;
use crate::state::conversations::{ReplyStats, StoredMessage};
use dsv4_engine::api::{ConversationId, Role};

pub fn draw_messages(
    ui: &mut egui::Ui,
    app: &mut ChatApp,
    actions: &mut Vec<Action>,
    id: ConversationId,
) {
    let busy = app.engine.active.is_some();
    let streaming_here = app.engine.is_busy_with(id);
    let Some(conversation) = app.store.get(id) else {
        return;
    };
    let count = conversation.messages.len();
    egui::ScrollArea::vertical()
        .id_salt(("messages", id))
        .stick_to_bottom(true)
        .auto_shrink([false, false])
        .show(ui, |ui| {
            for (index, message) in conversation.messages.iter().enumerate() {
                let is_last = index + 1 == count;
                match message.role {
                    Role::User => {
                        user_message(ui, &mut app.view.editing, actions, id, index, message, busy)
                    }
                    _ => reply(
                        ui,
                        actions,
                        id,
                        index,
                        message,
                        is_last && streaming_here,
                        is_last && !busy,
                    ),
                }
                ui.add_space(8.0);
            }
        });
}

fn user_message(
    ui: &mut egui::Ui,
    editing: &mut Option<(ConversationId, usize, String)>,
    actions: &mut Vec<Action>,
    id: ConversationId,
    index: usize,
    message: &StoredMessage,
    busy: bool,
) {
    egui::Frame::new()
        .fill(ui.visuals().faint_bg_color)
        .corner_radius(6)
        .inner_margin(8)
        .show(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.strong("You");
            if let Some((_, _, text)) = editing.as_mut().filter(|(c, i, _)| *c == id && *i == index)
            {
                ui.add(egui::TextEdit::multiline(text).desired_width(f32::INFINITY))
                    .accessible_name("Edit message");
                let text = text.clone();
                ui.horizontal(|ui| {
                    if ui
                        .add_enabled(!busy, egui::Button::new("Send edited"))
                        .clicked()
                    {
                        actions.push(Action::EditAndResend { id, index, text });
                    }
                    if ui.button("Cancel edit").clicked() {
                        *editing = None;
                    }
                });
                return;
            }
            ui.add(egui::Label::new(&message.content).selectable(true));
            if !busy && ui.small_button("Edit").clicked() {
                *editing = Some((id, index, message.content.clone()));
            }
        });
}

fn reply(
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
    id: ConversationId,
    index: usize,
    message: &StoredMessage,
    streaming: bool,
    can_regenerate: bool,
) {
    ui.strong("Assistant");
    if let Some(reasoning) = message.reasoning.as_deref().filter(|r| !r.is_empty()) {
        egui::CollapsingHeader::new(egui::RichText::new("Thinking").weak())
            .id_salt(("thinking", id, index))
            .default_open(streaming)
            .show(ui, |ui| {
                ui.add(
                    egui::Label::new(egui::RichText::new(reasoning).weak().italics())
                        .selectable(true),
                );
            });
    }
    if message.content.is_empty() && streaming {
        ui.horizontal(|ui| {
            ui.spinner();
            ui.weak("Generating…");
        });
    } else {
        markdown_view::show(ui, &message.content);
    }
    if let Some(note) = &message.note {
        ui.colored_label(ui.visuals().warn_fg_color, note);
    }
    if let Some(stats) = &message.stats {
        ui.weak(stats_line(stats));
    }
    if can_regenerate || !message.content.is_empty() {
        ui.horizontal(|ui| {
            if !streaming && ui.small_button("Copy reply").clicked() {
                ui.ctx().copy_text(message.content.clone());
            }
            if can_regenerate && ui.small_button("Regenerate").clicked() {
                actions.push(Action::Regenerate(id));
            }
        });
    }
}

/// "first token 120 ms · prefill 512.0 tok/s · decode 12.3 tok/s · 45 prompt + 120 generated"
pub fn stats_line(stats: &ReplyStats) -> String {
    let cached = if stats.cached_prompt_tokens > 0 {
        format!(" ({} cached)", stats.cached_prompt_tokens)
    } else {
        String::new()
    };
    format!(
        "first token {} ms · prefill {:.1} tok/s · decode {:.1} tok/s · {} prompt{cached} + {} generated tokens",
        stats.time_to_first_token_ms,
        stats.prefill_tok_s,
        stats.decode_tok_s,
        stats.prompt_tokens,
        stats.generated_tokens
    )
}
