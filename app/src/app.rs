//! The eframe app: owns the persisted state, the transient view state and the engine link, and
//! wires them together once per frame: drain engine events, handle shortcuts, draw, apply the
//! actions the drawing produced, queue saves.

mod actions;
mod events;
pub mod transient;

use crate::engine_link::{EngineChoice, EngineLink};
use crate::persist::BackgroundWriter;
use crate::state::conversations::ConversationStore;
use crate::state::settings::{self, AppSettings};
use crate::ui;
use dsv4_engine::api::{Command, ConversationId, ModelSource};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use transient::{Banner, EngineView, ViewState};

/// How to start the app (tests pass a temp data dir and a fast fake engine).
#[derive(Debug, Clone)]
pub struct AppConfig {
    /// `None`: keep everything in memory.
    pub data_dir: Option<PathBuf>,
    pub engine: EngineChoice,
}

impl AppConfig {
    /// The normal desktop start: the user's data dir and the real engine.
    pub fn from_environment() -> Self {
        AppConfig {
            data_dir: crate::state::data_dir(),
            engine: EngineChoice::Real,
        }
    }
}

pub struct ChatApp {
    pub(crate) store: ConversationStore,
    pub(crate) settings: AppSettings,
    pub(crate) view: ViewState,
    pub(crate) engine: EngineView,
    data_dir: Option<PathBuf>,
    writer: Option<BackgroundWriter>,
    link: EngineLink,
    /// Filled with the egui context on the first frame; the engine's waker repaints through it.
    repaint_target: Arc<OnceLock<egui::Context>>,
    /// Conversations changed since the last save.
    dirty: BTreeSet<ConversationId>,
}

impl ChatApp {
    pub fn new(config: AppConfig) -> Self {
        let mut view = ViewState::default();
        let (store, settings, writer) = load_state(config.data_dir.as_ref(), &mut view);
        let repaint_target: Arc<OnceLock<egui::Context>> = Arc::new(OnceLock::new());
        let waker_target = Arc::clone(&repaint_target);
        let waker = Box::new(move || {
            if let Some(ctx) = waker_target.get() {
                ctx.request_repaint();
            }
        });
        let link = EngineLink::start(config.engine, settings.engine.clone(), waker);
        let mut app = ChatApp {
            view,
            engine: EngineView::default(),
            data_dir: config.data_dir,
            writer,
            link,
            repaint_target,
            dirty: BTreeSet::new(),
            store,
            settings,
        };
        app.view.selected = app.store.all().first().map(|c| c.id);
        // A new user sees the whole loop work at once: load the demo unless a model was chosen.
        let source = app.settings.model.clone().unwrap_or(ModelSource::Demo);
        app.load_model(source);
        app
    }

    /// Lets the engine wake the UI before the first frame (the desktop start has the context).
    pub fn set_repaint_context(&self, ctx: &egui::Context) {
        let _ = self.repaint_target.set(ctx.clone());
    }

    /// One frame: the whole UI inside `ui` (called by eframe and by the headless tests).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        self.set_repaint_context(ui.ctx());
        self.drain_engine_events();
        self.handle_shortcuts(ui.ctx());
        let mut actions = Vec::new();
        ui::draw(ui, self, &mut actions);
        for action in actions {
            self.apply(action);
        }
        self.flush_saves();
    }

    pub fn is_fake_engine(&self) -> bool {
        self.link.is_fake()
    }

    /// All conversations, newest first.
    pub fn conversations(&self) -> &[crate::state::conversations::Conversation] {
        self.store.all()
    }

    pub fn selected_conversation(&self) -> Option<&crate::state::conversations::Conversation> {
        self.view.selected.and_then(|id| self.store.get(id))
    }

    /// True while a reply is being generated.
    pub fn is_generating(&self) -> bool {
        self.engine.active.is_some()
    }

    pub fn settings(&self) -> &AppSettings {
        &self.settings
    }

    fn handle_shortcuts(&mut self, ctx: &egui::Context) {
        if ctx.input_mut(|i| i.consume_key(egui::Modifiers::COMMAND, egui::Key::N)) {
            self.apply(ui::Action::NewConversation);
        }
        if self.engine.active.is_some()
            && ctx.input_mut(|i| i.consume_key(egui::Modifiers::NONE, egui::Key::Escape))
        {
            self.apply(ui::Action::Stop);
        }
    }

    pub(crate) fn send_command(&mut self, command: Command) {
        if !self.link.send(command) {
            self.view
                .push_banner(Banner::error("The engine has stopped; restart the app."));
        }
    }

    pub(crate) fn mark_dirty(&mut self, id: ConversationId) {
        self.dirty.insert(id);
    }

    /// Queues a save of every changed conversation; the writer thread does the disk work.
    fn flush_saves(&mut self) {
        let Some(writer) = &self.writer else {
            self.dirty.clear();
            return;
        };
        for id in std::mem::take(&mut self.dirty) {
            match self.store.save_job(id) {
                Some(Ok(job)) => writer.submit(job),
                Some(Err(e)) => self.view.push_banner(Banner::error(e.to_string())),
                None => {}
            }
        }
        for failure in writer.take_failures() {
            self.view
                .push_banner(Banner::error(format!("Could not save: {failure}")));
        }
    }

    pub(crate) fn save_settings(&mut self) {
        let (Some(dir), Some(writer)) = (&self.data_dir, &self.writer) else {
            return;
        };
        match settings::save_job(dir, &self.settings) {
            Ok(job) => writer.submit(job),
            Err(e) => self.view.push_banner(Banner::error(e.to_string())),
        }
    }

    pub(crate) fn remove_saved(&mut self, id: ConversationId) {
        self.dirty.remove(&id);
        if let (Some(writer), Some(job)) = (&self.writer, self.store.remove_job(id)) {
            writer.submit(job);
        }
    }
}

/// Loads conversations and settings; problems become banners, never errors.
fn load_state(
    data_dir: Option<&PathBuf>,
    view: &mut ViewState,
) -> (ConversationStore, AppSettings, Option<BackgroundWriter>) {
    let Some(dir) = data_dir else {
        return (ConversationStore::in_memory(), AppSettings::default(), None);
    };
    let (store, problems) = ConversationStore::load(dir.join("conversations"));
    for problem in problems {
        view.push_banner(Banner::error(problem.message));
    }
    let loaded = settings::load(dir);
    if let Some(problem) = loaded.problem {
        view.push_banner(Banner::error(problem));
    }
    let writer = match BackgroundWriter::spawn() {
        Ok(writer) => Some(writer),
        Err(e) => {
            view.push_banner(Banner::error(format!("History will not be saved: {e}")));
            None
        }
    };
    (store, loaded.settings, writer)
}

impl eframe::App for ChatApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }

    fn on_exit(&mut self, _gl: Option<&eframe::glow::Context>) {
        // Queue what is left; dropping the writer (with the app) waits for it to be written.
        self.flush_saves();
    }
}
