//! User stop strings, detected across token boundaries in the emitted text.

use crate::chat::holdback::partial_suffix_len;

/// What to show after feeding one piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text that is safe to show now (never contains any part of a stop string).
    pub emit: String,
    /// A stop string was found: generation should end; `emit` is the text before it.
    pub stopped: bool,
}

/// Watches the emitted text for any of the stop strings. Text that might be the start of a
/// stop string is held back until the next piece decides it.
#[derive(Debug, Clone, Default)]
pub struct StopChecker {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopChecker {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            stopped: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Feeds the next piece of emitted text. After a stop, further pieces emit nothing.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome {
                emit: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(text);
        if let Some(pos) = self.earliest_match() {
            self.held.truncate(pos);
            self.stopped = true;
            return StopOutcome {
                emit: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        let patterns: Vec<&str> = self.stops.iter().map(String::as_str).collect();
        let keep = partial_suffix_len(&self.held, &patterns);
        let tail = self.held.split_off(self.held.len() - keep);
        StopOutcome {
            emit: std::mem::replace(&mut self.held, tail),
            stopped: false,
        }
    }

    /// End of generation without a stop: the held-back text is shown after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Byte offset in `held` of the first stop string occurrence (earliest start wins).
    fn earliest_match(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut c = StopChecker::new(&stops);
        let mut shown = String::new();
        for p in pieces {
            let o = c.push(p);
            shown.push_str(&o.emit);
            if o.stopped {
                return (shown, true);
            }
        }
        shown.push_str(&c.finish());
        (shown, false)
    }

    #[test]
    fn stop_split_across_pieces() {
        assert_eq!(
            run(&["STOP"], &["abc S", "T", "OP tail"]),
            ("abc ".into(), true)
        );
        assert_eq!(
            run(&["\n\nUser:"], &["hi\n", "\nUs", "er: x"]),
            ("hi".into(), true)
        );
    }

    #[test]
    fn false_alarm_is_released() {
        assert_eq!(
            run(&["STOP"], &["ST", "ART", " ok"]),
            ("START ok".into(), false)
        );
        assert_eq!(run(&["STOP"], &["a S"]), ("a S".into(), false));
    }

    #[test]
    fn earliest_of_several_and_multibyte() {
        assert_eq!(run(&["bb", "ab"], &["xa", "bb"]), ("x".into(), true));
        assert_eq!(
            run(&["終わり"], &["日本語終", "わり!"]),
            ("日本語".into(), true)
        );
    }

    #[test]
    fn held_text_is_never_shown_early() {
        let stops = vec!["END".to_string()];
        let mut c = StopChecker::new(&stops);
        assert_eq!(c.push("xE").emit, "x");
        assert_eq!(c.push("N").emit, "");
        assert!(c.push("D").stopped);
        assert!(c.push("more").emit.is_empty());
    }
}
