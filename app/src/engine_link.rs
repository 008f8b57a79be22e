//! The one place the app starts an engine. Everything else talks to [`EngineLink`]: send a
//! command, poll for events; it never blocks.
//!
//! [`EngineChoice::Real`] starts the engine thread with `dsv4_engine::handle::spawn`; the fake
//! engine (canned replies) serves the UI tests that need edge cases on demand.

use crate::fake_engine::{self, FakeEngineOptions};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use dsv4_engine::api::{Command, EngineSettings, Event};
use std::thread::JoinHandle;

/// Called by the engine thread after each event so the UI repaints and drains it.
pub type Waker = Box<dyn Fn() + Send + Sync>;

/// Which engine the link runs.
#[derive(Debug, Clone)]
pub enum EngineChoice {
    /// The real engine thread.
    Real,
    /// The canned-reply fake, with options (tests, screenshots).
    Fake(FakeEngineOptions),
}

pub struct EngineLink {
    commands: Sender<Command>,
    events: Receiver<Event>,
    thread: Option<JoinHandle<()>>,
    /// The real engine's handle; dropping it joins the engine thread.
    handle: Option<dsv4_engine::handle::EngineHandle>,
    /// Set when the engine thread could not be started or has gone away.
    disconnected: bool,
    is_fake: bool,
}

impl EngineLink {
    pub fn start(choice: EngineChoice, settings: EngineSettings, waker: Waker) -> Self {
        match choice {
            EngineChoice::Real => Self::real(settings, waker),
            EngineChoice::Fake(options) => Self::fake(options, settings, waker),
        }
    }

    fn real(settings: EngineSettings, waker: Waker) -> Self {
        match dsv4_engine::handle::spawn(settings, std::sync::Arc::from(waker)) {
            Ok(handle) => {
                let mut link = Self::from_channels(
                    handle.commands.clone(),
                    handle.events.clone(),
                    None,
                    false,
                );
                link.handle = Some(handle);
                link
            }
            Err(_) => Self::dead(),
        }
    }

    fn fake(options: FakeEngineOptions, settings: EngineSettings, waker: Waker) -> Self {
        match fake_engine::spawn(options, settings, waker) {
            Ok((commands, events, thread)) => {
                Self::from_channels(commands, events, Some(thread), true)
            }
            Err(_) => Self::dead(),
        }
    }

    fn from_channels(
        commands: Sender<Command>,
        events: Receiver<Event>,
        thread: Option<JoinHandle<()>>,
        is_fake: bool,
    ) -> Self {
        EngineLink {
            commands,
            events,
            thread,
            handle: None,
            disconnected: false,
            is_fake,
        }
    }

    /// A link whose engine could not start: sends go nowhere and [`Self::is_disconnected`] says so.
    fn dead() -> Self {
        let (commands, _) = crossbeam_channel::unbounded();
        let (_, events) = crossbeam_channel::unbounded();
        let mut link = Self::from_channels(commands, events, None, false);
        link.disconnected = true;
        link
    }

    /// Sends a command; returns false (and marks the link disconnected) if the engine is gone.
    pub fn send(&mut self, command: Command) -> bool {
        let sent = self.commands.send(command).is_ok();
        self.disconnected |= !sent;
        sent
    }

    /// The next event, if one is waiting.
    pub fn try_recv(&mut self) -> Option<Event> {
        match self.events.try_recv() {
            Ok(event) => Some(event),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.disconnected = true;
                None
            }
        }
    }

    pub fn is_disconnected(&self) -> bool {
        self.disconnected
    }

    /// True while the app runs on the canned-reply fake instead of a real engine.
    pub fn is_fake(&self) -> bool {
        self.is_fake
    }
}

impl Drop for EngineLink {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(handle) = self.handle.take() {
            handle.shutdown();
        }
    }
}
