//! The top bar (windows, engine state, model) and the banners under it.

use super::{Action, DEMO_LABEL};
use crate::app::transient::{BannerKind, EngineStatus};
use crate::app::ChatApp;

pub fn draw(ui: &mut egui::Ui, app: &mut ChatApp, actions: &mut Vec<Action>) {
    ui.horizontal(|ui| {
        ui.strong("dsv4-chat");
        ui.separator();
        if ui.button("Models").clicked() {
            app.view.show_models = true;
            if !app.view.picker.scanned_once {
                actions.push(Action::Rescan);
            }
        }
        if ui.button("Settings").clicked() {
            actions.push(Action::OpenSettings);
        }
        if ui.button("About").clicked() {
            app.view.show_about = true;
        }
        ui.separator();
        model_label(ui, app);
    });
}

fn model_label(ui: &mut egui::Ui, app: &ChatApp) {
    match (&app.engine.status, &app.engine.model) {
        (EngineStatus::Ready, Some(model)) if model.is_demo => {
            ui.label(format!("Model: {}", model.name));
            ui.colored_label(ui.visuals().warn_fg_color, DEMO_LABEL);
        }
        (EngineStatus::Ready, Some(model)) => {
            ui.label(format!("Model: {} ({})", model.name, model.backend));
        }
        (EngineStatus::Loading { .. }, _) => {
            ui.label("Loading model…");
        }
        (EngineStatus::Failed(_), _) => {
            ui.colored_label(ui.visuals().error_fg_color, "No model loaded");
        }
        _ => {
            ui.label("Starting engine…");
        }
    }
}

/// Error banners (engine failures, damaged files) and the "reload to apply" notice.
pub fn draw_banners(ui: &mut egui::Ui, app: &mut ChatApp, actions: &mut Vec<Action>) {
    for (index, banner) in app.view.banners.iter().enumerate() {
        let color = match banner.kind {
            BannerKind::Error => ui.visuals().error_fg_color,
            BannerKind::Notice => ui.visuals().warn_fg_color,
        };
        egui::Frame::new()
            .stroke(egui::Stroke::new(1.0, color))
            .corner_radius(4)
            .inner_margin(6)
            .show(ui, |ui| {
                ui.horizontal(|ui| {
                    ui.colored_label(color, &banner.message);
                    ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                        if ui.small_button("Dismiss").clicked() {
                            actions.push(Action::DismissBanner(index));
                        }
                    });
                });
            });
    }
    if !app.engine.pending_reload.is_empty() {
        ui.horizontal(|ui| {
            let changed = app.engine.pending_reload.join(", ");
            ui.colored_label(
                ui.visuals().warn_fg_color,
                format!("Changed settings apply when the model is reloaded: {changed}."),
            );
            if ui.button("Reload model").clicked() {
                actions.push(Action::ReloadModel);
            }
        });
    }
}
