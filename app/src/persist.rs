//! Crash-safe files: atomic writes, loading that sets damaged files aside, and a background
//! writer so the UI thread never waits on the disk.
//!
//! A write goes to a temp file in the same directory, is fsynced, then renamed over the target.
//! A rename within one directory is atomic, so a reader (or the next start after a crash) sees
//! either the old complete file or the new complete file, never a mix.

use serde::de::DeserializeOwned;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

/// Marks temp files so they can be recognised (and ignored) after a crash.
const TEMP_MARKER: &str = ".tmp-";

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("{path}: cannot {action}: {source}")]
    Io {
        path: String,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: cannot encode: {source}")]
    Encode {
        path: String,
        source: serde_json::Error,
    },
}

fn io_error(path: &Path, action: &'static str, source: std::io::Error) -> PersistError {
    PersistError::Io {
        path: path.display().to_string(),
        action,
        source,
    }
}

/// A unique temp path beside `path` (same directory, so the final rename is atomic).
fn temp_path_for(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}{TEMP_MARKER}{}-{n}", std::process::id()))
}

/// True for the temp files [`write_atomically`] creates (leftovers of an interrupted write).
pub fn is_temp_file(path: &Path) -> bool {
    path.file_name()
        .map(|n| n.to_string_lossy().contains(TEMP_MARKER))
        .unwrap_or(false)
}

/// Writes `bytes` to `path` so that `path` always holds either its old or its new content.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| io_error(dir, "create directory", e))?;
    }
    let temp = temp_path_for(path);
    let result = write_temp_then_rename(&temp, path, bytes);
    if result.is_err() {
        // The temp file is garbage now; the target is untouched.
        let _ = fs::remove_file(&temp);
    }
    result
}

fn write_temp_then_rename(temp: &Path, path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    let mut file = File::create(temp).map_err(|e| io_error(temp, "create", e))?;
    file.write_all(bytes)
        .map_err(|e| io_error(temp, "write", e))?;
    // Data must be on disk before the rename makes it visible, or a power cut could leave
    // a renamed but empty file.
    file.sync_all().map_err(|e| io_error(temp, "fsync", e))?;
    drop(file);
    fs::rename(temp, path).map_err(|e| io_error(path, "rename into place", e))?;
    sync_parent_dir(path);
    Ok(())
}

/// Makes the rename itself durable. Best effort: not every platform can fsync a directory.
fn sync_parent_dir(path: &Path) {
    if let Some(dir) = path.parent() {
        if let Ok(handle) = File::open(dir) {
            let _ = handle.sync_all();
        }
    }
}

/// What loading a JSON file found.
#[derive(Debug)]
pub enum Loaded<T> {
    Missing,
    Ok(T),
    /// The file could not be parsed; it was renamed to `moved_to` so it is kept for the user
    /// but no longer stands in the way.
    SetAside {
        reason: String,
        moved_to: PathBuf,
    },
}

/// Reads and parses `path`; a file that does not parse is set aside, not deleted.
pub fn load_json<T: DeserializeOwned>(path: &Path) -> Result<Loaded<T>, PersistError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(io_error(path, "read", e)),
    };
    match serde_json::from_slice(&bytes) {
        Ok(value) => Ok(Loaded::Ok(value)),
        Err(e) => {
            let moved_to = set_aside(path)?;
            Ok(Loaded::SetAside {
                reason: e.to_string(),
                moved_to,
            })
        }
    }
}

/// Renames a damaged file to `<name>.corrupt-<unix seconds>` and returns the new path.
pub fn set_aside(path: &Path) -> Result<PathBuf, PersistError> {
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut moved_to = path.with_file_name(format!("{name}.corrupt-{stamp}"));
    let mut attempt = 1;
    while moved_to.exists() {
        moved_to = path.with_file_name(format!("{name}.corrupt-{stamp}-{attempt}"));
        attempt += 1;
    }
    fs::rename(path, &moved_to).map_err(|e| io_error(path, "set aside", e))?;
    Ok(moved_to)
}

/// Removes temp files an interrupted write left in `dir`; they never hold the only copy.
pub fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if is_temp_file(&path) {
            let _ = fs::remove_file(path);
        }
    }
}

/// One job for the background writer.
#[derive(Debug)]
pub enum WriteJob {
    Write { path: PathBuf, bytes: Vec<u8> },
    Remove { path: PathBuf },
}

/// Runs file writes on its own thread; dropping it waits until every queued job is done, so
/// nothing queued before exit is lost.
pub struct BackgroundWriter {
    jobs: Option<crossbeam_channel::Sender<WriteJob>>,
    failures: crossbeam_channel::Receiver<PersistError>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundWriter {
    pub fn spawn() -> Result<Self, PersistError> {
        let (job_tx, job_rx) = crossbeam_channel::unbounded::<WriteJob>();
        let (fail_tx, fail_rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("dsv4-chat-writer".into())
            .spawn(move || {
                for job in job_rx {
                    if let Err(e) = run_job(job) {
                        let _ = fail_tx.send(e);
                    }
                }
            })
            .map_err(|e| io_error(Path::new("<writer thread>"), "spawn", e))?;
        Ok(BackgroundWriter {
            jobs: Some(job_tx),
            failures: fail_rx,
            thread: Some(thread),
        })
    }

    pub fn submit(&self, job: WriteJob) {
        if let Some(jobs) = &self.jobs {
            // The thread only ends when `jobs` is dropped, so this cannot fail while we hold it.
            let _ = jobs.send(job);
        }
    }

    /// Failures since the last call (shown to the user as a banner).
    pub fn take_failures(&self) -> Vec<PersistError> {
        self.failures.try_iter().collect()
    }
}

fn run_job(job: WriteJob) -> Result<(), PersistError> {
    match job {
        WriteJob::Write { path, bytes } => write_atomically(&path, &bytes),
        WriteJob::Remove { path } => match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&path, "remove", e)),
        },
    }
}

impl Drop for BackgroundWriter {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop after the queued jobs.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "persist_tests.rs"]
mod tests;
