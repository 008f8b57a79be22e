//! The settings window: edits a draft; Apply validates it and refuses bad values with reasons.

use super::chat_view::thinking_name;
use super::Action;
use crate::app::transient::SettingsDraft;
use crate::app::ChatApp;
use dsv4_engine::api::{Numerics, SplitMode, ThinkingMode};

pub fn window(ctx: &egui::Context, app: &mut ChatApp, actions: &mut Vec<Action>) {
    let mut open = app.view.show_settings;
    let Some(draft) = app.view.settings_draft.as_mut() else {
        app.view.show_settings = false;
        return;
    };
    let mut close = false;
    egui::Window::new("Settings")
        .open(&mut open)
        .default_width(480.0)
        .default_height(ctx.content_rect().height() * 0.8)
        .pivot(egui::Align2::CENTER_CENTER)
        .default_pos(ctx.content_rect().center())
        .show(ctx, |ui| {
            // The buttons and refusals stay visible below the scrolling fields.
            egui::Panel::bottom("settings_buttons").show(ui, |ui| {
                problems(ui, draft);
                ui.horizontal(|ui| {
                    if ui.button("Apply").clicked() {
                        actions.push(Action::ApplySettings(Box::new(draft.clone())));
                    }
                    if ui.button("Cancel").clicked() {
                        close = true;
                    }
                });
            });
            egui::ScrollArea::vertical().show(ui, |ui| {
                engine_section(ui, draft);
                ui.separator();
                sampling_section(ui, draft);
                ui.separator();
                folders_note(ui, draft);
            });
        });
    if close || !open {
        app.view.show_settings = false;
        app.view.settings_draft = None;
    }
}

/// One labelled row of the settings grid; `reload` marks settings applied on the next load.
fn row(
    ui: &mut egui::Ui,
    name: &str,
    reload: bool,
    add: impl FnOnce(&mut egui::Ui) -> egui::Response,
) {
    let label = ui.label(name);
    ui.horizontal(|ui| {
        add(ui).labelled_by(label.id);
        if reload {
            ui.weak("(applies on reload)");
        }
    });
    ui.end_row();
}

fn engine_section(ui: &mut egui::Ui, draft: &mut SettingsDraft) {
    ui.heading("Engine");
    let engine = &mut draft.settings.engine;
    egui::Grid::new("engine_settings")
        .num_columns(2)
        .show(ui, |ui| {
            row(ui, "Backend", true, |ui| {
                ui.radio_value(&mut draft.use_cuda, false, "CPU reference");
                ui.radio_value(&mut draft.use_cuda, true, "CUDA")
            });
            row(ui, "GPUs (comma list, empty = all)", true, |ui| {
                ui.add_enabled(
                    draft.use_cuda,
                    egui::TextEdit::singleline(&mut draft.gpus_text).desired_width(120.0),
                )
            });
            row(ui, "Split over GPUs", true, |ui| {
                ui.radio_value(&mut engine.split_mode, SplitMode::Tensor, "tensor");
                ui.radio_value(&mut engine.split_mode, SplitMode::Layer, "layer")
            });
            row(ui, "Maximum batch size", false, |ui| {
                ui.add(egui::DragValue::new(&mut engine.max_batch))
            });
            row(ui, "Prefill chunk (tokens)", false, |ui| {
                ui.add(egui::DragValue::new(&mut engine.prefill_chunk))
            });
            row(ui, "CUDA graph replay", false, |ui| {
                ui.checkbox(&mut engine.cuda_graphs, "on")
            });
            row(ui, "Graph batch buckets", true, |ui| {
                ui.add(egui::TextEdit::singleline(&mut draft.buckets_text).desired_width(160.0))
            });
            row(ui, "Maximum context (tokens)", true, |ui| {
                ui.add(egui::DragValue::new(&mut engine.max_context).speed(256))
            });
            row(ui, "Cache budget (MiB)", true, |ui| {
                ui.add(egui::DragValue::new(&mut engine.cache_budget_mib).speed(64))
            });
            row(ui, "Numerics (CPU)", false, |ui| {
                ui.radio_value(&mut engine.numerics, Numerics::Official, "official");
                ui.radio_value(&mut engine.numerics, Numerics::Reference, "reference")
            });
        });
}

fn sampling_section(ui: &mut egui::Ui, draft: &mut SettingsDraft) {
    ui.heading("Defaults for new replies");
    let sampling = &mut draft.settings.sampling;
    egui::Grid::new("sampling_settings")
        .num_columns(2)
        .show(ui, |ui| {
            row(ui, "Temperature (0 = greedy)", false, |ui| {
                ui.add(
                    egui::DragValue::new(&mut sampling.temperature)
                        .speed(0.01)
                        .max_decimals(3),
                )
            });
            row(ui, "Top-p (1 = off)", false, |ui| {
                ui.add(
                    egui::DragValue::new(&mut sampling.top_p)
                        .speed(0.01)
                        .max_decimals(3),
                )
            });
            row(ui, "Top-k (0 = off)", false, |ui| {
                ui.add(egui::DragValue::new(&mut sampling.top_k))
            });
            row(ui, "Min-p (0 = off)", false, |ui| {
                ui.add(
                    egui::DragValue::new(&mut sampling.min_p)
                        .speed(0.01)
                        .max_decimals(3),
                )
            });
            row(ui, "Maximum reply tokens", false, |ui| {
                ui.add(egui::DragValue::new(&mut sampling.max_tokens).speed(16))
            });
            row(ui, "Thinking mode (new conversations)", false, |ui| {
                let thinking = &mut draft.settings.thinking;
                for mode in [ThinkingMode::Off, ThinkingMode::High, ThinkingMode::Max] {
                    ui.radio_value(thinking, mode, thinking_name(mode));
                }
                ui.label("")
            });
        });
}

fn folders_note(ui: &mut egui::Ui, draft: &SettingsDraft) {
    ui.label("Model folders (add or remove them in the Models window):");
    if draft.settings.model_folders.is_empty() {
        ui.weak("none");
    }
    for folder in &draft.settings.model_folders {
        ui.monospace(folder.display().to_string());
    }
}

fn problems(ui: &mut egui::Ui, draft: &SettingsDraft) {
    for problem in &draft.problems {
        ui.colored_label(
            ui.visuals().error_fg_color,
            format!("Not applied: {problem}"),
        );
    }
}
