//! The About box: version and the commit the binary was built from.

use crate::app::ChatApp;

/// `git rev-parse --short HEAD` at build time (see `build.rs`), or "unknown".
pub const COMMIT: &str = env!("DSV4_GIT_COMMIT");
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub fn window(ctx: &egui::Context, app: &mut ChatApp) {
    let is_fake = app.is_fake_engine();
    egui::Window::new("About dsv4-chat")
        .open(&mut app.view.show_about)
        .collapsible(false)
        .resizable(false)
        .pivot(egui::Align2::CENTER_CENTER)
        .default_pos(ctx.content_rect().center())
        .show(ctx, |ui| {
            ui.heading("dsv4-chat");
            ui.label("A desktop chat app that runs DeepSeek-V4-Flash locally.");
            ui.label(format!("Version {VERSION} (commit {COMMIT})"));
            if is_fake {
                ui.weak("Engine: built-in fake engine with canned replies.");
            }
            ui.weak("License: MIT");
        });
}
