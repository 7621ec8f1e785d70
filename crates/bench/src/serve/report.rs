//! The report of one `ferrum bench serve` run: its JSON form (the input of `--compare` and of
//! `benchmarks/plot_serve.py`, which draws the chart), and the human table.
//!
//! The JSON form is [`Report`] through serde. Fields are in alphabetical order: the bytes are
//! those written when the report went through `serde_json::Value` (sorted keys). Reading a
//! report back, every number is required (an error names the missing one, e.g.
//! `levels[2]: missing field `ttft_ms_p50``); `label` defaults to the file's name and
//! `ignore_eos` to true.

use super::stats::{LevelReport, Summary};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One server measured at several concurrency levels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub base_url: String,
    #[serde(default = "yes")]
    pub ignore_eos: bool,
    pub input_len: usize,
    /// Empty when the file has none: [`Report::load`] names it after the file.
    #[serde(default)]
    pub label: String,
    pub levels: Vec<LevelReport>,
    pub model: String,
    pub num_prompts: usize,
    pub output_len: usize,
    pub seed: u64,
}

fn yes() -> bool {
    true
}

impl Report {
    /// The compact JSON text `--json` prints.
    pub fn to_json_string(&self) -> Result<String> {
        serde_json::to_string(self).context("writing the report as JSON")
    }

    /// Reads a report written with `--json`; the label defaults to the file's name.
    pub fn load(path: &Path) -> Result<Report> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut de = serde_json::Deserializer::from_str(text.trim());
        let mut r: Report = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            anyhow::anyhow!(
                "{}: not a JSON report of `bench serve --json`: {}: {}",
                path.display(),
                e.path(),
                e.inner()
            )
        })?;
        if r.label.is_empty() {
            r.label = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
        }
        Ok(r)
    }
}

fn ms(s: Option<Summary>, f: fn(&Summary) -> f64) -> String {
    s.map_or_else(|| "-".into(), |s| format!("{:.1}", f(&s)))
}

/// The table: one row per (server,) concurrency level; the server column only with several.
pub fn table(reports: &[Report]) -> String {
    let many = reports.len() > 1;
    let width = reports
        .iter()
        .map(|r| r.label.len())
        .max()
        .unwrap_or(0)
        .max(6);
    let mut out = String::new();
    if many {
        out.push_str(&format!("{:<width$} ", "server"));
    }
    out.push_str(&format!(
        "{:>5} {:>5} {:>5} {:>8} {:>10} {:>10} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9}\n",
        "conc",
        "done",
        "fail",
        "time s",
        "out tok/s",
        "tot tok/s",
        "req/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "TPOT p50",
        "E2E p50",
        "E2E p99"
    ));
    for r in reports {
        for l in &r.levels {
            if many {
                out.push_str(&format!("{:<width$} ", r.label));
            }
            out.push_str(&format!(
                "{:>5} {:>5} {:>5} {:>8.2} {:>10.1} {:>10.1} {:>7.2} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9}\n",
                l.concurrency,
                l.completed,
                l.failed,
                l.duration_s,
                l.output_tok_s,
                l.total_tok_s,
                l.requests_per_s,
                ms(l.ttft, |s| s.p50),
                ms(l.ttft, |s| s.p99),
                ms(l.itl, |s| s.p50),
                ms(l.itl, |s| s.p99),
                ms(l.tpot, |s| s.p50),
                ms(l.e2e, |s| s.p50),
                ms(l.e2e, |s| s.p99),
            ));
        }
    }
    out.push_str("(latencies in ms; TPOT: time per output token after the first)\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::request::Outcome;
    use serde_json::Value;

    fn to_json(r: &Report) -> Value {
        serde_json::to_value(r).unwrap()
    }

    fn report(label: &str, scale: f64) -> Report {
        let o = |t: f64| Outcome {
            ttft_s: 0.05 * t,
            itl_s: vec![0.01 * t; 7],
            e2e_s: 0.2 * t,
            output_tokens: 8,
            prompt_tokens: 16,
            usage: true,
        };
        let levels = [1usize, 4, 16]
            .iter()
            .map(|&c| {
                let outs: Vec<Result<Outcome, String>> = (0..8).map(|_| Ok(o(c as f64))).collect();
                LevelReport::new(c, scale * c as f64, 8, &outs)
            })
            .collect();
        Report {
            label: label.into(),
            base_url: "http://127.0.0.1:8000".into(),
            model: "smollm2".into(),
            input_len: 16,
            output_len: 8,
            num_prompts: 8,
            seed: 0,
            ignore_eos: true,
            levels,
        }
    }

    /// Equal up to float rounding (serde_json's parser is not always correctly rounded).
    fn close(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                let (x, y) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(0.0));
                (x - y).abs() <= 1e-12 * x.abs().max(1.0)
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| close(x, y))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
            }
            _ => a == b,
        }
    }

    #[test]
    fn json_round_trips_through_a_file() {
        let r = report("ferrum", 1.0);
        let path = std::env::temp_dir().join(format!("ferrum-report-{}.json", std::process::id()));
        let text = r.to_json_string().expect("json");
        // The bytes are those of the sorted-key form the report always wrote.
        assert_eq!(text, to_json(&r).to_string());
        std::fs::write(&path, &text).expect("write");
        let back = Report::load(&path).expect("load");
        assert!(close(&to_json(&back), &to_json(&r)), "{back:?}");
        assert_eq!(back.levels.len(), 3);
        // A missing number is an error naming it, not a 0.
        let mut v = to_json(&r);
        v["levels"][1]
            .as_object_mut()
            .expect("a level")
            .remove("output_tok_s");
        v.as_object_mut().expect("a report").remove("label");
        std::fs::write(&path, v.to_string()).expect("write");
        let e = Report::load(&path).unwrap_err().to_string();
        assert!(e.contains("levels[1]") && e.contains("output_tok_s"), "{e}");
        v["levels"][1]["output_tok_s"] = 1.0.into();
        v.as_object_mut().expect("a report").remove("seed");
        std::fs::write(&path, v.to_string()).expect("write");
        let e = Report::load(&path).unwrap_err().to_string();
        assert!(e.contains("seed"), "{e}");
        v["seed"] = 0.into();
        std::fs::write(&path, v.to_string()).expect("write");
        let back = Report::load(&path).expect("load");
        assert_eq!(back.label, path.file_stem().unwrap().to_string_lossy());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn table_of_several_reports() {
        let reports = [report("ferrum", 1.0), report("vllm & co", 2.0)];
        let t = table(&reports);
        assert_eq!(t.lines().count(), 1 + 6 + 1);
        assert!(t.contains("vllm & co") && t.contains("out tok/s"));
    }
}
