//! Per-level results of `ferrum bench serve`: percentiles of the per-request latencies and the
//! rates over the level's wall time, and their JSON form (which `--compare` reads back).
//!
//! Percentiles interpolate linearly between the closest ranks (numpy's default), so p50 of
//! `[1, 2, 3, 4]` is 2.5. A latency with no samples (every request failed) is `None`, `null`
//! in JSON.

use super::request::Outcome;
use serde_json::{json, Map, Value};

/// How many error messages a level keeps.
pub const MAX_ERRORS: usize = 5;

/// p50, p90, p99 and mean of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

/// The `q`-th percentile (0 to 100) of sorted values, linearly interpolated.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (q / 100.0).clamp(0.0, 1.0) * last as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

impl Summary {
    /// Summary of `values` (any order); `None` when empty.
    pub fn of(mut values: Vec<f64>) -> Option<Summary> {
        values.retain(|v| v.is_finite());
        values.sort_by(f64::total_cmp);
        Some(Summary {
            p50: percentile(&values, 50.0)?,
            p90: percentile(&values, 90.0)?,
            p99: percentile(&values, 99.0)?,
            mean: values.iter().sum::<f64>() / values.len() as f64,
        })
    }
}

/// The results of one concurrency level.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelReport {
    pub concurrency: usize,
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// Completed requests that returned fewer than `--output-len` tokens.
    pub short: usize,
    pub output_tok_s: f64,
    pub total_tok_s: f64,
    pub requests_per_s: f64,
    /// Time to first token.
    pub ttft: Option<Summary>,
    /// Gaps between successive chunks with text.
    pub itl: Option<Summary>,
    /// Time per output token after the first: (e2e - ttft) / (tokens - 1).
    pub tpot: Option<Summary>,
    /// End-to-end latency.
    pub e2e: Option<Summary>,
    /// The first few error messages.
    pub errors: Vec<String>,
}

const LATENCIES: [&str; 4] = ["ttft", "itl", "tpot", "e2e"];
const STATS: [&str; 4] = ["p50", "p90", "p99", "mean"];

impl LevelReport {
    /// Aggregates the outcomes of one level that took `duration_s` of wall time.
    pub fn new(
        concurrency: usize,
        duration_s: f64,
        output_len: usize,
        outcomes: &[Result<Outcome, String>],
    ) -> LevelReport {
        let ok: Vec<&Outcome> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
        let errors: Vec<String> = outcomes
            .iter()
            .filter_map(|o| o.as_ref().err().cloned())
            .take(MAX_ERRORS)
            .collect();
        let ms = |s: f64| s * 1e3;
        let output_tokens: usize = ok.iter().map(|o| o.output_tokens).sum();
        let prompt_tokens: usize = ok.iter().map(|o| o.prompt_tokens).sum();
        let per_s = |n: usize| {
            if duration_s > 0.0 {
                n as f64 / duration_s
            } else {
                0.0
            }
        };
        LevelReport {
            concurrency,
            completed: ok.len(),
            failed: outcomes.len() - ok.len(),
            duration_s,
            prompt_tokens,
            output_tokens,
            short: ok.iter().filter(|o| o.output_tokens < output_len).count(),
            output_tok_s: per_s(output_tokens),
            total_tok_s: per_s(output_tokens + prompt_tokens),
            requests_per_s: per_s(ok.len()),
            ttft: Summary::of(ok.iter().map(|o| ms(o.ttft_s)).collect()),
            itl: Summary::of(
                ok.iter()
                    .flat_map(|o| o.itl_s.iter().map(|&s| ms(s)))
                    .collect(),
            ),
            tpot: Summary::of(
                ok.iter()
                    .filter(|o| o.output_tokens > 1)
                    .map(|o| ms(o.e2e_s - o.ttft_s) / (o.output_tokens - 1) as f64)
                    .collect(),
            ),
            e2e: Summary::of(ok.iter().map(|o| ms(o.e2e_s)).collect()),
            errors,
        }
    }

    fn latencies(&self) -> [Option<Summary>; 4] {
        [self.ttft, self.itl, self.tpot, self.e2e]
    }

    /// The flat JSON object: counts, rates, then `{ttft,itl,tpot,e2e}_ms_{p50,p90,p99,mean}`.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let fields = [
            ("concurrency", json!(self.concurrency)),
            ("completed", json!(self.completed)),
            ("failed", json!(self.failed)),
            ("duration_s", json!(self.duration_s)),
            ("prompt_tokens", json!(self.prompt_tokens)),
            ("output_tokens", json!(self.output_tokens)),
            ("short_outputs", json!(self.short)),
            ("output_tok_s", json!(self.output_tok_s)),
            ("total_tok_s", json!(self.total_tok_s)),
            ("requests_per_s", json!(self.requests_per_s)),
        ];
        for (k, v) in fields {
            m.insert(k.to_string(), v);
        }
        for (name, s) in LATENCIES.iter().zip(self.latencies()) {
            let values = s.map(|s| [s.p50, s.p90, s.p99, s.mean]);
            for (i, stat) in STATS.iter().enumerate() {
                m.insert(format!("{name}_ms_{stat}"), json!(values.map(|v| v[i])));
            }
        }
        m.insert("errors".into(), json!(self.errors));
        Value::Object(m)
    }

    /// Reads back what [`LevelReport::to_json`] wrote.
    pub fn from_json(v: &Value) -> Result<LevelReport, String> {
        let num = |k: &str| {
            v.get(k)
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("a level has no number '{k}'"))
        };
        let count = |k: &str| num(k).map(|x| x as usize);
        let summary = |name: &str| {
            let get = |stat: &str| v.get(format!("{name}_ms_{stat}")).and_then(Value::as_f64);
            Some(Summary {
                p50: get("p50")?,
                p90: get("p90")?,
                p99: get("p99")?,
                mean: get("mean")?,
            })
        };
        Ok(LevelReport {
            concurrency: count("concurrency")?,
            completed: count("completed")?,
            failed: count("failed")?,
            duration_s: num("duration_s")?,
            prompt_tokens: count("prompt_tokens").unwrap_or(0),
            output_tokens: count("output_tokens").unwrap_or(0),
            short: count("short_outputs").unwrap_or(0),
            output_tok_s: num("output_tok_s")?,
            total_tok_s: num("total_tok_s")?,
            requests_per_s: num("requests_per_s")?,
            ttft: summary("ttft"),
            itl: summary("itl"),
            tpot: summary("tpot"),
            e2e: summary("e2e"),
            errors: v
                .get("errors")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|e| e.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), Some(2.5));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(4.0));
        assert!((percentile(&v, 90.0).unwrap_or(0.0) - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        let hundred: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(percentile(&hundred, 99.0), Some(100.0));
    }

    #[test]
    fn summary_sorts_and_averages() {
        let s = Summary::of(vec![4.0, 1.0, 3.0, 2.0, f64::NAN]);
        let s = s.expect("four finite values");
        assert_eq!((s.p50, s.mean), (2.5, 2.5));
        assert!(s.p50 <= s.p90 && s.p90 <= s.p99);
        assert_eq!(Summary::of(Vec::new()), None);
    }

    fn outcome(ttft: f64, e2e: f64, tokens: usize) -> Outcome {
        Outcome {
            ttft_s: ttft,
            itl_s: vec![(e2e - ttft) / (tokens - 1) as f64; tokens - 1],
            e2e_s: e2e,
            output_tokens: tokens,
            prompt_tokens: 10,
            usage: true,
        }
    }

    #[test]
    fn level_counts_rates_and_round_trip() {
        let outcomes = vec![
            Ok(outcome(0.1, 1.1, 11)),
            Err("HTTP 500: boom".to_string()),
            Ok(outcome(0.3, 1.3, 6)),
        ];
        let r = LevelReport::new(2, 2.0, 11, &outcomes);
        assert_eq!((r.completed, r.failed, r.short), (2, 1, 1));
        assert_eq!((r.output_tokens, r.prompt_tokens), (17, 20));
        assert_eq!(r.output_tok_s, 8.5);
        assert_eq!(r.total_tok_s, 18.5);
        assert_eq!(r.requests_per_s, 1.0);
        let ttft = r.ttft.expect("two completed");
        assert!((ttft.p50 - 200.0).abs() < 1e-9);
        let tpot = r.tpot.expect("two completed");
        assert!((tpot.mean - 150.0).abs() < 1e-9);
        assert_eq!(r.errors, vec!["HTTP 500: boom".to_string()]);
        let j = r.to_json();
        for k in [
            "output_tok_s",
            "requests_per_s",
            "ttft_ms_p50",
            "ttft_ms_p99",
            "itl_ms_p50",
        ] {
            assert!(j.get(k).is_some_and(Value::is_number), "{k}");
        }
        assert_eq!(LevelReport::from_json(&j), Ok(r));
    }

    #[test]
    fn a_level_where_everything_failed() {
        let r = LevelReport::new(4, 1.0, 8, &[Err("x".into()), Err("y".into())]);
        assert_eq!((r.completed, r.failed, r.ttft), (0, 2, None));
        let j = r.to_json();
        assert!(j["ttft_ms_p50"].is_null());
        assert_eq!(LevelReport::from_json(&j), Ok(r));
    }
}
