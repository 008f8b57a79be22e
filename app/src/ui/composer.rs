//! The message box: Enter sends, Shift+Enter adds a line; Send turns into Stop while a reply runs.

use super::Action;
use crate::app::ChatApp;

pub fn draw(ui: &mut egui::Ui, app: &mut ChatApp, actions: &mut Vec<Action>) {
    let id = egui::Id::unique("composer");
    let busy = app.engine.active.is_some();
    let focused = ui.memory(|m| m.has_focus(id));
    // Take a plain Enter before the text box sees it, so it sends instead of adding a line.
    if focused && !busy && ui.input_mut(consume_plain_enter) {
        actions.push(Action::Send);
    }
    ui.add_space(4.0);
    ui.horizontal(|ui| {
        let button_width = 90.0;
        let response = ui
            .add(
                egui::TextEdit::multiline(&mut app.view.composer)
                    .id(id)
                    .hint_text("Message (Enter sends, Shift+Enter adds a line)")
                    .desired_rows(3)
                    .desired_width(ui.available_width() - button_width)
                    .return_key(egui::KeyboardShortcut::new(
                        egui::Modifiers::SHIFT,
                        egui::Key::Enter,
                    )),
            )
            .accessible_name("Message");
        if app.view.focus_composer {
            response.request_focus();
            app.view.focus_composer = false;
        }
        ui.vertical(|ui| {
            if busy {
                if ui.button("Stop (Esc)").clicked() {
                    actions.push(Action::Stop);
                }
            } else {
                let has_text = !app.view.composer.trim().is_empty();
                if ui
                    .add_enabled(has_text, egui::Button::new("Send"))
                    .clicked()
                {
                    actions.push(Action::Send);
                }
            }
        });
    });
    ui.add_space(4.0);
}

/// Consumes an Enter press with no modifier at all (egui's own `consume_key` would also take
/// Shift+Enter, which must add a line instead).
fn consume_plain_enter(input: &mut egui::InputState) -> bool {
    let mut found = false;
    input.events.retain(|event| {
        let plain_enter = matches!(
            event,
            egui::Event::Key {
                key: egui::Key::Enter,
                pressed: true,
                modifiers,
                ..
            } if modifiers.is_none()
        );
        found |= plain_enter;
        !plain_enter
    });
    found
}
