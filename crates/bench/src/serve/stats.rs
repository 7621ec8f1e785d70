//! Per-level results of `ferrum bench serve`: percentiles of the per-request latencies and the
//! rates over the level's wall time, and their JSON form (which `--compare` reads back).
//!
//! Percentiles interpolate linearly between the closest ranks (numpy's default), so p50 of
//! `[1, 2, 3, 4]` is 2.5. A latency with no samples (every request failed) is `None`, `null`
//! in JSON.
//!
//! The JSON form is [`LevelJson`], one flat object (`{ttft,itl,tpot,e2e}_ms_{p50,p90,p99,mean}`
//! beside the counts and rates). Reading it back, every key is required: a missing number is an
//! error naming it, never a 0; a latency's four numbers are `null` together when it had no
//! samples.

use super::request::Outcome;
use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "LevelJson", from = "LevelJson")]
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
}

/// A nullable number that must be present (`null` is not the same as missing).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Option::deserialize(d)
}

/// The JSON object of one level. Fields are in alphabetical order: the bytes are those the
/// report wrote when it went through `serde_json::Value`, whose maps sort their keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelJson {
    pub completed: usize,
    pub concurrency: usize,
    pub duration_s: f64,
    #[serde(deserialize_with = "present")]
    pub e2e_ms_mean: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub e2e_ms_p50: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub e2e_ms_p90: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub e2e_ms_p99: Option<f64>,
    pub errors: Vec<String>,
    pub failed: usize,
    #[serde(deserialize_with = "present")]
    pub itl_ms_mean: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub itl_ms_p50: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub itl_ms_p90: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub itl_ms_p99: Option<f64>,
    pub output_tok_s: f64,
    pub output_tokens: usize,
    pub prompt_tokens: usize,
    pub requests_per_s: f64,
    pub short_outputs: usize,
    pub total_tok_s: f64,
    #[serde(deserialize_with = "present")]
    pub tpot_ms_mean: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub tpot_ms_p50: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub tpot_ms_p90: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub tpot_ms_p99: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub ttft_ms_mean: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub ttft_ms_p50: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub ttft_ms_p90: Option<f64>,
    #[serde(deserialize_with = "present")]
    pub ttft_ms_p99: Option<f64>,
}

/// A summary's four numbers; `None` when any is `null`.
fn summary(
    p50: Option<f64>,
    p90: Option<f64>,
    p99: Option<f64>,
    mean: Option<f64>,
) -> Option<Summary> {
    Some(Summary {
        p50: p50?,
        p90: p90?,
        p99: p99?,
        mean: mean?,
    })
}

impl From<LevelReport> for LevelJson {
    fn from(r: LevelReport) -> Self {
        let part = |s: Option<Summary>, f: fn(&Summary) -> f64| s.as_ref().map(f);
        LevelJson {
            completed: r.completed,
            concurrency: r.concurrency,
            duration_s: r.duration_s,
            e2e_ms_mean: part(r.e2e, |s| s.mean),
            e2e_ms_p50: part(r.e2e, |s| s.p50),
            e2e_ms_p90: part(r.e2e, |s| s.p90),
            e2e_ms_p99: part(r.e2e, |s| s.p99),
            errors: r.errors,
            failed: r.failed,
            itl_ms_mean: part(r.itl, |s| s.mean),
            itl_ms_p50: part(r.itl, |s| s.p50),
            itl_ms_p90: part(r.itl, |s| s.p90),
            itl_ms_p99: part(r.itl, |s| s.p99),
            output_tok_s: r.output_tok_s,
            output_tokens: r.output_tokens,
            prompt_tokens: r.prompt_tokens,
            requests_per_s: r.requests_per_s,
            short_outputs: r.short,
            total_tok_s: r.total_tok_s,
            tpot_ms_mean: part(r.tpot, |s| s.mean),
            tpot_ms_p50: part(r.tpot, |s| s.p50),
            tpot_ms_p90: part(r.tpot, |s| s.p90),
            tpot_ms_p99: part(r.tpot, |s| s.p99),
            ttft_ms_mean: part(r.ttft, |s| s.mean),
            ttft_ms_p50: part(r.ttft, |s| s.p50),
            ttft_ms_p90: part(r.ttft, |s| s.p90),
            ttft_ms_p99: part(r.ttft, |s| s.p99),
        }
    }
}

impl From<LevelJson> for LevelReport {
    fn from(j: LevelJson) -> Self {
        LevelReport {
            concurrency: j.concurrency,
            completed: j.completed,
            failed: j.failed,
            duration_s: j.duration_s,
            prompt_tokens: j.prompt_tokens,
            output_tokens: j.output_tokens,
            short: j.short_outputs,
            output_tok_s: j.output_tok_s,
            total_tok_s: j.total_tok_s,
            requests_per_s: j.requests_per_s,
            ttft: summary(j.ttft_ms_p50, j.ttft_ms_p90, j.ttft_ms_p99, j.ttft_ms_mean),
            itl: summary(j.itl_ms_p50, j.itl_ms_p90, j.itl_ms_p99, j.itl_ms_mean),
            tpot: summary(j.tpot_ms_p50, j.tpot_ms_p90, j.tpot_ms_p99, j.tpot_ms_mean),
            e2e: summary(j.e2e_ms_p50, j.e2e_ms_p90, j.e2e_ms_p99, j.e2e_ms_mean),
            errors: j.errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn to_json(r: &LevelReport) -> Value {
        serde_json::to_value(r).unwrap()
    }

    fn from_json(v: &Value) -> Result<LevelReport, String> {
        serde_path_to_error::deserialize(v).map_err(|e| e.to_string())
    }

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
        let j = to_json(&r);
        for k in [
            "output_tok_s",
            "requests_per_s",
            "ttft_ms_p50",
            "ttft_ms_p99",
            "itl_ms_p50",
        ] {
            assert!(j.get(k).is_some_and(Value::is_number), "{k}");
        }
        assert_eq!(from_json(&j), Ok(r.clone()));
        // Every key is written in the order the report always had (sorted).
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, j.to_string());
        for missing in ["output_tokens", "ttft_ms_p50", "duration_s"] {
            let mut v = j.clone();
            v.as_object_mut().unwrap().remove(missing);
            let e = from_json(&v).unwrap_err();
            assert!(e.contains(missing), "{e}");
        }
    }

    #[test]
    fn a_level_where_everything_failed() {
        let r = LevelReport::new(4, 1.0, 8, &[Err("x".into()), Err("y".into())]);
        assert_eq!((r.completed, r.failed, r.ttft), (0, 2, None));
        let j = to_json(&r);
        assert!(j["ttft_ms_p50"].is_null());
        assert_eq!(from_json(&j), Ok(r));
    }
}
