//! Draws parsed Markdown with egui: styled text runs, lists, quotes, and code blocks with a
//! copy button.

use super::markdown::{parse_blocks, Block, ListItem, ListMarker, Span};
use egui::text::LayoutJob;
use egui::{Color32, FontId, TextFormat};

pub fn show(ui: &mut egui::Ui, text: &str) {
    for block in parse_blocks(text) {
        match block {
            Block::Heading { level, spans } => heading(ui, level, &spans),
            Block::Paragraph(spans) => {
                ui.label(layout(ui, &spans, body_font(ui), ui.visuals().text_color()));
            }
            Block::List(items) => list(ui, &items),
            Block::Quote(spans) => quote(ui, &spans),
            Block::Code { lang, code } => code_block(ui, &lang, &code),
            Block::Rule => {
                ui.separator();
            }
        }
        ui.add_space(4.0);
    }
}

fn body_font(ui: &egui::Ui) -> FontId {
    egui::TextStyle::Body.resolve(ui.style())
}

fn heading(ui: &mut egui::Ui, level: u8, spans: &[Span]) {
    let body = body_font(ui);
    let size = match level {
        1 => body.size * 1.6,
        2 => body.size * 1.35,
        3 => body.size * 1.15,
        _ => body.size,
    };
    let font = FontId::new(size, body.family);
    ui.label(layout(ui, spans, font, ui.visuals().strong_text_color()));
}

/// One run of styled spans as a wrapped text layout.
fn layout(ui: &egui::Ui, spans: &[Span], font: FontId, color: Color32) -> LayoutJob {
    let mut job = LayoutJob::default();
    let mono = egui::TextStyle::Monospace.resolve(ui.style());
    for span in spans {
        let mut format = TextFormat {
            font_id: font.clone(),
            color,
            ..TextFormat::default()
        };
        if span.style.bold {
            // The default fonts have no bold face; a stronger colour stands in, like RichText::strong.
            format.color = ui.visuals().strong_text_color();
        }
        if span.style.italic {
            format.italics = true;
        }
        if span.style.code {
            format.font_id = FontId::new(mono.size, mono.family.clone());
            format.background = ui.visuals().code_bg_color;
        }
        job.append(&span.text, 0.0, format);
    }
    job.wrap.max_width = ui.available_width();
    job
}

fn list(ui: &mut egui::Ui, items: &[ListItem]) {
    for item in items {
        ui.horizontal_top(|ui| {
            ui.add_space(12.0 + 18.0 * item.depth as f32);
            let marker = match item.marker {
                ListMarker::Bullet => "•".to_string(),
                ListMarker::Number(n) => format!("{n}."),
            };
            ui.label(marker);
            ui.label(layout(
                ui,
                &item.spans,
                body_font(ui),
                ui.visuals().text_color(),
            ));
        });
    }
}

fn quote(ui: &mut egui::Ui, spans: &[Span]) {
    egui::Frame::new()
        .inner_margin(egui::Margin {
            left: 10,
            ..egui::Margin::same(2)
        })
        .stroke(egui::Stroke::new(1.0, ui.visuals().weak_text_color()))
        .show(ui, |ui| {
            ui.label(layout(
                ui,
                spans,
                body_font(ui),
                ui.visuals().weak_text_color(),
            ));
        });
}

fn code_block(ui: &mut egui::Ui, lang: &str, code: &str) {
    egui::Frame::new()
        .fill(ui.visuals().code_bg_color)
        .corner_radius(4)
        .inner_margin(8)
        .show(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                ui.weak(if lang.is_empty() { "code" } else { lang });
                ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                    if ui.small_button("Copy code").clicked() {
                        ui.ctx().copy_text(code.to_string());
                    }
                });
            });
            ui.add(egui::Label::new(egui::RichText::new(code).monospace()).wrap());
        });
}
