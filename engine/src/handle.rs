//! Starting the engine thread and talking to it.

use crate::api::{Command, EngineSettings, Event};
use crate::runtime::Runtime;
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Called after every event so a UI can repaint (e.g. `egui::Context::request_repaint`).
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// The front end's end of the engine thread. Dropping it shuts the engine down.
pub struct EngineHandle {
    pub commands: Sender<Command>,
    pub events: Receiver<Event>,
    thread: Option<JoinHandle<()>>,
}

/// Starts the engine thread. It owns the model (and GPUs); nothing is loaded until a
/// [`Command::LoadModel`] arrives.
pub fn spawn(settings: EngineSettings, waker: Waker) -> std::io::Result<EngineHandle> {
    let (cmd_tx, cmd_rx) = unbounded();
    let (ev_tx, ev_rx) = unbounded();
    let thread = std::thread::Builder::new()
        .name("dsv4-engine".into())
        .spawn(move || Runtime::new(settings, ev_tx, waker).run(cmd_rx))?;
    Ok(EngineHandle {
        commands: cmd_tx,
        events: ev_rx,
        thread: Some(thread),
    })
}

impl EngineHandle {
    /// Sends a command; returns `false` when the engine thread is gone.
    pub fn send(&self, cmd: Command) -> bool {
        self.commands.send(cmd).is_ok()
    }

    /// Asks the engine to stop and waits for it.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
