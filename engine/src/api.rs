//! The engine's public surface: commands in, events out, over crossbeam channels.
//!
//! Front ends (the app, `dsv4 chat`) only ever use these types and [`crate::handle`].

use std::path::PathBuf;
use std::time::Duration;

/// One chat turn (one assistant reply being generated).
pub type TurnId = u64;
/// A conversation: turns of the same conversation may reuse the cached prompt prefix.
pub type ConversationId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One message of a conversation as the front end keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// The reasoning of an assistant message (dropped from the prompt for earlier turns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

pub use crate::chat::ThinkingMode;
pub use crate::sampler::SamplingParams;

/// Which numerics the CPU reference runs (the GPU backend always runs `Official`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Numerics {
    /// f32 math, no activation fake-quantisation (what the golden outputs use).
    Reference,
    /// The FP8/FP4 activation fake-quantisation the model was trained with.
    #[default]
    Official,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The CPU reference model (slow, always available).
    Cpu,
    /// CUDA on the listed device ordinals (empty = all).
    Cuda { devices: Vec<usize> },
}

/// How the model is split over several GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    #[default]
    Tensor,
    Layer,
}

/// Engine settings; those marked "reload" only take effect on the next model load.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct EngineSettings {
    /// reload
    pub backend: BackendChoice,
    /// reload
    pub split_mode: SplitMode,
    pub numerics: Numerics,
    /// Turns decoded together in one step.
    pub max_batch: usize,
    /// Tokens per prefill chunk, so a long prompt does not stall running turns.
    pub prefill_chunk: usize,
    pub cuda_graphs: bool,
    /// reload: batch sizes for which a decode graph is captured.
    pub graph_buckets: Vec<usize>,
    /// reload: maximum context length (tokens) per turn.
    pub max_context: usize,
    /// reload: memory for per-conversation caches, in MiB.
    pub cache_budget_mib: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            // The GPUs when present; without a driver or GPU the engine says so and uses the CPU.
            backend: BackendChoice::Cuda {
                devices: Vec::new(),
            },
            split_mode: SplitMode::Tensor,
            numerics: Numerics::Official,
            max_batch: 8,
            prefill_chunk: 512,
            cuda_graphs: true,
            graph_buckets: vec![1, 2, 4, 8],
            max_context: 65536,
            cache_budget_mib: 4096,
        }
    }
}

/// Where to load a model from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ModelSource {
    /// The built-in tiny random-weight demo model (its replies are noise).
    Demo,
    /// A DeepSeek-V4 checkpoint directory.
    Dir(PathBuf),
}

/// Commands a front end sends to the engine thread.
#[derive(Debug, Clone)]
pub enum Command {
    LoadModel(ModelSource),
    Submit {
        turn: TurnId,
        conversation: ConversationId,
        messages: Vec<ChatMessage>,
        sampling: SamplingParams,
        thinking: ThinkingMode,
    },
    Cancel(TurnId),
    UpdateSettings(EngineSettings),
    Shutdown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaKind {
    Reasoning,
    Answer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model emitted its end-of-sentence token.
    EndOfSentence,
    StopString,
    MaxTokens,
    ContextFull,
    Cancelled,
}

/// Numbers about one finished (or running) turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnStats {
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the conversation's cache instead of being prefilled.
    pub cached_prompt_tokens: usize,
    pub generated_tokens: usize,
    pub time_to_first_token: Duration,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub context_used: usize,
    pub context_limit: usize,
}

/// One GPU as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuStatus {
    pub ordinal: usize,
    pub name: String,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
}

/// What the engine loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    pub source: ModelSource,
    /// The demo model produces noise; front ends must say so.
    pub is_demo: bool,
    pub backend: String,
    pub numerics: Numerics,
    pub layers: usize,
    pub vocab_size: usize,
    pub context_limit: usize,
    pub gpus: Vec<GpuStatus>,
}

/// Events the engine thread sends back; a waker callback runs after each one.
#[derive(Debug, Clone)]
pub enum Event {
    LoadProgress {
        fraction: f32,
        message: String,
        eta: Option<Duration>,
    },
    Ready(ModelInfo),
    /// A piece of streamed text; always complete UTF-8.
    Delta {
        turn: TurnId,
        kind: DeltaKind,
        text: String,
    },
    /// A DSML tool call the model made.
    ToolCall {
        turn: TurnId,
        name: String,
        arguments_json: String,
    },
    /// Live statistics while decoding (at least four times a second).
    Progress {
        turn: TurnId,
        stats: TurnStats,
    },
    Finished {
        turn: TurnId,
        reason: FinishReason,
        stats: TurnStats,
    },
    /// The turn could not run (e.g. prompt longer than the context); the engine keeps serving.
    TurnFailed {
        turn: TurnId,
        message: String,
    },
    /// The GPUs found when the engine started (empty with `note` saying why, e.g. no driver).
    Devices {
        gpus: Vec<GpuStatus>,
        note: Option<String>,
    },
    /// Settings were applied; `needs_reload` when some only apply on the next load.
    SettingsApplied {
        needs_reload: bool,
    },
    /// The model could not be loaded or the device failed; the engine keeps answering commands.
    Fatal {
        message: String,
    },
}
