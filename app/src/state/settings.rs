//! The app's settings, saved as `settings.json` in the data directory.

use crate::persist::{self, Loaded, PersistError, WriteJob};
use dsv4_engine::api::{EngineSettings, ModelSource, SamplingParams, ThinkingMode};
use std::path::{Path, PathBuf};

pub const SETTINGS_FILE: &str = "settings.json";

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AppSettings {
    pub engine: EngineSettings,
    /// Sampling used for new turns.
    pub sampling: SamplingParams,
    /// Thinking mode given to new conversations.
    pub thinking: ThinkingMode,
    /// Folders scanned for checkpoints.
    pub model_folders: Vec<PathBuf>,
    /// The model loaded at start; `None` loads the built-in demo model.
    pub model: Option<ModelSource>,
}

impl Default for AppSettings {
    fn default() -> Self {
        let mut engine = EngineSettings::default();
        // Graph buckets above the batch limit would never be used; keep the defaults valid.
        let max_batch = engine.max_batch;
        engine.graph_buckets.retain(|&b| b <= max_batch);
        AppSettings {
            engine,
            sampling: SamplingParams::default(),
            thinking: ThinkingMode::Off,
            model_folders: Vec::new(),
            model: None,
        }
    }
}

/// What loading the settings found, with a message for the user when something was wrong.
pub struct LoadedSettings {
    pub settings: AppSettings,
    pub problem: Option<String>,
}

pub fn load(dir: &Path) -> LoadedSettings {
    let path = dir.join(SETTINGS_FILE);
    match persist::load_json::<AppSettings>(&path) {
        Ok(Loaded::Ok(settings)) => {
            let problems = super::validate::validate(&settings);
            if problems.is_empty() {
                LoadedSettings {
                    settings,
                    problem: None,
                }
            } else {
                LoadedSettings {
                    settings: AppSettings::default(),
                    problem: Some(format!(
                        "Saved settings were invalid ({}); using defaults.",
                        problems.join("; ")
                    )),
                }
            }
        }
        Ok(Loaded::Missing) => LoadedSettings {
            settings: AppSettings::default(),
            problem: None,
        },
        Ok(Loaded::SetAside { reason, moved_to }) => LoadedSettings {
            settings: AppSettings::default(),
            problem: Some(format!(
                "Damaged settings were set aside as {} ({reason}); using defaults.",
                moved_to.display()
            )),
        },
        Err(e) => LoadedSettings {
            settings: AppSettings::default(),
            problem: Some(e.to_string()),
        },
    }
}

pub fn save_job(dir: &Path, settings: &AppSettings) -> Result<WriteJob, PersistError> {
    let path = dir.join(SETTINGS_FILE);
    match serde_json::to_vec_pretty(settings) {
        Ok(bytes) => Ok(WriteJob::Write { path, bytes }),
        Err(source) => Err(PersistError::Encode {
            path: path.display().to_string(),
            source,
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn default_settings_are_valid() {
        assert!(super::super::validate::validate(&AppSettings::default()).is_empty());
    }

    #[test]
    fn settings_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = AppSettings::default();
        settings.sampling.temperature = 0.6;
        settings.model_folders.push("/models".into());
        settings.model = Some(ModelSource::Dir("/models/v4".into()));
        match save_job(dir.path(), &settings).unwrap() {
            WriteJob::Write { path, bytes } => persist::write_atomically(&path, &bytes).unwrap(),
            WriteJob::Remove { .. } => panic!("expected a write"),
        }
        let loaded = load(dir.path());
        assert!(loaded.problem.is_none());
        assert_eq!(loaded.settings, settings);
    }

    #[test]
    fn damaged_settings_fall_back_to_defaults_with_a_message() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SETTINGS_FILE), b"[1,2").unwrap();
        let loaded = load(dir.path());
        assert_eq!(loaded.settings, AppSettings::default());
        assert!(loaded.problem.unwrap().contains("set aside"));
    }
}
