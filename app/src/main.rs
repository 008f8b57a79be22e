//! dsv4-chat: the desktop app (placeholder window until the app issue lands).

fn main() -> anyhow::Result<()> {
    let options = eframe::NativeOptions::default();
    eframe::run_native(
        "dsv4-chat",
        options,
        Box::new(|_cc| Ok(Box::new(Placeholder))),
    )
    .map_err(|e| anyhow::anyhow!("could not open the window: {e}"))
}

struct Placeholder;

impl eframe::App for Placeholder {
    fn ui(&mut self, ui: &mut eframe::egui::Ui, _frame: &mut eframe::Frame) {
        ui.heading("dsv4-chat");
    }
}
