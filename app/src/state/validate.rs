//! Settings validation: every refusal comes with a reason the user can act on.

use super::settings::AppSettings;
use dsv4_engine::api::{EngineSettings, SamplingParams};

/// Smallest context worth running (one sliding window).
const MIN_CONTEXT: usize = 128;

/// Every problem with `settings`, as sentences; empty when they are valid.
pub fn validate(settings: &AppSettings) -> Vec<String> {
    let mut problems = engine_problems(&settings.engine);
    problems.extend(sampling_problems(&settings.sampling));
    problems
}

fn engine_problems(e: &EngineSettings) -> Vec<String> {
    let mut problems = Vec::new();
    if e.max_batch == 0 {
        problems.push("Maximum batch size must be at least 1.".to_string());
    }
    if e.prefill_chunk == 0 {
        problems.push("Prefill chunk must be at least 1 token.".to_string());
    }
    if e.max_context < MIN_CONTEXT {
        problems.push(format!(
            "Maximum context must be at least {MIN_CONTEXT} tokens."
        ));
    }
    if e.cache_budget_mib == 0 {
        problems.push("Cache budget must be more than 0 MiB.".to_string());
    }
    if let Some(problem) = bucket_problem(&e.graph_buckets, e.max_batch, e.cuda_graphs) {
        problems.push(problem);
    }
    problems
}

fn bucket_problem(buckets: &[usize], max_batch: usize, graphs_on: bool) -> Option<String> {
    if buckets.is_empty() {
        return graphs_on.then(|| "CUDA graphs are on but no batch-size bucket is given.".into());
    }
    if buckets.contains(&0) {
        return Some("Graph buckets must be at least 1.".into());
    }
    if buckets.windows(2).any(|w| w[0] >= w[1]) {
        return Some("Graph buckets must be strictly increasing (e.g. 1, 2, 4, 8).".into());
    }
    match buckets.last() {
        Some(&largest) if largest > max_batch => Some(format!(
            "Graph bucket {largest} is larger than the maximum batch size {max_batch}."
        )),
        _ => None,
    }
}

fn sampling_problems(s: &SamplingParams) -> Vec<String> {
    let mut problems = Vec::new();
    if !(s.temperature.is_finite() && s.temperature >= 0.0) {
        problems.push("Temperature must be 0 or more (0 is greedy).".to_string());
    }
    if !(s.top_p > 0.0 && s.top_p <= 1.0) {
        problems.push("Top-p must be in (0, 1]; 1 turns it off.".to_string());
    }
    if !(0.0..=1.0).contains(&s.min_p) {
        problems.push("Min-p must be in [0, 1]; 0 turns it off.".to_string());
    }
    if s.max_tokens == 0 {
        problems.push("Maximum reply length must be at least 1 token.".to_string());
    }
    problems
}

/// Parses "1, 2, 4" into numbers; an empty text is an empty list.
pub fn parse_number_list(text: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<usize>()
                .map_err(|_| format!("{t:?} is not a whole number ≥ 0."))
        })
        .collect()
}

/// Writes a list back as "1, 2, 4".
pub fn format_number_list(numbers: &[usize]) -> String {
    numbers
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The names of changed settings that only apply when the model is loaded again (those the
/// engine's `EngineSettings` marks "reload").
pub fn changes_needing_reload(old: &EngineSettings, new: &EngineSettings) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if old.backend != new.backend {
        changed.push("backend / GPUs");
    }
    if old.split_mode != new.split_mode {
        changed.push("split mode");
    }
    if old.graph_buckets != new.graph_buckets {
        changed.push("graph buckets");
    }
    if old.max_context != new.max_context {
        changed.push("maximum context");
    }
    if old.cache_budget_mib != new.cache_budget_mib {
        changed.push("cache budget");
    }
    changed
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut AppSettings)) -> Vec<String> {
        let mut s = AppSettings::default();
        f(&mut s);
        validate(&s)
    }

    #[test]
    fn refuses_bad_values_with_reasons() {
        assert!(with(|s| s.engine.max_batch = 0)[0].contains("batch"));
        assert!(with(|s| s.engine.graph_buckets = vec![1, 4, 2])[0].contains("increasing"));
        assert!(with(|s| s.engine.graph_buckets = vec![1, 2, 2])[0].contains("increasing"));
        assert!(with(|s| s.engine.graph_buckets = vec![1, 16])[0].contains("larger"));
        assert!(with(|s| s.engine.graph_buckets = vec![0, 1])[0].contains("at least 1"));
        assert!(with(|s| s.sampling.temperature = -0.1)[0].contains("Temperature"));
        assert!(with(|s| s.sampling.temperature = f32::NAN)[0].contains("Temperature"));
        assert!(with(|s| s.sampling.top_p = 0.0)[0].contains("Top-p"));
        assert!(with(|s| s.sampling.top_p = 1.5)[0].contains("Top-p"));
        assert!(with(|s| s.sampling.min_p = -1.0)[0].contains("Min-p"));
        assert!(with(|s| s.engine.max_context = 10)[0].contains("context"));
        assert!(with(|s| s.engine.cache_budget_mib = 0)[0].contains("budget"));
    }

    #[test]
    fn accepts_edge_values() {
        assert!(with(|s| {
            s.sampling.temperature = 0.0;
            s.sampling.top_p = 1.0;
            s.engine.max_batch = 1;
            s.engine.graph_buckets = vec![1];
        })
        .is_empty());
        // No buckets is fine when graphs are off.
        assert!(with(|s| {
            s.engine.cuda_graphs = false;
            s.engine.graph_buckets.clear();
        })
        .is_empty());
        assert!(!with(|s| s.engine.graph_buckets.clear()).is_empty());
    }

    #[test]
    fn number_lists_parse_and_print() {
        assert_eq!(parse_number_list(" 1, 2 ,4,").unwrap(), vec![1, 2, 4]);
        assert_eq!(parse_number_list("").unwrap(), Vec::<usize>::new());
        assert!(parse_number_list("1, two").unwrap_err().contains("two"));
        assert!(parse_number_list("-1").is_err());
        assert_eq!(format_number_list(&[1, 2, 4]), "1, 2, 4");
    }

    #[test]
    fn reload_is_flagged_only_for_load_time_settings() {
        let old = EngineSettings::default();
        let mut new = old.clone();
        new.numerics = dsv4_engine::api::Numerics::Reference;
        assert!(changes_needing_reload(&old, &new).is_empty());
        new.max_context = 1024;
        assert_eq!(changes_needing_reload(&old, &new), vec!["maximum context"]);
    }
}
