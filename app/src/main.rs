//! dsv4-chat: opens the window; the app itself lives in the library.

use dsv4_chat::app::{AppConfig, ChatApp};

fn main() -> anyhow::Result<()> {
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("dsv4-chat")
            .with_inner_size([1100.0, 720.0])
            .with_min_inner_size([640.0, 400.0]),
        ..eframe::NativeOptions::default()
    };
    eframe::run_native(
        "dsv4-chat",
        options,
        Box::new(|cc| {
            dsv4_chat::fonts::install_fallback_fonts(&cc.egui_ctx);
            let app = ChatApp::new(AppConfig::from_environment());
            app.set_repaint_context(&cc.egui_ctx);
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| anyhow::anyhow!("could not open the window: {e}"))
}
