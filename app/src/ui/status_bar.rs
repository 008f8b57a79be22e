//! The status bar: engine state with load progress, live tok/s, GPUs.

use crate::app::transient::EngineStatus;
use crate::app::ChatApp;
use crate::scan::estimate::human_bytes;

pub fn draw(ui: &mut egui::Ui, app: &ChatApp) {
    ui.horizontal(|ui| {
        engine_state(ui, app);
        if let Some(active) = &app.engine.active {
            ui.separator();
            match &active.live {
                Some(stats) if stats.generated_tokens > 0 => {
                    ui.label(format!(
                        "Generating: {:.1} tok/s, {} tokens",
                        stats.decode_tok_s, stats.generated_tokens
                    ));
                }
                _ => {
                    ui.label(format!(
                        "Reading the prompt… {:.1} s",
                        active.started.elapsed().as_secs_f32()
                    ));
                    // The prompt timer has no engine event behind it: tick it ourselves.
                    ui.ctx()
                        .request_repaint_after(std::time::Duration::from_millis(250));
                }
            }
        }
        gpus(ui, app);
    });
}

fn engine_state(ui: &mut egui::Ui, app: &ChatApp) {
    match &app.engine.status {
        EngineStatus::Starting => {
            ui.label("Engine: starting");
        }
        EngineStatus::Loading {
            fraction,
            message,
            eta,
        } => {
            ui.label("Engine: loading");
            let eta_text = eta
                .map(|d| format!(" (about {} s left)", d.as_secs().max(1)))
                .unwrap_or_default();
            ui.add(
                egui::ProgressBar::new(*fraction)
                    .desired_width(220.0)
                    .show_percentage()
                    .animate(true),
            );
            ui.label(format!("{message}{eta_text}"));
        }
        EngineStatus::Ready if app.engine.active.is_some() => {
            ui.label("Engine: busy");
        }
        EngineStatus::Ready => {
            ui.label("Engine: ready");
        }
        EngineStatus::Failed(message) => {
            ui.colored_label(
                ui.visuals().error_fg_color,
                format!("Engine: error: {message}"),
            );
        }
    }
}

fn gpus(ui: &mut egui::Ui, app: &ChatApp) {
    let Some(model) = &app.engine.model else {
        return;
    };
    ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
        if model.gpus.is_empty() {
            ui.weak(format!("Backend: {}", model.backend));
        }
        for gpu in model.gpus.iter().rev() {
            ui.label(format!(
                "GPU {} {}: {} / {}",
                gpu.ordinal,
                gpu.name,
                human_bytes(gpu.memory_used_bytes),
                human_bytes(gpu.memory_total_bytes)
            ));
        }
    });
}
