//! `bench serve --class ...`: a mixed workload of request classes sent together for
//! `--duration` seconds, to see how a server shares itself between them.
//!
//! A class is `name=N,(rate=R|concurrency=C),input=TOKENS,output=TOKENS` and optionally its
//! targets `ttft_ms=T,tpot_ms=T` (what the client counts as served in time), how the server
//! hears of them (`slo=body` sends `"slo": {"ttft_ms", "tpot_ms"}`, `slo=class:NAME` sends
//! `"slo_class": NAME`; by default nothing), a tenant `user=U`, a `priority=P` and an
//! `api_key=K`. `rate` is an open loop: Poisson arrivals at R requests per second, whatever
//! the server does (load a server cannot keep up with queues, as real traffic does);
//! `concurrency` a closed loop of C clients each sending its next request when the last ends
//! (a saturating tenant).
//!
//! Per class: requests sent, completed, refused (HTTP 429 or 503: a server declining up
//! front), failed; goodput, the share of sent requests completed within both targets (TTFT at
//! most `ttft_ms`, time per output token after the first at most `tpot_ms`); output tokens
//! per second over the run; TTFT, TPOT and end-to-end percentiles; and the gaps between
//! streamed chunks (their P50 and P99: a stream's jitter). Of the refusals: how soon they
//! came (the server's refusal latency) and the waits they asked for (`retry-after-ms`, else
//! `Retry-After`).
//!
//! `retry=check` tests those waits: a refused request is sent again at half its wait and, if
//! refused again, at its whole wait. Admitted at half, the wait was over twice too long
//! (`early`); refused at half and admitted at the whole, it was within a factor of 2 of when
//! the server would serve it (`within`); refused both times, too short (`short`). The
//! retries count apart from the class's goodput, which stays over first sends.

use super::prompts;
use super::request::{self, Outcome, Target};
use super::stats::Summary;
use anyhow::{anyhow, bail, Context, Result};
use ferrum_tokenizer::Tokenizer;
use ferrum_types::SplitMix64;
use serde::Serialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a class tells the server its targets.
#[derive(Debug, Clone, PartialEq)]
pub enum SloWire {
    None,
    /// `"slo": {"ttft_ms", "tpot_ms"}`.
    Body,
    /// `"slo_class": NAME`.
    Class(String),
}

/// How a class's requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Poisson, this many requests per second.
    Rate(f64),
    /// This many clients, back to back.
    Concurrency(usize),
}

/// One class of a mixed workload (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassSpec {
    pub name: String,
    pub arrivals: Arrivals,
    pub input: usize,
    pub output: usize,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub slo: SloWire,
    pub user: Option<String>,
    pub priority: Option<i64>,
    pub api_key: Option<String>,
    /// `retry=check` (see the module docs).
    pub retry_check: bool,
}

impl std::str::FromStr for ClassSpec {
    type Err = anyhow::Error;

    fn from_str(spec: &str) -> Result<ClassSpec> {
        let bad = |why: String| anyhow!("--class {spec:?}: {why}");
        let (mut name, mut arrivals, mut input, mut output) = (None, None, None, None);
        let mut c = ClassSpec {
            name: String::new(),
            arrivals: Arrivals::Concurrency(1),
            input: 0,
            output: 0,
            ttft_ms: None,
            tpot_ms: None,
            slo: SloWire::None,
            user: None,
            priority: None,
            api_key: None,
            retry_check: false,
        };
        for kv in spec.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(format!("{kv:?} is not key=value")))?;
            let num = |what: &str| -> Result<f64> {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| bad(format!("{what}={v}: expected a number above 0")))
            };
            let count = |what: &str| -> Result<usize> {
                v.parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad(format!("{what}={v}: expected a whole number, at least 1")))
            };
            match k {
                "name" if !v.is_empty() => name = Some(v.to_string()),
                "rate" => arrivals = Some(Arrivals::Rate(num(k)?)),
                "concurrency" => arrivals = Some(Arrivals::Concurrency(count(k)?)),
                "input" => input = Some(count(k)?),
                "output" => output = Some(count(k)?),
                "ttft_ms" => c.ttft_ms = Some(num(k)?),
                "tpot_ms" => c.tpot_ms = Some(num(k)?),
                "slo" if v == "body" => c.slo = SloWire::Body,
                "slo" if v.starts_with("class:") && v.len() > 6 => {
                    c.slo = SloWire::Class(v[6..].to_string())
                }
                "user" if !v.is_empty() => c.user = Some(v.to_string()),
                "priority" => {
                    c.priority = Some(
                        v.parse()
                            .map_err(|_| bad(format!("priority={v}: expected an integer")))?,
                    )
                }
                "api_key" if !v.is_empty() => c.api_key = Some(v.to_string()),
                "retry" if v == "check" => c.retry_check = true,
                _ => return Err(bad(format!("unknown or empty key {k:?}"))),
            }
        }
        c.name = name.ok_or_else(|| bad("needs name=".into()))?;
        c.arrivals = arrivals.ok_or_else(|| bad("needs rate= or concurrency=".into()))?;
        c.input = input.ok_or_else(|| bad("needs input=".into()))?;
        c.output = output.ok_or_else(|| bad("needs output=".into()))?;
        if c.slo == SloWire::Body && c.ttft_ms.is_none() && c.tpot_ms.is_none() {
            return Err(bad("slo=body needs ttft_ms= or tpot_ms=".into()));
        }
        Ok(c)
    }
}

/// Percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Millis {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

impl Millis {
    /// [`Summary::of`] the values, in milliseconds.
    fn of(seconds: Vec<f64>) -> Option<Millis> {
        let s = Summary::of(seconds)?;
        Some(Millis {
            p50: s.p50 * 1e3,
            p90: s.p90 * 1e3,
            p99: s.p99 * 1e3,
            mean: s.mean * 1e3,
        })
    }
}

/// One class's figures (see the module docs).
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    pub name: String,
    pub sent: usize,
    pub completed: usize,
    pub refused: usize,
    pub failed: usize,
    /// Completed with the first token after the TTFT target; with a time per output token
    /// over the TPOT target (a request may be both).
    pub late_ttft: usize,
    pub late_tpot: usize,
    /// Completed within both targets, over sent.
    pub goodput: f64,
    pub output_tokens: usize,
    pub output_tok_s: f64,
    pub ttft_ms: Option<Millis>,
    pub tpot_ms: Option<Millis>,
    pub e2e_ms: Option<Millis>,
    /// Gaps between streamed chunks with text.
    pub chunk_gap_ms: Option<Millis>,
    /// Refusals: from sending to the refusal, and the wait each asked for.
    pub refusal_ms: Option<Millis>,
    pub retry_after_ms: Option<Millis>,
    /// With `retry=check`: how the waits compared with when the server served the retries.
    pub retry_check: Option<RetryReport>,
    pub errors: Vec<String>,
}

/// `retry=check`'s counts (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RetryReport {
    /// Refusals that asked for a wait, and so were retried.
    pub checked: usize,
    pub early: usize,
    pub within: usize,
    pub short: usize,
    /// A retry failed otherwise than by a refusal.
    pub failed: usize,
    /// Admitted retries within both targets (counted from the retry's own send).
    pub in_time: usize,
}

/// What a refused request's retries showed of its wait.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Early(Outcome),
    Within(Outcome),
    Short,
    Failed,
}

/// One sent request: its outcome, its refusal's details, and the retries' verdict.
#[derive(Debug, Clone)]
struct Sent {
    outcome: std::result::Result<Outcome, String>,
    refusal: Option<request::Refusal>,
    verdict: Option<Verdict>,
}

/// Sends one request of a class and, with `retry=check`, retries a refusal that asked for a
/// wait at half of it and then at all of it.
async fn send_one(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    prompt_tokens: usize,
    check: bool,
) -> Sent {
    let f = match request::send_detailed(client, target, body, prompt_tokens).await {
        Ok(o) => {
            return Sent {
                outcome: Ok(o),
                refusal: None,
                verdict: None,
            }
        }
        Err(f) => f,
    };
    let refused_at = Instant::now();
    let wait = f.refusal.and_then(|r| r.retry_after_s);
    let verdict = match wait {
        Some(wait) if check => {
            let again = |frac: f64| async move {
                tokio::time::sleep_until(
                    (refused_at + Duration::from_secs_f64(wait * frac)).into(),
                )
                .await;
                request::send_detailed(client, target, body, prompt_tokens).await
            };
            Some(match again(0.5).await {
                Ok(o) => Verdict::Early(o),
                Err(e) if e.refusal.is_none() => Verdict::Failed,
                Err(_) => match again(1.0).await {
                    Ok(o) => Verdict::Within(o),
                    Err(e) if e.refusal.is_none() => Verdict::Failed,
                    Err(_) => Verdict::Short,
                },
            })
        }
        _ => None,
    };
    Sent {
        outcome: Err(f.message),
        refusal: f.refusal,
        verdict,
    }
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct MixReport {
    pub label: String,
    pub base_url: String,
    pub model: String,
    pub duration_s: f64,
    pub wall_s: f64,
    pub classes: Vec<ClassReport>,
}

/// What one request of a class came to.
type Done = (usize, Sent);

/// Runs the classes for `duration` and reports (arrivals stop then; requests in flight end).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    classes: &[ClassSpec],
    duration: Duration,
    timeout: Duration,
    tokenizer: Option<&Tokenizer>,
    seed: u64,
) -> Result<(f64, Vec<ClassReport>)> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (ci, c) in classes.iter().enumerate() {
        // Enough prompts for the run; each request takes the next.
        let expected = match c.arrivals {
            Arrivals::Rate(r) => (r * duration.as_secs_f64() * 2.0) as usize + 16,
            Arrivals::Concurrency(n) => n * 64,
        };
        let mut bodies = Vec::with_capacity(expected.min(4096));
        for i in 0..expected.min(4096) {
            let p = prompts::prompt(seed ^ (ci as u64 + 1) << 32, i, c.input, tokenizer)?;
            bodies.push((body(c, model, &p.text), p.num_tokens));
        }
        let bodies = Arc::new(bodies);
        let target = Arc::new(Target {
            url: format!("{base}/v1/completions"),
            api_key: c.api_key.clone(),
            timeout,
        });
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let take = {
            let (bodies, next) = (Arc::clone(&bodies), Arc::clone(&next));
            move || {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                bodies[i % bodies.len()].clone()
            }
        };
        match c.arrivals {
            Arrivals::Rate(rate) => {
                let mut rng = SplitMix64::new(seed.wrapping_add(ci as u64 * 7919));
                let mut at = 0.0;
                loop {
                    // Exponential gaps: -ln(U) / rate, U in (0, 1].
                    let u = ((rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                    at += -u.ln() / rate;
                    if at >= duration.as_secs_f64() {
                        break;
                    }
                    let (client, target, (body, n)) = (client.clone(), Arc::clone(&target), take());
                    let when = start + Duration::from_secs_f64(at);
                    let check = c.retry_check;
                    tasks.spawn(async move {
                        tokio::time::sleep_until(when.into()).await;
                        vec![(ci, send_one(&client, &target, &body, n, check).await)]
                    });
                }
            }
            Arrivals::Concurrency(n) => {
                for _ in 0..n {
                    let (client, target, take) =
                        (client.clone(), Arc::clone(&target), take.clone());
                    let check = c.retry_check;
                    tasks.spawn(async move {
                        let mut done = Vec::new();
                        while start.elapsed() < duration {
                            let (body, n) = take();
                            done.push((ci, send_one(&client, &target, &body, n, check).await));
                        }
                        done
                    });
                }
            }
        }
    }
    let mut done: Vec<Done> = Vec::new();
    while let Some(d) = tasks.join_next().await {
        done.extend(d.context("a client task failed")?);
    }
    let wall = start.elapsed().as_secs_f64();
    let reports = classes
        .iter()
        .enumerate()
        .map(|(ci, c)| {
            let mine = done.iter().filter(|(i, _)| *i == ci).map(|(_, o)| o);
            report(c, mine, wall)
        })
        .collect();
    Ok((wall, reports))
}

/// The body of one request of class `c`.
fn body(c: &ClassSpec, model: &str, prompt: &str) -> Value {
    let mut b = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": c.output,
        "min_tokens": c.output,
        "ignore_eos": true,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    match &c.slo {
        SloWire::None => {}
        SloWire::Body => {
            let mut slo = serde_json::Map::new();
            if let Some(t) = c.ttft_ms {
                slo.insert("ttft_ms".into(), json!(t.ceil() as u64));
            }
            if let Some(t) = c.tpot_ms {
                slo.insert("tpot_ms".into(), json!(t.ceil() as u64));
            }
            b["slo"] = Value::Object(slo);
        }
        SloWire::Class(name) => b["slo_class"] = json!(name),
    }
    if let Some(u) = &c.user {
        b["user"] = json!(u);
    }
    if let Some(p) = c.priority {
        b["priority"] = json!(p);
    }
    b
}

/// Whether a failure is the server declining up front (HTTP 429 or 503).
fn is_refusal(e: &str) -> bool {
    e.starts_with("HTTP 429") || e.starts_with("HTTP 503")
}

fn report<'a>(c: &ClassSpec, sent: impl Iterator<Item = &'a Sent>, wall: f64) -> ClassReport {
    let sent: Vec<&Sent> = sent.collect();
    let outcomes: Vec<_> = sent.iter().map(|s| &s.outcome).collect();
    let ok: Vec<&Outcome> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
    let errs: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    let refused = errs.iter().filter(|e| is_refusal(e)).count();
    let tpot = |o: &Outcome| {
        (o.output_tokens > 1).then(|| (o.e2e_s - o.ttft_s) / (o.output_tokens - 1) as f64)
    };
    let ttft_ok = |o: &Outcome| c.ttft_ms.is_none_or(|t| o.ttft_s * 1e3 <= t);
    let tpot_ok = |o: &Outcome| {
        c.tpot_ms
            .is_none_or(|t| tpot(o).is_none_or(|x| x * 1e3 <= t))
    };
    let good = ok.iter().filter(|o| ttft_ok(o) && tpot_ok(o)).count();
    let late_ttft = ok.iter().filter(|o| !ttft_ok(o)).count();
    let late_tpot = ok.iter().filter(|o| !tpot_ok(o)).count();
    let output_tokens = ok.iter().map(|o| o.output_tokens).sum();
    let refusals: Vec<request::Refusal> = sent.iter().filter_map(|s| s.refusal).collect();
    let retry_check = c.retry_check.then(|| {
        let mut r = RetryReport::default();
        for v in sent.iter().filter_map(|s| s.verdict.as_ref()) {
            r.checked += 1;
            let admitted = match v {
                Verdict::Early(o) => {
                    r.early += 1;
                    Some(o)
                }
                Verdict::Within(o) => {
                    r.within += 1;
                    Some(o)
                }
                Verdict::Short => {
                    r.short += 1;
                    None
                }
                Verdict::Failed => {
                    r.failed += 1;
                    None
                }
            };
            if admitted.is_some_and(|o| ttft_ok(o) && tpot_ok(o)) {
                r.in_time += 1;
            }
        }
        r
    });
    let mut errors: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    errors.dedup();
    errors.truncate(3);
    ClassReport {
        name: c.name.clone(),
        sent: outcomes.len(),
        completed: ok.len(),
        refused,
        failed: errs.len() - refused,
        late_ttft,
        late_tpot,
        goodput: if outcomes.is_empty() {
            0.0
        } else {
            good as f64 / outcomes.len() as f64
        },
        output_tokens,
        output_tok_s: output_tokens as f64 / wall.max(1e-9),
        ttft_ms: Millis::of(ok.iter().map(|o| o.ttft_s).collect()),
        tpot_ms: Millis::of(ok.iter().filter_map(|o| tpot(o)).collect()),
        e2e_ms: Millis::of(ok.iter().map(|o| o.e2e_s).collect()),
        chunk_gap_ms: Millis::of(ok.iter().flat_map(|o| o.itl_s.iter().copied()).collect()),
        refusal_ms: Millis::of(refusals.iter().map(|r| r.after_s).collect()),
        retry_after_ms: Millis::of(refusals.iter().filter_map(|r| r.retry_after_s).collect()),
        retry_check,
        errors,
    }
}

/// The classes' table.
pub fn table(r: &MixReport) -> String {
    let mut s = format!(
        "{} at {}: {:.0} s of arrivals, {:.1} s in all\n{:<14} {:>5} {:>5} {:>5} {:>5} {:>5} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        r.model, r.base_url, r.duration_s, r.wall_s, "class", "sent", "done", "refus", "fail",
        "lateT", "lateP", "goodput", "out tok/s", "ttft p50", "ttft p99", "tpot p50", "gap p50",
        "gap p99"
    );
    let ms = |m: &Option<Millis>, f: fn(&Millis) -> f64| {
        m.as_ref().map_or("-".into(), |m| format!("{:.0}", f(m)))
    };
    for c in &r.classes {
        s.push_str(&format!(
            "{:<14} {:>5} {:>5} {:>5} {:>5} {:>5} {:>5} {:>7.1}% {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            c.name,
            c.sent,
            c.completed,
            c.refused,
            c.failed,
            c.late_ttft,
            c.late_tpot,
            100.0 * c.goodput,
            c.output_tok_s,
            ms(&c.ttft_ms, |m| m.p50),
            ms(&c.ttft_ms, |m| m.p99),
            ms(&c.tpot_ms, |m| m.p50),
            ms(&c.chunk_gap_ms, |m| m.p50),
            ms(&c.chunk_gap_ms, |m| m.p99),
        ));
    }
    for c in r.classes.iter().filter(|c| c.refusal_ms.is_some()) {
        s.push_str(&format!(
            "{}: refused after {} ms p50, {} ms p99; waits asked {} ms p50, {} ms p99",
            c.name,
            ms(&c.refusal_ms, |m| m.p50),
            ms(&c.refusal_ms, |m| m.p99),
            ms(&c.retry_after_ms, |m| m.p50),
            ms(&c.retry_after_ms, |m| m.p99),
        ));
        if let Some(k) = &c.retry_check {
            s.push_str(&format!(
                "; of {} retried: {} within 2x, {} over 2x too long, {} too short, {} failed; \
                 {} in time",
                k.checked, k.within, k.early, k.short, k.failed, k.in_time
            ));
        }
        s.push('\n');
    }
    s
}

/// Checks a mixed run's flags.
pub fn validate(classes: &[ClassSpec], duration: f64) -> Result<Duration> {
    let mut names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        bail!("--class: every class needs its own name");
    }
    if !(duration.is_finite() && duration > 0.0) {
        bail!("--duration {duration}: expected seconds, more than 0");
    }
    Ok(Duration::from_secs_f64(duration))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_specs_are_read_and_checked() {
        let c: ClassSpec = "name=chat,rate=2.5,input=100,output=64,ttft_ms=1000,tpot_ms=100,slo=body,user=a,priority=-1"
            .parse()
            .unwrap();
        assert_eq!(c.arrivals, Arrivals::Rate(2.5));
        assert_eq!(
            (c.input, c.output, c.ttft_ms, c.tpot_ms),
            (100, 64, Some(1000.0), Some(100.0))
        );
        assert_eq!(
            (&c.slo, c.user.as_deref(), c.priority),
            (&SloWire::Body, Some("a"), Some(-1))
        );
        let b: ClassSpec = "name=batch,concurrency=4,input=10,output=5,slo=class:bulk"
            .parse()
            .unwrap();
        assert_eq!(
            (b.arrivals, b.slo),
            (Arrivals::Concurrency(4), SloWire::Class("bulk".into()))
        );
        let body = body(&c, "m", "hi");
        assert_eq!(body["slo"], json!({"ttft_ms": 1000, "tpot_ms": 100}));
        assert_eq!(
            (body["user"].as_str(), body["priority"].as_i64()),
            (Some("a"), Some(-1))
        );
        for bad in [
            "",
            "name=x",
            "name=x,rate=1,input=1",
            "name=x,rate=0,input=1,output=1",
            "name=x,rate=1,input=1,output=1,slo=body",
            "name=x,rate=1,input=1,output=1,colour=red",
            "name=x,concurrency=1.5,input=1,output=1",
            "name=x,rate=1,input=1,output=1,slo=class:",
        ] {
            assert!(bad.parse::<ClassSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn goodput_counts_requests_within_both_targets_over_those_sent() {
        let c: ClassSpec = "name=x,rate=1,input=1,output=3,ttft_ms=100,tpot_ms=10"
            .parse()
            .unwrap();
        let o = |ttft: f64, e2e: f64| {
            Ok(Outcome {
                ttft_s: ttft,
                itl_s: vec![0.005, 0.015],
                e2e_s: e2e,
                output_tokens: 3,
                prompt_tokens: 1,
                usage: true,
            })
        };
        let outcomes = [
            o(0.05, 0.06), // in time
            o(0.2, 0.21),  // late first token
            o(0.05, 0.1),  // 25 ms per token
            Err("HTTP 429 Too Many Requests: later".to_string()),
            Err("the stream broke".to_string()),
        ];
        let sent: Vec<Sent> = outcomes
            .into_iter()
            .map(|outcome| Sent {
                outcome,
                refusal: None,
                verdict: None,
            })
            .collect();
        let r = report(&c, sent.iter(), 2.0);
        assert_eq!((r.sent, r.completed, r.refused, r.failed), (5, 3, 1, 1));
        assert!(r.retry_check.is_none() && r.refusal_ms.is_none());
        assert!((r.goodput - 0.2).abs() < 1e-12);
        assert_eq!((r.late_ttft, r.late_tpot), (1, 1));
        assert_eq!(r.output_tokens, 9);
        let gap = r.chunk_gap_ms.unwrap();
        assert!((gap.p50 - 10.0).abs() < 1e-9 && gap.p99 > 14.0);
    }

    /// Refusals' latencies and waits are summarised; `retry=check`'s verdicts are counted, and
    /// an admitted retry within both targets is in time.
    #[test]
    fn refusals_and_their_retries_are_reported() {
        let c: ClassSpec = "name=x,rate=1,input=1,output=2,ttft_ms=100,retry=check"
            .parse()
            .unwrap();
        assert!(c.retry_check);
        assert!("name=x,rate=1,input=1,output=2,retry=yes"
            .parse::<ClassSpec>()
            .is_err());
        let o = |ttft: f64| Outcome {
            ttft_s: ttft,
            itl_s: vec![0.01],
            e2e_s: ttft + 0.01,
            output_tokens: 2,
            prompt_tokens: 1,
            usage: true,
        };
        let refused = |after_s: f64, wait: Option<f64>, verdict: Option<Verdict>| Sent {
            outcome: Err("HTTP 429 Too Many Requests: late".into()),
            refusal: Some(request::Refusal {
                after_s,
                retry_after_s: wait,
            }),
            verdict,
        };
        let sent = [
            Sent {
                outcome: Ok(o(0.05)),
                refusal: None,
                verdict: None,
            },
            refused(0.002, Some(0.5), Some(Verdict::Within(o(0.05)))),
            refused(0.004, Some(1.5), Some(Verdict::Early(o(0.5)))),
            refused(0.006, Some(0.2), Some(Verdict::Short)),
            refused(0.008, None, None),
        ];
        let r = report(&c, sent.iter(), 1.0);
        assert_eq!((r.sent, r.completed, r.refused), (5, 1, 4));
        let k = r.retry_check.clone().unwrap();
        assert_eq!(
            (k.checked, k.within, k.early, k.short, k.failed, k.in_time),
            (3, 1, 1, 1, 0, 1)
        );
        let lat = r.refusal_ms.clone().unwrap();
        assert!((lat.mean - 5.0).abs() < 1e-9, "{lat:?}");
        let waits = r.retry_after_ms.clone().unwrap();
        assert!((waits.p50 - 500.0).abs() < 1e-9, "{waits:?}");
        let t = table(&MixReport {
            label: String::new(),
            base_url: "b".into(),
            model: "m".into(),
            duration_s: 1.0,
            wall_s: 1.0,
            classes: vec![r],
        });
        assert!(t.contains("of 3 retried: 1 within 2x"), "{t}");
    }
}
