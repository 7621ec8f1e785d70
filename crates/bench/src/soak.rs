//! `ferrum bench soak`: a fault-injecting load test for an OpenAI-compatible server.
//!
//! Sends `--num-requests` requests, at most `--concurrency` at once, each drawn at random
//! (seeded, [`mix`]): chat or completions, `n` from 1 to 3, `max_tokens` from 1 to 64, zero to
//! three stop strings, streamed or not, `ignore_eos` or not, prompts of random length (exact
//! with `--tokenizer`), some sharing a prefix. A `--disconnect-fraction` of clients walk away
//! mid-request: a stream is dropped after a few chunks, a plain request after a short random
//! wait; they are counted, not checked. Every response that completes is checked to be
//! well-formed ([`check`]); a malformed one, any status but 200, or a connection error is a
//! failure, and the first ten reasons are kept.
//!
//! The load runs in `--rounds` equal rounds after `--warmup` requests. The server's `/metrics`
//! ([`gauges`]) is read once it is idle after the warm-up and after each round: memory (heap in
//! use and resident) and the KV gauges. The soak passes when no request failed, no status was
//! 5xx, every KV block is free again once idle, and memory does not leak: it did not rise in
//! every round after the first by more than `--max-growth-mib` in all ([`memory`]: growth that
//! stops is warm-up, whatever its size); otherwise it exits non-zero, saying why. The report
//! counts every request sent exactly once: completed + disconnected + failed = sent.

pub mod check;
pub mod gauges;
pub mod memory;
pub mod mix;

use crate::serve::sse::{SseEvent, SseParser};
use crate::serve::{base_url, load_tokenizer};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use gauges::Gauges;
use mix::Plan;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// The server's address (http://host:port).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// The `model` sent with each request (default: the first id of GET /v1/models).
    #[arg(long)]
    model: Option<String>,
    /// Requests in all (after the warm-up).
    #[arg(long, default_value_t = 1000)]
    num_requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Fraction of clients that disconnect mid-request.
    #[arg(long, default_value_t = 0.2)]
    disconnect_fraction: f64,
    /// Seed of the request mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Requests run first (checked, but kept out of the counts and rates) before the gauges
    /// are first read.
    #[arg(long, default_value_t = 256)]
    warmup: usize,
    /// Equal rounds the requests run in, memory read after each (at least 2: a leak is
    /// memory that keeps rising round after round; at most one per request).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// The most memory (the heap in use where the server exports it, else resident memory)
    /// may grow from the end of the first round to the end of the last when it rose in every
    /// one of them, in MiB.
    #[arg(long, alias = "max-rss-growth-mib", default_value_t = 16)]
    max_growth_mib: u64,
    /// Longest prompt, in tokens (exact with --tokenizer, else approximate); each prompt's
    /// length is drawn from 1 to this.
    #[arg(long, default_value_t = 64)]
    max_input_len: usize,
    /// A tokenizer.json, Hugging Face folder or .gguf file, for prompts of exact lengths.
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Seconds one request may take.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// Seconds to wait for the server to become idle (nothing running or waiting, every KV
    /// block free) after the warm-up and after the load.
    #[arg(long, default_value_t = 60.0)]
    idle_timeout: f64,
    /// Bearer token for servers started with an API key.
    #[arg(long)]
    api_key: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// What happened to one request.
#[derive(Debug)]
enum Fate {
    Completed { tokens: u64 },
    Disconnected,
    Failed(String),
}

#[derive(Debug, Default)]
struct Tally {
    completed: usize,
    disconnected: usize,
    failed: usize,
    failures: Vec<String>,
    statuses: BTreeMap<u16, usize>,
    output_tokens: u64,
}

impl Tally {
    /// Adds a later round's counts (the first ten failures are kept).
    fn absorb(&mut self, other: Tally) {
        self.completed += other.completed;
        self.disconnected += other.disconnected;
        self.failed += other.failed;
        let room = 10usize.saturating_sub(self.failures.len());
        self.failures.extend(other.failures.into_iter().take(room));
        for (s, n) in other.statuses {
            *self.statuses.entry(s).or_default() += n;
        }
        self.output_tokens += other.output_tokens;
    }
}

/// The requests of round `r` of `rounds` after `warmup`: `num_requests` split as evenly as
/// possible, the earlier rounds taking the remainder.
fn round_range(warmup: usize, num_requests: usize, rounds: usize, r: usize) -> Range<usize> {
    let at = |k: usize| warmup + k * num_requests / rounds;
    at(r)..at(r + 1)
}

async fn run_one(
    c: &reqwest::Client,
    base: &str,
    key: Option<&str>,
    p: &Plan,
    timeout: Duration,
) -> (Option<u16>, Fate) {
    let mut req = c
        .post(format!("{base}{}", p.endpoint.path()))
        .json(&p.body)
        .timeout(timeout);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if !p.stream {
        let work = async {
            let r = req.send().await.map_err(|e| causes(&e))?;
            let status = r.status().as_u16();
            let text = r.text().await.map_err(|e| causes(&e))?;
            Ok::<_, String>((status, text))
        };
        let done = match p.disconnect {
            Some(ms) => match tokio::time::timeout(Duration::from_millis(ms), work).await {
                Ok(r) => r,
                Err(_) => return (None, Fate::Disconnected),
            },
            None => work.await,
        };
        return match done {
            Err(e) => (None, Fate::Failed(format!("connection: {e}"))),
            Ok((200, text)) => match check::response(p.endpoint, p.n, &text) {
                Ok(tokens) => (Some(200), Fate::Completed { tokens }),
                Err(e) => (Some(200), Fate::Failed(format!("malformed response: {e}"))),
            },
            Ok((s, text)) => (Some(s), Fate::Failed(format!("HTTP {s}: {}", clip(&text)))),
        };
    }
    let mut r = match req.send().await {
        Ok(r) => r,
        Err(e) => return (None, Fate::Failed(format!("connection: {}", causes(&e)))),
    };
    let status = r.status().as_u16();
    if status != 200 {
        let text = r.text().await.unwrap_or_default();
        return (
            Some(status),
            Fate::Failed(format!("HTTP {status}: {}", clip(&text))),
        );
    }
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    let mut chunks = 0u64;
    loop {
        match r.chunk().await {
            Ok(Some(bytes)) => {
                parser.push(&bytes, &mut events);
                chunks += 1;
                if p.disconnect.is_some_and(|k| chunks >= k)
                    && events.last() != Some(&SseEvent::Done)
                {
                    // Dropping the response closes the connection mid-stream.
                    return (Some(status), Fate::Disconnected);
                }
            }
            Ok(None) => break,
            Err(e) => {
                return (
                    Some(status),
                    Fate::Failed(format!("stream broke: {}", causes(&e))),
                )
            }
        }
    }
    parser.finish(&mut events);
    match check::stream(p.endpoint, p.n, &events) {
        Ok(tokens) => (Some(status), Fate::Completed { tokens }),
        Err(e) => (Some(status), Fate::Failed(format!("malformed stream: {e}"))),
    }
}

/// An error and its causes, on one line (reqwest's own message leaves out why).
fn causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

fn clip(s: &str) -> String {
    crate::serve::request::clip(s, 200)
}

/// Runs `plans[range]`, at most `concurrency` at once.
async fn load(
    c: &reqwest::Client,
    base: &str,
    key: Option<&str>,
    plans: &Arc<Vec<Plan>>,
    range: Range<usize>,
    concurrency: usize,
    timeout: Duration,
) -> Tally {
    let next = Arc::new(AtomicUsize::new(range.start));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let workers: Vec<_> = (0..concurrency.min(range.len()))
        .map(|_| {
            let (c, base, key) = (c.clone(), base.to_string(), key.map(str::to_owned));
            let (plans, next, tally, end) = (plans.clone(), next.clone(), tally.clone(), range.end);
            tokio::task::spawn_local(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(p) = plans.get(i).filter(|_| i < end) else {
                        break;
                    };
                    let (status, fate) = run_one(&c, &base, key.as_deref(), p, timeout).await;
                    let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(s) = status {
                        *t.statuses.entry(s).or_default() += 1;
                    }
                    match fate {
                        Fate::Completed { tokens } => {
                            t.completed += 1;
                            t.output_tokens += tokens;
                        }
                        Fate::Disconnected => t.disconnected += 1,
                        Fate::Failed(why) => {
                            t.failed += 1;
                            if t.failures.len() < 10 {
                                t.failures.push(format!("request {i}: {why}"));
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let mut panicked = 0;
    for w in workers {
        panicked += usize::from(w.await.is_err());
    }
    let mut t = std::mem::take(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()));
    if panicked > 0 {
        // A client task that died lost its request: count it as failed so the sums hold.
        let lost = range
            .len()
            .saturating_sub(t.completed + t.disconnected + t.failed);
        t.failed += lost;
        t.failures.push(format!(
            "{panicked} client tasks panicked, {lost} requests lost"
        ));
    }
    t
}

async fn model_name(c: &reqwest::Client, base: &str, args: &SoakArgs) -> Result<String> {
    if let Some(m) = &args.model {
        return Ok(m.clone());
    }
    let mut req = c
        .get(format!("{base}/v1/models"))
        .timeout(Duration::from_secs(30));
    if let Some(k) = &args.api_key {
        req = req.bearer_auth(k);
    }
    let v: Value = req
        .send()
        .await
        .map_err(|e| anyhow!("cannot reach {base}: {e}"))?
        .json()
        .await
        .context("GET /v1/models")?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("GET {base}/v1/models lists no model; pass --model"))
}

pub fn soak(args: &SoakArgs) -> Result<()> {
    if args.concurrency == 0 || args.num_requests == 0 {
        bail!("--concurrency and --num-requests must be at least 1");
    }
    if args.rounds < 2 {
        bail!(
            "--rounds must be at least 2 (a leak is memory that keeps rising round after \
             round), got {}",
            args.rounds
        );
    }
    // Fewer requests than rounds: one request a round (and with one request, no leak check).
    let rounds = args.rounds.min(args.num_requests);
    if !(0.0..=1.0).contains(&args.disconnect_fraction) {
        bail!(
            "--disconnect-fraction must be between 0 and 1, got {}",
            args.disconnect_fraction
        );
    }
    for (flag, secs) in [
        ("--timeout", args.timeout),
        ("--idle-timeout", args.idle_timeout),
    ] {
        if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
            bail!("{flag} must be a positive number of seconds, got {secs}");
        }
    }
    if args.max_input_len == 0 {
        bail!("--max-input-len must be at least 1");
    }
    let base = base_url(&args.base_url)?;
    let tokenizer = args.tokenizer.as_deref().map(load_tokenizer).transpose()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the HTTP client")?;
    let local = tokio::task::LocalSet::new();
    let report = local.block_on(&rt, async {
        let c = reqwest::Client::builder()
            .pool_max_idle_per_host(args.concurrency)
            .build()
            .context("building the HTTP client")?;
        let model = model_name(&c, &base, args).await?;
        let total = args.warmup + args.num_requests;
        let plans = (0..total)
            .map(|i| {
                let (seed, frac) = (args.seed, args.disconnect_fraction);
                mix::plan(
                    seed,
                    i,
                    &model,
                    frac,
                    args.max_input_len,
                    tokenizer.as_deref(),
                )
            })
            .collect::<Result<Vec<_>>>()
            .context("making the prompts")?;
        let plans = Arc::new(plans);
        let (key, timeout) = (
            args.api_key.as_deref(),
            Duration::from_secs_f64(args.timeout),
        );
        let settle_time = Duration::from_secs_f64(args.idle_timeout);
        let run = |range| load(&c, &base, key, &plans, range, args.concurrency, timeout);
        let warm = run(0..args.warmup).await;
        let (first, _) = gauges::settle(&c, &base, settle_time).await?;
        let mut readings = vec![first];
        let (mut t, mut elapsed, mut busy_after) = (Tally::default(), 0.0, Vec::new());
        for r in 0..rounds {
            let start = Instant::now();
            t.absorb(run(round_range(args.warmup, args.num_requests, rounds, r)).await);
            elapsed += start.elapsed().as_secs_f64();
            let (g, idle) = gauges::settle(&c, &base, settle_time).await?;
            if !idle {
                busy_after.push(r + 1);
            }
            readings.push(g);
        }
        Ok::<_, anyhow::Error>(report(args, &warm, &t, elapsed, &readings, &busy_after))
    })?;
    if args.json {
        println!("{report}");
    } else {
        print_report(&report);
    }
    let problems: Vec<&str> = report["problems"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !problems.is_empty() {
        bail!("the soak failed: {}", problems.join("; "));
    }
    Ok(())
}

const MIB: f64 = (1u64 << 20) as f64;

fn mib(b: Option<f64>) -> Value {
    b.map_or(Value::Null, |b| json!((b / MIB * 10.0).round() / 10.0))
}

/// How much a counter rose between two readings, where both have it.
fn delta(before: Option<f64>, after: Option<f64>) -> Value {
    before.zip(after).map_or(Value::Null, |(b, a)| json!(a - b))
}

/// The JSON report, with `problems` (empty when the soak passed).
/// `readings`: the gauges after the warm-up, then after each round; `busy_after`: the rounds
/// after which the server did not become idle in time.
fn report(
    args: &SoakArgs,
    warm: &Tally,
    t: &Tally,
    elapsed: f64,
    readings: &[Gauges],
    busy_after: &[usize],
) -> Value {
    let (before, after) = (readings[0], readings[readings.len() - 1]);
    let server_errors: usize = t
        .statuses
        .iter()
        .chain(&warm.statuses)
        .filter(|(s, _)| **s >= 500)
        .map(|(_, n)| n)
        .sum();
    let mut problems = Vec::new();
    if t.failed > 0 || warm.failed > 0 {
        problems.push(format!("{} requests failed", t.failed + warm.failed));
    }
    if server_errors > 0 {
        problems.push(format!("{server_errors} responses were 5xx"));
    }
    let idle = busy_after.is_empty();
    if let Some(&r) = busy_after.first() {
        let g = readings[r];
        problems.push(format!(
            "{} s after round {r} of the load, {} of {} KV blocks are free ({} running, {} \
             waiting)",
            args.idle_timeout, g.blocks_free, g.blocks_total, g.running, g.waiting
        ));
    }
    let growth = before.rss_bytes.zip(after.rss_bytes).map(|(b, a)| a - b);
    let series = |f: fn(&Gauges) -> Option<f64>| -> Option<Vec<f64>> {
        readings.iter().map(|g| f(g).map(|b| b / MIB)).collect()
    };
    let (heap, rss) = (series(|g| g.heap_bytes), series(|g| g.rss_bytes));
    let watched = match (&heap, &rss) {
        (Some(h), _) => Some((memory::Watched::HeapInUse, h)),
        (None, Some(r)) => Some((memory::Watched::Resident, r)),
        (None, None) => None,
    };
    let verdict =
        watched.and_then(|(w, s)| Some((w, memory::judge(s, args.max_growth_mib as f64)?)));
    if let Some((w, v)) = verdict.as_ref().filter(|(_, v)| v.leak) {
        problems.push(format!(
            "{} rose in every round after the first, by {:.1} MiB in all (limit {} MiB): a leak",
            w.name(),
            v.growth_mib,
            args.max_growth_mib
        ));
    }
    let rounded = |s: &Option<Vec<f64>>| {
        s.as_ref().map_or(Value::Null, |s| {
            json!(s
                .iter()
                .map(|m| (m * 10.0).round() / 10.0)
                .collect::<Vec<_>>())
        })
    };
    let statuses: serde_json::Map<String, Value> = t
        .statuses
        .iter()
        .map(|(s, n)| (s.to_string(), json!(n)))
        .collect();
    let sent = t.completed + t.disconnected + t.failed;
    json!({
        "sent": sent,
        "concurrency": args.concurrency,
        "disconnect_fraction": args.disconnect_fraction,
        "seed": args.seed,
        "warmup_requests": args.warmup,
        "completed": t.completed,
        "disconnected": t.disconnected,
        "failed": t.failed,
        "warmup_failed": warm.failed,
        "failures": warm.failures.iter().chain(&t.failures).take(10).collect::<Vec<_>>(),
        "statuses": statuses,
        "elapsed_s": (elapsed * 100.0).round() / 100.0,
        "requests_per_s": (sent as f64 / elapsed.max(1e-9) * 100.0).round() / 100.0,
        "output_tokens": t.output_tokens,
        "rss_before_mib": mib(before.rss_bytes),
        "rss_after_mib": mib(after.rss_bytes),
        "rss_growth_mib": mib(growth),
        "rounds": readings.len() - 1,
        "heap_mib_by_round": rounded(&heap),
        "rss_mib_by_round": rounded(&rss),
        "memory_watched": verdict.as_ref().map(|(w, _)| w.name()),
        "memory_growth_mib": verdict.as_ref().map(|(_, v)| (v.growth_mib * 10.0).round() / 10.0),
        "memory_rose_every_round": verdict.as_ref().map(|(_, v)| v.rose_every_round),
        "max_growth_mib": args.max_growth_mib,
        "leak": verdict.as_ref().map(|(_, v)| v.leak),
        "kv_blocks_total_before": before.blocks_total,
        "kv_blocks_free_before": before.blocks_free,
        "kv_blocks_total_after": after.blocks_total,
        "kv_blocks_free_after": after.blocks_free,
        "idle_after": idle,
        "prefix_cache_hit_tokens": delta(before.prefix_cache_hits, after.prefix_cache_hits),
        "preemptions": delta(before.preemptions, after.preemptions),
        "problems": problems,
        "passed": problems.is_empty(),
    })
}

fn print_report(r: &Value) {
    println!(
        "soak: {} requests at concurrency {} in {} s ({} req/s): {} completed, {} disconnected \
         on purpose, {} failed; {} output tokens",
        r["sent"],
        r["concurrency"],
        r["elapsed_s"],
        r["requests_per_s"],
        r["completed"],
        r["disconnected"],
        r["failed"],
        r["output_tokens"]
    );
    println!("statuses: {}", r["statuses"]);
    if r["memory_watched"].is_null() {
        println!("memory: not exported by the server (not checked)");
    } else {
        println!(
            "memory after the warm-up and each of {} rounds: heap in use {} MiB, resident {} MiB; \
             {} grew {} MiB after the first round (a leak if it rose every round by more than \
             {} MiB)",
            r["rounds"],
            r["heap_mib_by_round"],
            r["rss_mib_by_round"],
            r["memory_watched"].as_str().unwrap_or_default(),
            r["memory_growth_mib"],
            r["max_growth_mib"]
        );
    }
    println!(
        "KV blocks free: {} of {} after the warm-up, {} of {} once idle",
        r["kv_blocks_free_before"],
        r["kv_blocks_total_before"],
        r["kv_blocks_free_after"],
        r["kv_blocks_total_after"]
    );
    println!(
        "prompt tokens found in the prefix cache: {}; preemptions: {}",
        r["prefix_cache_hit_tokens"], r["preemptions"]
    );
    if let Some(f) = r["failures"].as_array().filter(|f| !f.is_empty()) {
        println!("first failures:");
        for x in f {
            println!("  {}", x.as_str().unwrap_or_default());
        }
    }
    println!(
        "{}",
        if r["passed"] == true {
            "PASSED"
        } else {
            "FAILED"
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_cover_the_requests_once() {
        for (n, rounds) in [(200, 4), (10, 3), (3, 3), (1000, 7)] {
            let ranges: Vec<_> = (0..rounds).map(|r| round_range(64, n, rounds, r)).collect();
            assert_eq!(ranges[0].start, 64);
            assert_eq!(ranges[rounds - 1].end, 64 + n);
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
            assert!(ranges
                .iter()
                .all(|r| r.len() >= n / rounds && r.len() <= n / rounds + 1));
        }
    }

    #[test]
    fn tallies_add_up_and_keep_ten_failures() {
        let round = |failed: usize| Tally {
            completed: 2,
            disconnected: 1,
            failed,
            failures: (0..failed).map(|i| format!("f{i}")).collect(),
            statuses: BTreeMap::from([(200, 3)]),
            output_tokens: 5,
        };
        let mut t = round(6);
        t.absorb(round(7));
        assert_eq!((t.completed, t.disconnected, t.failed), (4, 2, 13));
        assert_eq!(t.failures.len(), 10);
        assert_eq!(t.statuses[&200], 6);
        assert_eq!(t.output_tokens, 10);
    }
}
