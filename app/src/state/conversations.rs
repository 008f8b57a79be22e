//! Conversations: one JSON file per conversation in `<data dir>/conversations/`, so a damaged
//! file costs one conversation, never the whole history.

use crate::persist::{self, Loaded, PersistError, WriteJob};
use dsv4_engine::api::{ChatMessage, ConversationId, Role, ThinkingMode, TurnStats};
use std::path::{Path, PathBuf};

/// The numbers shown under a finished reply (a serialisable copy of the engine's `TurnStats`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ReplyStats {
    pub prompt_tokens: usize,
    pub cached_prompt_tokens: usize,
    pub generated_tokens: usize,
    pub time_to_first_token_ms: u64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub context_used: usize,
    pub context_limit: usize,
}

impl From<&TurnStats> for ReplyStats {
    fn from(s: &TurnStats) -> Self {
        ReplyStats {
            prompt_tokens: s.prompt_tokens,
            cached_prompt_tokens: s.cached_prompt_tokens,
            generated_tokens: s.generated_tokens,
            time_to_first_token_ms: u64::try_from(s.time_to_first_token.as_millis())
                .unwrap_or(u64::MAX),
            prefill_tok_s: s.prefill_tok_s,
            decode_tok_s: s.decode_tok_s,
            context_used: s.context_used,
            context_limit: s.context_limit,
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredMessage {
    pub role: Role,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<ReplyStats>,
    /// Why a reply ended early ("stopped", "failed: ..."), shown under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl StoredMessage {
    pub fn user(content: impl Into<String>) -> Self {
        StoredMessage {
            role: Role::User,
            content: content.into(),
            reasoning: None,
            stats: None,
            note: None,
        }
    }

    pub fn empty_reply() -> Self {
        StoredMessage {
            role: Role::Assistant,
            ..StoredMessage::user("")
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Conversation {
    pub id: ConversationId,
    pub title: String,
    #[serde(default)]
    pub created_unix: u64,
    #[serde(default)]
    pub updated_unix: u64,
    #[serde(default)]
    pub system_prompt: String,
    #[serde(default)]
    pub thinking: ThinkingMode,
    #[serde(default)]
    pub messages: Vec<StoredMessage>,
}

impl Conversation {
    /// The prompt sent to the engine: the system prompt (if any) then every message that has
    /// content. Empty replies (failed or still pending) are left out.
    pub fn prompt(&self) -> Vec<ChatMessage> {
        let system = (!self.system_prompt.trim().is_empty()).then(|| ChatMessage {
            role: Role::System,
            content: self.system_prompt.clone(),
            reasoning: None,
        });
        let turns = self
            .messages
            .iter()
            .filter(|m| !(m.role == Role::Assistant && m.content.is_empty()))
            .map(|m| ChatMessage {
                role: m.role,
                content: m.content.clone(),
                reasoning: m.reasoning.clone(),
            });
        system.into_iter().chain(turns).collect()
    }

    /// The latest context fill reported for this conversation, as (used, limit).
    pub fn context_fill(&self) -> Option<(usize, usize)> {
        self.messages
            .iter()
            .rev()
            .find_map(|m| m.stats.as_ref())
            .map(|s| (s.context_used, s.context_limit))
    }
}

/// A history file that could not be read.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadProblem {
    pub message: String,
}

/// All conversations, newest first, plus where they are saved.
pub struct ConversationStore {
    /// `None`: no data directory, history is kept in memory only.
    dir: Option<PathBuf>,
    conversations: Vec<Conversation>,
}

impl ConversationStore {
    pub fn in_memory() -> Self {
        ConversationStore {
            dir: None,
            conversations: Vec::new(),
        }
    }

    /// Loads every `*.json` in `dir`; damaged files are set aside and reported.
    pub fn load(dir: PathBuf) -> (Self, Vec<LoadProblem>) {
        persist::remove_stale_temp_files(&dir);
        let mut problems = Vec::new();
        let mut conversations = Vec::new();
        for path in json_files(&dir) {
            match persist::load_json::<Conversation>(&path) {
                Ok(Loaded::Ok(c)) => conversations.push(c),
                Ok(Loaded::Missing) => {}
                Ok(Loaded::SetAside { reason, moved_to }) => problems.push(LoadProblem {
                    message: format!(
                        "A damaged conversation file was set aside as {} ({reason}).",
                        moved_to.display()
                    ),
                }),
                Err(e) => problems.push(LoadProblem {
                    message: e.to_string(),
                }),
            }
        }
        conversations.sort_by(|a, b| b.updated_unix.cmp(&a.updated_unix).then(b.id.cmp(&a.id)));
        let store = ConversationStore {
            dir: Some(dir),
            conversations,
        };
        (store, problems)
    }

    pub fn all(&self) -> &[Conversation] {
        &self.conversations
    }

    pub fn get(&self, id: ConversationId) -> Option<&Conversation> {
        self.conversations.iter().find(|c| c.id == id)
    }

    pub fn get_mut(&mut self, id: ConversationId) -> Option<&mut Conversation> {
        self.conversations.iter_mut().find(|c| c.id == id)
    }

    /// Conversations whose title contains `query` (case-insensitive); all for an empty query.
    pub fn search<'a>(&'a self, query: &'a str) -> impl Iterator<Item = &'a Conversation> + 'a {
        let needle = query.trim().to_lowercase();
        self.conversations
            .iter()
            .filter(move |c| needle.is_empty() || c.title.to_lowercase().contains(&needle))
    }

    /// Creates an empty conversation at the top of the list and returns its id.
    pub fn create(&mut self, thinking: ThinkingMode) -> ConversationId {
        let id = self.conversations.iter().map(|c| c.id).max().unwrap_or(0) + 1;
        let now = super::now_unix();
        self.conversations.insert(
            0,
            Conversation {
                id,
                title: "New conversation".into(),
                created_unix: now,
                updated_unix: now,
                system_prompt: String::new(),
                thinking,
                messages: Vec::new(),
            },
        );
        id
    }

    pub fn remove(&mut self, id: ConversationId) -> Option<Conversation> {
        let index = self.conversations.iter().position(|c| c.id == id)?;
        Some(self.conversations.remove(index))
    }

    /// The job that saves conversation `id` (or `None` when kept in memory only).
    pub fn save_job(&self, id: ConversationId) -> Option<Result<WriteJob, PersistError>> {
        let path = self.file_path(id)?;
        let conversation = self.get(id)?;
        Some(
            serde_json::to_vec_pretty(conversation)
                .map(|bytes| WriteJob::Write {
                    path: path.clone(),
                    bytes,
                })
                .map_err(|source| PersistError::Encode {
                    path: path.display().to_string(),
                    source,
                }),
        )
    }

    /// The job that deletes the file of a removed conversation.
    pub fn remove_job(&self, id: ConversationId) -> Option<WriteJob> {
        self.file_path(id).map(|path| WriteJob::Remove { path })
    }

    fn file_path(&self, id: ConversationId) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{id}.json")))
    }
}

/// The `*.json` files of `dir` (none if it does not exist yet), temp files excluded.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json") && !persist::is_temp_file(p))
        .collect();
    files.sort();
    files
}

/// A title from the first line of the first user message, cut to a readable length.
pub fn title_from(text: &str) -> String {
    const MAX_CHARS: usize = 40;
    let first_line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let trimmed = first_line.trim();
    if trimmed.chars().count() <= MAX_CHARS {
        return trimmed.to_string();
    }
    let cut: String = trimmed.chars().take(MAX_CHARS).collect();
    format!("{}…", cut.trim_end())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "conversations_tests.rs"]
mod tests;
