//! The conversation list: new, search by title, select, rename, delete.

use super::Action;
use crate::app::ChatApp;
use dsv4_engine::api::ConversationId;

pub fn draw(ui: &mut egui::Ui, app: &mut ChatApp, actions: &mut Vec<Action>) {
    ui.add_space(4.0);
    if ui
        .button("New conversation")
        .on_hover_text("Ctrl+N")
        .clicked()
    {
        actions.push(Action::NewConversation);
    }
    ui.add_space(4.0);
    ui.add(
        egui::TextEdit::singleline(&mut app.view.search)
            .hint_text("Search titles")
            .desired_width(f32::INFINITY),
    )
    .accessible_name("Search conversations");
    ui.separator();

    let listed: Vec<(ConversationId, String)> = app
        .store
        .search(&app.view.search)
        .map(|c| (c.id, c.title.clone()))
        .collect();
    egui::ScrollArea::vertical()
        .auto_shrink([false, false])
        .show(ui, |ui| {
            if listed.is_empty() {
                ui.weak("No conversations");
            }
            for (id, title) in listed {
                conversation_row(ui, app, actions, id, &title);
            }
        });
}

fn conversation_row(
    ui: &mut egui::Ui,
    app: &mut ChatApp,
    actions: &mut Vec<Action>,
    id: ConversationId,
    title: &str,
) {
    if let Some((renaming_id, draft)) = app.view.renaming.as_mut() {
        if *renaming_id == id {
            rename_row(ui, id, draft, actions);
            return;
        }
    }
    let selected = app.view.selected == Some(id);
    let busy = if app.engine.is_busy_with(id) {
        " …"
    } else {
        ""
    };
    let response = ui.add(
        egui::Button::selectable(selected, format!("{title}{busy}"))
            .truncate()
            .min_size(egui::vec2(ui.available_width(), 0.0)),
    );
    if response.clicked() {
        actions.push(Action::Select(id));
    }
    if response.double_clicked() {
        app.view.renaming = Some((id, title.to_string()));
    }
    if selected {
        ui.horizontal(|ui| {
            if ui.small_button("Rename").clicked() {
                app.view.renaming = Some((id, title.to_string()));
            }
            if ui.small_button("Delete").clicked() {
                actions.push(Action::Delete(id));
            }
        });
    }
}

fn rename_row(
    ui: &mut egui::Ui,
    id: ConversationId,
    draft: &mut String,
    actions: &mut Vec<Action>,
) {
    let response = ui
        .add(egui::TextEdit::singleline(draft).desired_width(f32::INFINITY))
        .accessible_name("Conversation title");
    // Focus the field once, when renaming starts, not on every frame.
    let focused_once = ui.data_mut(|d| d.get_temp::<bool>(response.id).is_some());
    if !focused_once {
        response.request_focus();
        ui.data_mut(|d| d.insert_temp(response.id, true));
    }
    let submitted = response.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
    ui.horizontal(|ui| {
        if ui.small_button("Save title").clicked() || submitted {
            actions.push(Action::Rename(id, draft.clone()));
        }
        if ui.small_button("Cancel").clicked() {
            // Renaming to the current (unchanged) text ends the edit.
            actions.push(Action::Rename(id, String::new()));
        }
    });
}
