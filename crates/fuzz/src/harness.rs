//! The fuzzing loop: run the seeds, then mutate corpus entries until the time budget is spent.
//!
//! Each input runs under `catch_unwind` with the allocation counters reset; a panic, a run
//! over the time limit or memory over the limit fails the test, after the input is saved
//! under `target/fuzz-failures/` so it can be replayed. An input joins the corpus when its
//! outcome (the shape of its error, see [`shape`]) is new.

use crate::alloc;
use crate::mutate::{Mutator, Rng};
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Inputs kept for mutation, at most.
const MAX_CORPUS: usize = 256;
/// Distinct outcomes remembered, at most.
const MAX_OUTCOMES: usize = 1 << 20;

/// What one input may cost.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall time for one input.
    pub time: Duration,
    /// Peak live heap bytes while one input runs: `base + per_input_byte * input length`.
    pub memory_base: usize,
    pub memory_per_input_byte: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            time: Duration::from_secs(5),
            memory_base: 64 << 20,
            memory_per_input_byte: 16,
        }
    }
}

/// One fuzz target.
#[derive(Debug)]
pub struct Target {
    pub name: &'static str,
    /// Starting inputs (run first, then mutated).
    pub seeds: Vec<Vec<u8>>,
    pub mutator: Mutator,
    pub limits: Limits,
}

/// What the target says about one input: `Ok(outcome)` (any outcome, an error included, as
/// long as it is a clean one) or `Err(violation)` (a property the input broke).
pub type Outcome = Result<String, String>;

/// What a run did.
#[derive(Debug, Clone)]
pub struct Report {
    pub name: &'static str,
    pub execs: u64,
    pub elapsed: Duration,
    pub distinct_outcomes: usize,
    pub corpus: usize,
    pub seed: u64,
    /// The most heap any one input used at its peak.
    pub max_peak_bytes: usize,
    /// Heap live at the end of the run (the corpus included): flat if nothing leaks.
    pub live_bytes_at_end: usize,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64();
        write!(
            f,
            "fuzz {}: {} execs in {:.1} s ({:.0}/s), {} distinct outcomes, corpus {}, max heap per input {:.1} MiB, heap at end {:.1} MiB, seed {:#x}",
            self.name,
            self.execs,
            secs,
            self.execs as f64 / secs.max(1e-9),
            self.distinct_outcomes,
            self.corpus,
            self.max_peak_bytes as f64 / (1 << 20) as f64,
            self.live_bytes_at_end as f64 / (1 << 20) as f64,
            self.seed
        )
    }
}

/// The time budget: `FERRUM_FUZZ_SECS` (default 3 s).
pub fn budget() -> Duration {
    let secs = std::env::var("FERRUM_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

/// The seed: `FERRUM_FUZZ_SEED`, else from the clock (printed in the report).
pub fn seed() -> u64 {
    if let Some(s) = std::env::var("FERRUM_FUZZ_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    {
        return s;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5EED)
}

/// An error message reduced to its shape: numbers become `#` and quoted parts `…`, so that
/// "tensor `a` needs 12 bytes" and "tensor `b` needs 40 bytes" are one outcome.
pub fn shape(msg: &str) -> String {
    let mut out = String::new();
    let mut quote: Option<char> = None;
    let mut last_digit = false;
    for c in msg.chars() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
                out.push('…');
                out.push(c);
            }
            continue;
        }
        match c {
            '`' | '\'' | '"' => {
                quote = Some(c);
                out.push(c);
                last_digit = false;
            }
            c if c.is_ascii_digit() => {
                if !last_digit {
                    out.push('#');
                }
                last_digit = true;
            }
            c => {
                out.push(c);
                last_digit = false;
            }
        }
        if out.len() > 120 {
            break;
        }
    }
    out
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

fn save(name: &str, seed: u64, input: &[u8]) -> PathBuf {
    let dir = std::env::var_os("FERRUM_FUZZ_FAILURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures")
        });
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{name}-{seed:x}-{}.bin", input.len()));
    let _ = std::fs::write(&path, input);
    path
}

/// Runs `target` until the budget is spent; panics (failing the test) on the first input that
/// panics or breaks a limit or a property, after saving it.
pub fn run(mut t: Target, mut f: impl FnMut(&[u8]) -> Outcome) -> Report {
    let seed = seed();
    let budget = budget();
    let mut rng = Rng::new(seed);
    let mut seen: HashSet<u64> = HashSet::new();
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    let seeds = std::mem::take(&mut t.seeds);
    let n_seeds = seeds.len();
    let mut report = Report {
        name: t.name,
        execs: 0,
        elapsed: Duration::ZERO,
        distinct_outcomes: 0,
        corpus: 0,
        seed,
        max_peak_bytes: 0,
        live_bytes_at_end: 0,
    };
    // Warm up once so lazily initialised statics (regex caches and the like) are not charged
    // to the first input.
    if let Some(s) = seeds.first() {
        let _ = catch_unwind(AssertUnwindSafe(|| f(s)));
    }
    assert!(
        alloc::installed(),
        "fuzz target {}: install ferrum_fuzz::alloc::Counting as the global allocator",
        t.name
    );
    let start = Instant::now();
    let mut input = Vec::new();
    let mut next_seed = 0;
    loop {
        let is_seed = next_seed < n_seeds;
        if is_seed {
            input.clear();
            input.extend_from_slice(&seeds[next_seed]);
            next_seed += 1;
        } else {
            if start.elapsed() >= budget || corpus.is_empty() {
                break;
            }
            let base = rng.pick(&corpus).clone();
            t.mutator.mutate(&mut rng, &base, &corpus, &mut input);
        }
        let live = alloc::reset();
        let t0 = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| f(&input)));
        let took = t0.elapsed();
        let used = alloc::usage(live);
        report.execs += 1;
        report.max_peak_bytes = report.max_peak_bytes.max(used.peak_above_start);
        let limit = t
            .limits
            .memory_base
            .saturating_add(t.limits.memory_per_input_byte.saturating_mul(input.len()));
        let violation = match outcome {
            Err(p) => Some(format!("panicked: {}", panic_text(p.as_ref()))),
            Ok(Err(v)) => Some(v),
            Ok(Ok(_)) if took > t.limits.time => Some(format!(
                "took {:.2} s, over the limit of {:.2} s",
                took.as_secs_f64(),
                t.limits.time.as_secs_f64()
            )),
            Ok(Ok(_)) if used.peak_above_start > limit => Some(format!(
                "used {} bytes of heap at its peak (largest allocation {}), over the limit of {limit} for a {}-byte input",
                used.peak_above_start,
                used.largest,
                input.len()
            )),
            Ok(Ok(outcome)) => {
                // Seeds always join; a mutant joins when its outcome is new. Outcomes are kept
                // as hashes, at most MAX_OUTCOMES of them, so a long run's memory stays flat.
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::hash::Hash::hash(&shape(&outcome), &mut h);
                let new = seen.len() < MAX_OUTCOMES && seen.insert(std::hash::Hasher::finish(&h));
                if new || is_seed {
                    if corpus.len() < MAX_CORPUS {
                        corpus.push(input.clone());
                    } else if n_seeds < MAX_CORPUS {
                        // Full: replace an entry that is not a seed.
                        let i = n_seeds + rng.below(MAX_CORPUS - n_seeds);
                        corpus[i] = input.clone();
                    }
                }
                None
            }
        };
        if let Some(v) = violation {
            let path = save(t.name, seed, &input);
            panic!(
                "fuzz {}: an input broke the target after {} execs: {v}\n  input saved to {} (seed {seed:#x})",
                t.name,
                report.execs,
                path.display()
            );
        }
    }
    report.elapsed = start.elapsed();
    report.distinct_outcomes = seen.len();
    report.corpus = corpus.len();
    report.live_bytes_at_end = alloc::reset();
    println!("{report}");
    eprintln!("{report}");
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_ignore_numbers_and_names() {
        assert_eq!(
            shape("tensor `blk.0.x` needs 12 bytes at 4096"),
            shape("tensor `zz` needs 7 bytes at 1")
        );
        assert_ne!(shape("bad magic"), shape("truncated"));
    }
}
