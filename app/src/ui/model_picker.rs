//! The model picker: the built-in demo plus the checkpoints found in the user's folders, with
//! size, formats, layers, and whether they fit the GPUs.

use super::{Action, DEMO_LABEL};
use crate::app::ChatApp;
use crate::scan::estimate::{self, human_bytes, Fit};
use crate::scan::{CheckpointSummary, ScannedModel};
use dsv4_engine::api::ModelSource;

pub fn window(ctx: &egui::Context, app: &mut ChatApp, actions: &mut Vec<Action>) {
    poll_scan(app);
    let mut open = app.view.show_models;
    egui::Window::new("Models")
        .open(&mut open)
        .default_width(600.0)
        .default_height(ctx.content_rect().height() * 0.8)
        .pivot(egui::Align2::CENTER_CENTER)
        .default_pos(ctx.content_rect().center())
        .show(ctx, |ui| contents(ui, app, actions));
    app.view.show_models = open;
}

/// Takes finished scan results, if any.
fn poll_scan(app: &mut ChatApp) {
    let Some(rx) = &app.view.picker.scanning else {
        return;
    };
    if let Ok(results) = rx.try_recv() {
        app.view.picker.results = results;
        app.view.picker.scanning = None;
    }
}

fn contents(ui: &mut egui::Ui, app: &mut ChatApp, actions: &mut Vec<Action>) {
    folders(ui, app, actions);
    ui.separator();
    let context = app.settings.engine.max_context;
    let gpu_totals = chosen_gpu_memory(app);
    if let Some(note) = &app.engine.gpu_note {
        ui.weak(note);
    }
    egui::ScrollArea::vertical().show(ui, |ui| {
        demo_entry(ui, actions);
        if app.view.picker.scanning.is_some() {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label("Scanning folders…");
            });
        }
        for model in &app.view.picker.results {
            model_entry(ui, actions, model, context, &gpu_totals);
        }
    });
}

fn folders(ui: &mut egui::Ui, app: &mut ChatApp, actions: &mut Vec<Action>) {
    ui.label("Folders searched for DeepSeek-V4 checkpoints:");
    if app.settings.model_folders.is_empty() {
        ui.weak("None yet: add the folder that holds your checkpoints.");
    }
    for (index, folder) in app.settings.model_folders.iter().enumerate() {
        ui.horizontal(|ui| {
            ui.monospace(folder.display().to_string());
            if ui.small_button("Remove folder").clicked() {
                actions.push(Action::RemoveFolder(index));
            }
        });
    }
    ui.horizontal(|ui| {
        ui.add(
            egui::TextEdit::singleline(&mut app.view.picker.new_folder)
                .hint_text("/path/to/models")
                .desired_width(320.0),
        )
        .accessible_name("Model folder path");
        let path = app.view.picker.new_folder.trim().to_string();
        if ui
            .add_enabled(!path.is_empty(), egui::Button::new("Add folder"))
            .clicked()
        {
            actions.push(Action::AddFolder(path.into()));
        }
        if ui.button("Rescan").clicked() {
            actions.push(Action::Rescan);
        }
    });
}

fn demo_entry(ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.horizontal(|ui| {
            ui.strong("Built-in demo model");
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                if ui.button("Load demo").clicked() {
                    actions.push(Action::LoadModel(ModelSource::Demo));
                }
            });
        });
        ui.colored_label(ui.visuals().warn_fg_color, DEMO_LABEL);
        ui.weak("Tiny and always available: shows the whole app working without a download.");
    });
}

fn model_entry(
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
    model: &ScannedModel,
    context: usize,
    gpu_totals: &[u64],
) {
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.horizontal(|ui| {
            ui.strong(&model.name);
            if model.result.is_ok() {
                ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                    if ui.button(format!("Load {}", model.name)).clicked() {
                        actions.push(Action::LoadModel(ModelSource::Dir(model.folder.clone())));
                    }
                });
            }
        });
        ui.weak(model.folder.display().to_string());
        match &model.result {
            Ok(summary) => summary_lines(ui, summary, context, gpu_totals),
            Err(problem) => {
                ui.colored_label(
                    ui.visuals().error_fg_color,
                    format!("Cannot use: {problem}"),
                );
            }
        }
    });
}

fn summary_lines(
    ui: &mut egui::Ui,
    summary: &CheckpointSummary,
    context: usize,
    gpu_totals: &[u64],
) {
    ui.label(format!(
        "{} on disk · weights {} · {} layers · {} shard file(s)",
        human_bytes(summary.size_on_disk),
        summary.formats_text(),
        summary.layers,
        summary.shards
    ));
    let needed = estimate::memory_needed(summary.weights_bytes, &summary.cache, context);
    let context_text = format!("{context} tokens of context");
    match estimate::fit(needed, gpu_totals) {
        Fit::Fits { needed, available } => {
            ui.label(format!(
                "Fits: needs about {} for {context_text}; GPUs have {}.",
                human_bytes(needed),
                human_bytes(available)
            ));
        }
        Fit::TooBig { needed, available } => {
            ui.colored_label(
                ui.visuals().warn_fg_color,
                format!(
                    "Does not fit: needs about {} for {context_text}; GPUs have {}.",
                    human_bytes(needed),
                    human_bytes(available)
                ),
            );
        }
        Fit::NoGpuInfo { needed } => {
            ui.label(format!(
                "Needs about {} for {context_text} (no GPU detected yet: load on CUDA to compare).",
                human_bytes(needed)
            ));
        }
    }
}

/// Memory of the GPUs the settings choose (all detected ones when the list is empty): the fit
/// estimate is made against these.
fn chosen_gpu_memory(app: &ChatApp) -> Vec<u64> {
    let chosen: Option<&Vec<usize>> = match &app.settings.engine.backend {
        dsv4_engine::api::BackendChoice::Cuda { devices } if !devices.is_empty() => Some(devices),
        _ => None,
    };
    let loaded = app.engine.model.iter().flat_map(|m| m.gpus.iter());
    let gpus: Vec<&dsv4_engine::api::GpuStatus> = if app.engine.detected_gpus.is_empty() {
        loaded.collect()
    } else {
        app.engine.detected_gpus.iter().collect()
    };
    gpus.into_iter()
        .filter(|g| chosen.is_none_or(|c| c.contains(&g.ordinal)))
        .map(|g| g.memory_total_bytes)
        .collect()
}
