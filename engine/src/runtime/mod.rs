//! The engine thread's loop: receive commands, schedule, step the backend, emit events.
//! It is the only place that touches the scheduler, the model and the devices together.

pub mod load;
mod step;
mod submit;
mod turn;

use crate::api::{Command, EngineSettings, Event, FinishReason, TurnId};
use crate::handle::Waker;
use crate::sched::prefix::ConversationCache;
use crossbeam_channel::{Receiver, Sender};
use load::Loaded;
use std::collections::VecDeque;
use turn::Turn;

/// At most this many idle conversations keep their decode state for prefix reuse.
const MAX_IDLE_CONVERSATIONS: usize = 16;

pub struct Runtime {
    settings: EngineSettings,
    events: Sender<Event>,
    waker: Waker,
    loaded: Option<Loaded>,
    /// Submitted turns waiting for a batch slot.
    queue: VecDeque<Turn>,
    /// Turns being prefilled or decoded.
    active: Vec<Turn>,
    /// Idle conversations' caches, least recently used first.
    idle: VecDeque<(u64, ConversationCache)>,
}

impl Runtime {
    pub fn new(settings: EngineSettings, events: Sender<Event>, waker: Waker) -> Self {
        Runtime {
            settings,
            events,
            waker,
            loaded: None,
            queue: VecDeque::new(),
            active: Vec::new(),
            idle: VecDeque::new(),
        }
    }

    /// Runs until `Shutdown` or until every command sender is gone.
    pub fn run(mut self, commands: Receiver<Command>) {
        self.emit(detect_devices());
        loop {
            let busy = !self.active.is_empty() || !self.queue.is_empty();
            if !busy {
                match commands.recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
            while let Ok(cmd) = commands.try_recv() {
                if !self.handle(cmd) {
                    return;
                }
            }
            self.step();
        }
    }

    pub(crate) fn emit(&self, event: Event) {
        if self.events.send(event).is_ok() {
            (self.waker)();
        }
    }

    /// Handles one command; returns `false` on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::LoadModel(source) => self.load_model(&source),
            Command::Submit {
                turn,
                conversation,
                messages,
                sampling,
                thinking,
            } => self.submit(turn, conversation, &messages, sampling, thinking),
            Command::Cancel(turn) => self.cancel(turn),
            Command::UpdateSettings(s) => self.update_settings(s),
            Command::Shutdown => return false,
        }
        true
    }

    fn load_model(&mut self, source: &crate::api::ModelSource) {
        // Everything in flight belongs to the old model.
        let turns: Vec<Turn> = self.queue.drain(..).chain(self.active.drain(..)).collect();
        for t in turns {
            self.emit(Event::TurnFailed {
                turn: t.id,
                message: "cancelled: a new model is being loaded".into(),
            });
        }
        self.idle.clear();
        self.loaded = None;
        let events = self.events.clone();
        let waker = self.waker.clone();
        let mut progress = |fraction: f32, message: &str| {
            let _ = events.send(Event::LoadProgress {
                fraction,
                message: message.to_string(),
                eta: None,
            });
            waker();
        };
        match load::load(source, &self.settings, &mut progress) {
            Ok(loaded) => {
                let info = loaded.info.clone();
                self.loaded = Some(loaded);
                self.emit(Event::Ready(info));
            }
            Err(message) => self.emit(Event::Fatal {
                message: format!("could not load the model: {message}"),
            }),
        }
    }

    fn cancel(&mut self, turn: TurnId) {
        if let Some(pos) = self.queue.iter().position(|t| t.id == turn) {
            if let Some(t) = self.queue.remove(pos) {
                self.finish(t, FinishReason::Cancelled);
            }
        } else if let Some(t) = self.active.iter_mut().find(|t| t.id == turn) {
            // Takes effect at the next step boundary, within one step.
            t.cancelled = true;
        }
    }

    fn update_settings(&mut self, s: EngineSettings) {
        let old = &self.settings;
        let needs_reload = self.loaded.is_some()
            && (old.backend != s.backend
                || old.split_mode != s.split_mode
                || old.numerics != s.numerics
                || old.graph_buckets != s.graph_buckets
                || old.cuda_graphs != s.cuda_graphs
                || old.max_context != s.max_context
                || old.cache_budget_mib != s.cache_budget_mib);
        self.settings = s;
        self.emit(Event::SettingsApplied { needs_reload });
    }
}

/// Probes the GPUs once at start so front ends can size models against them before a load.
fn detect_devices() -> Event {
    match dsv4_kernels::Gpu::probe_all() {
        Ok(gpus) => Event::Devices {
            gpus: gpus
                .into_iter()
                .map(|g| crate::api::GpuStatus {
                    ordinal: g.ordinal,
                    name: g.name,
                    memory_used_bytes: 0,
                    memory_total_bytes: g.total_mem as u64,
                })
                .collect(),
            note: None,
        },
        Err(reason) => Event::Devices {
            gpus: Vec::new(),
            note: Some(format!("no CUDA GPU: {reason}; the CPU backend is used")),
        },
    }
}
