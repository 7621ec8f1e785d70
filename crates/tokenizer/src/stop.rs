//! Stop strings over streamed text, with hold-back.
//!
//! Text arrives as deltas. [`StopStrings::push`] returns the part of the text that can be shown
//! now: everything except a tail that could still grow into a stop string. When a stop string
//! appears, the text before it is released and the match (and anything after it) is dropped.
//!
//! Invariants: released text never contains a stop string, never ends inside a possible stop
//! string prefix, and concatenating every release plus [`StopStrings::finish`] gives the input
//! text (when no stop string matched) or the input text cut before the first match.

/// The outcome of feeding one delta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopCheck {
    /// Text that is final and may be shown.
    pub text: String,
    /// Index into the stop strings of the one that matched, if any: generation must end.
    pub matched: Option<usize>,
}

/// Matches a request's stop strings against its streamed output.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    pending: String,
    done: bool,
}

impl StopStrings {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: &[String]) -> Self {
        StopStrings {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            done: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The stop strings being matched, in the order given.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Feeds a delta; after a match, further deltas release nothing.
    pub fn push(&mut self, delta: &str) -> StopCheck {
        if self.done {
            return StopCheck {
                text: String::new(),
                matched: None,
            };
        }
        if self.stops.is_empty() {
            return StopCheck {
                text: delta.to_owned(),
                matched: None,
            };
        }
        self.pending.push_str(delta);
        // Earliest match wins; among matches at one position, the first stop string given.
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in self.stops.iter().enumerate() {
            if let Some(pos) = self.pending.find(s.as_str()) {
                if best.is_none_or(|(p, _)| pos < p) {
                    best = Some((pos, i));
                }
            }
        }
        if let Some((pos, i)) = best {
            self.done = true;
            let text = self.pending[..pos].to_owned();
            self.pending.clear();
            return StopCheck {
                text,
                matched: Some(i),
            };
        }
        let hold = self.held_suffix_len();
        let cut = self.pending.len() - hold;
        let text = self.pending[..cut].to_owned();
        self.pending.drain(..cut);
        StopCheck {
            text,
            matched: None,
        }
    }

    /// Releases the held-back tail when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of some stop string.
    fn held_suffix_len(&self) -> usize {
        let p = &self.pending;
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let start_min = p.len().saturating_sub(longest.saturating_sub(1));
        for start in start_min..p.len() {
            if !p.is_char_boundary(start) {
                continue;
            }
            let tail = &p[start..];
            if self
                .stops
                .iter()
                .any(|s| s.len() > tail.len() && s.starts_with(tail))
            {
                return p.len() - start;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, Option<usize>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopStrings::new(&stops);
        let mut out = String::new();
        for d in deltas {
            let c = s.push(d);
            out.push_str(&c.text);
            if c.matched.is_some() {
                return (out, c.matched);
            }
        }
        out.push_str(&s.finish());
        (out, None)
    }

    #[test]
    fn stop_string_across_deltas_is_cut() {
        assert_eq!(
            run(&["\n\n"], &["Hello", "\n", "\nWorld"]),
            ("Hello".into(), Some(0))
        );
        assert_eq!(
            run(&["END"], &["abcE", "N", "Dxyz"]),
            ("abc".into(), Some(0))
        );
    }

    #[test]
    fn partial_match_is_held_then_released() {
        let stops = vec!["STOP".to_string()];
        let mut s = StopStrings::new(&stops);
        assert_eq!(s.push("abST").text, "ab");
        assert_eq!(s.push("x").text, "STx");
        assert_eq!(s.push("ST").text, "");
        assert_eq!(s.finish(), "ST");
    }

    #[test]
    fn earliest_match_wins() {
        assert_eq!(run(&["c", "ab"], &["xabc"]), ("x".into(), Some(1)));
    }

    #[test]
    fn no_stops_passes_through_and_empty_stops_are_ignored() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
        assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), None));
    }

    #[test]
    fn multibyte_text_is_held_on_char_boundaries() {
        assert_eq!(run(&["éx"], &["caf", "é", "!"]), ("café!".into(), None));
        assert_eq!(run(&["éx"], &["caf", "é", "x"]), ("caf".into(), Some(0)));
    }
}
