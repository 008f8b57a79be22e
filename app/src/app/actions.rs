//! What the user asked for (collected while drawing) applied to state and sent to the engine.

use super::transient::{ActiveTurn, Banner, EngineStatus, SettingsDraft};
use super::ChatApp;
use crate::state::conversations::{title_from, StoredMessage};
use crate::state::validate;
use crate::ui::Action;
use dsv4_engine::api::{BackendChoice, Command, ConversationId, ModelSource};
use std::time::Instant;

/// Title a conversation keeps until its first message names it.
const UNTITLED: &str = "New conversation";

impl ChatApp {
    pub(crate) fn apply(&mut self, action: Action) {
        match action {
            Action::NewConversation => self.new_conversation(),
            Action::Select(id) => {
                self.view.selected = Some(id);
                self.view.editing = None;
            }
            Action::Rename(id, title) => self.rename(id, title),
            Action::Delete(id) => self.delete(id),
            Action::Send => self.send_composer(),
            Action::Stop => self.stop(),
            Action::Regenerate(id) => self.regenerate(id),
            Action::EditAndResend { id, index, text } => self.edit_and_resend(id, index, text),
            Action::SetThinking(id, mode) => self.update_conversation(id, |c| c.thinking = mode),
            Action::SetSystemPrompt(id, text) => {
                self.update_conversation(id, |c| c.system_prompt = text)
            }
            Action::LoadModel(source) => self.choose_model(source),
            Action::ReloadModel => {
                let source = self.settings.model.clone().unwrap_or(ModelSource::Demo);
                self.load_model(source);
            }
            Action::AddFolder(path) => self.add_folder(path),
            Action::RemoveFolder(index) => self.remove_folder(index),
            Action::Rescan => self.start_scan(),
            Action::OpenSettings => self.open_settings(),
            Action::ApplySettings(draft) => self.apply_settings(*draft),
            Action::DismissBanner(index) => {
                if index < self.view.banners.len() {
                    self.view.banners.remove(index);
                }
            }
        }
    }

    fn new_conversation(&mut self) {
        let id = self.store.create(self.settings.thinking);
        self.view.selected = Some(id);
        self.view.search.clear();
        self.view.focus_composer = true;
        self.mark_dirty(id);
    }

    fn rename(&mut self, id: ConversationId, title: String) {
        let title = title.trim().to_string();
        if !title.is_empty() {
            self.update_conversation(id, |c| c.title = title);
        }
        self.view.renaming = None;
    }

    fn delete(&mut self, id: ConversationId) {
        if let Some(active) = self.engine.active.as_ref().filter(|a| a.conversation == id) {
            let turn = active.turn;
            self.send_command(Command::Cancel(turn));
            self.engine.active = None;
        }
        self.store.remove(id);
        self.remove_saved(id);
        if self.view.selected == Some(id) {
            self.view.selected = self.store.all().first().map(|c| c.id);
        }
    }

    fn update_conversation(
        &mut self,
        id: ConversationId,
        change: impl FnOnce(&mut crate::state::conversations::Conversation),
    ) {
        if let Some(conversation) = self.store.get_mut(id) {
            change(conversation);
            conversation.updated_unix = crate::state::now_unix();
            self.mark_dirty(id);
        }
    }

    /// Sends the composer's text as a new user message (ignored while a reply is running).
    fn send_composer(&mut self) {
        let text = self.view.composer.trim_end().to_string();
        if text.trim().is_empty() || self.engine.active.is_some() {
            return;
        }
        let id = match self
            .view
            .selected
            .filter(|id| self.store.get(*id).is_some())
        {
            Some(id) => id,
            None => {
                self.new_conversation();
                self.view.selected.unwrap_or_default()
            }
        };
        self.view.composer.clear();
        self.view.focus_composer = true;
        self.update_conversation(id, |c| {
            if c.title == UNTITLED && c.messages.is_empty() {
                c.title = title_from(&text);
            }
            c.messages.push(StoredMessage::user(text));
        });
        self.submit(id);
    }

    /// Appends an empty reply to conversation `id` and asks the engine to fill it.
    fn submit(&mut self, id: ConversationId) {
        let Some(conversation) = self.store.get_mut(id) else {
            return;
        };
        let messages = conversation.prompt();
        let thinking = conversation.thinking;
        conversation.messages.push(StoredMessage::empty_reply());
        let turn = self.engine.next_turn;
        self.engine.next_turn += 1;
        self.engine.active = Some(ActiveTurn {
            turn,
            conversation: id,
            started: Instant::now(),
            live: None,
            last_partial_save: Instant::now(),
        });
        self.send_command(Command::Submit {
            turn,
            conversation: id,
            messages,
            sampling: self.settings.sampling.clone(),
            thinking,
        });
    }

    fn stop(&mut self) {
        if let Some(turn) = self.engine.active.as_ref().map(|a| a.turn) {
            // The engine answers with `Finished { Cancelled }`, which closes the reply.
            self.send_command(Command::Cancel(turn));
        }
    }

    fn regenerate(&mut self, id: ConversationId) {
        if self.engine.active.is_some() {
            return;
        }
        let Some(conversation) = self.store.get_mut(id) else {
            return;
        };
        if conversation.messages.last().map(|m| m.role) != Some(dsv4_engine::api::Role::Assistant) {
            return;
        }
        conversation.messages.pop();
        self.submit(id);
    }

    /// Replaces user message `index` with `text`, drops everything after it, and asks again.
    fn edit_and_resend(&mut self, id: ConversationId, index: usize, text: String) {
        self.view.editing = None;
        if self.engine.active.is_some() || text.trim().is_empty() {
            return;
        }
        let Some(conversation) = self.store.get_mut(id) else {
            return;
        };
        if index >= conversation.messages.len() {
            return;
        }
        conversation.messages.truncate(index);
        conversation.messages.push(StoredMessage::user(text));
        self.submit(id);
    }

    pub(crate) fn load_model(&mut self, source: ModelSource) {
        if let Some(active) = self.engine.active.as_ref() {
            let turn = active.turn;
            self.send_command(Command::Cancel(turn));
        }
        self.engine.status = EngineStatus::Loading {
            fraction: 0.0,
            message: "Starting to load".into(),
            eta: None,
        };
        self.send_command(Command::LoadModel(source));
    }

    fn choose_model(&mut self, source: ModelSource) {
        self.settings.model = match source {
            ModelSource::Demo => None,
            ModelSource::Dir(_) => Some(source.clone()),
        };
        self.save_settings();
        self.load_model(source);
    }

    fn add_folder(&mut self, path: std::path::PathBuf) {
        if !self.settings.model_folders.contains(&path) {
            self.settings.model_folders.push(path);
            self.save_settings();
        }
        self.view.picker.new_folder.clear();
        self.start_scan();
    }

    fn remove_folder(&mut self, index: usize) {
        if index < self.settings.model_folders.len() {
            self.settings.model_folders.remove(index);
            self.save_settings();
            self.start_scan();
        }
    }

    /// Scans the model folders on a background thread; results arrive through a channel.
    pub(crate) fn start_scan(&mut self) {
        let folders = self.settings.model_folders.clone();
        let (tx, rx) = crossbeam_channel::bounded(1);
        let repaint = self.repaint_target.get().cloned();
        let spawned = std::thread::Builder::new()
            .name("dsv4-chat-scan".into())
            .spawn(move || {
                let _ = tx.send(crate::scan::scan_folders(&folders));
                if let Some(ctx) = repaint {
                    ctx.request_repaint();
                }
            });
        match spawned {
            Ok(_) => self.view.picker.scanning = Some(rx),
            Err(e) => self
                .view
                .push_banner(Banner::error(format!("Could not scan for models: {e}"))),
        }
        self.view.picker.scanned_once = true;
    }

    fn open_settings(&mut self) {
        let settings = self.settings.clone();
        let (use_cuda, gpus) = match &settings.engine.backend {
            BackendChoice::Cpu => (false, Vec::new()),
            BackendChoice::Cuda { devices } => (true, devices.clone()),
        };
        self.view.settings_draft = Some(SettingsDraft {
            buckets_text: validate::format_number_list(&settings.engine.graph_buckets),
            gpus_text: validate::format_number_list(&gpus),
            use_cuda,
            settings,
            problems: Vec::new(),
        });
        self.view.show_settings = true;
    }

    /// Validates the draft; valid settings are saved, sent to the engine, and the ones that
    /// need a reload are listed until the next load.
    fn apply_settings(&mut self, mut draft: SettingsDraft) {
        let mut problems = Vec::new();
        match validate::parse_number_list(&draft.buckets_text) {
            Ok(buckets) => draft.settings.engine.graph_buckets = buckets,
            Err(e) => problems.push(format!("Graph buckets: {e}")),
        }
        match validate::parse_number_list(&draft.gpus_text) {
            Ok(devices) if draft.use_cuda => {
                draft.settings.engine.backend = BackendChoice::Cuda { devices }
            }
            Ok(_) => draft.settings.engine.backend = BackendChoice::Cpu,
            Err(e) => problems.push(format!("GPUs: {e}")),
        }
        problems.extend(validate::validate(&draft.settings));
        if !problems.is_empty() {
            draft.problems = problems;
            self.view.settings_draft = Some(draft);
            return;
        }
        let reload =
            validate::changes_needing_reload(&self.settings.engine, &draft.settings.engine);
        for item in reload {
            if !self.engine.pending_reload.contains(&item) {
                self.engine.pending_reload.push(item);
            }
        }
        self.settings = draft.settings;
        self.save_settings();
        self.send_command(Command::UpdateSettings(self.settings.engine.clone()));
        self.view.settings_draft = None;
        self.view.show_settings = false;
    }
}
