//! `ferrum bench soak`: a fault-injecting load test for an OpenAI-compatible server.
//!
//! Sends `--num-requests` requests, at most `--concurrency` at once, each drawn at random
//! (seeded): chat or completions, `n` from 1 to 3, `max_tokens` from 1 to 64, zero to three
//! stop strings, streamed or not, `ignore_eos` or not. A `--disconnect-fraction` of clients
//! walk away mid-request: a stream is dropped after a few chunks, a plain request after a short
//! random wait. Every response that completes is checked to be well-formed ([`check`]).
//!
//! Around the load it reads the server's `/metrics`: resident memory after a warm-up and again
//! once the server is idle, and the KV gauges. The soak passes when no request failed, no
//! status was 5xx, every KV block is free again once idle, and resident memory grew by at most
//! `--max-rss-growth-mib`; otherwise it exits non-zero, saying why.

pub mod check;

use crate::bench_serve::base_url;
use crate::bench_serve::sse::{SseEvent, SseParser};
use anyhow::{anyhow, bail, Context, Result};
use check::Endpoint;
use clap::Args;
use serde_json::{json, Value};
use std::collections::BTreeMap;
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
    /// Requests run first, not counted, before resident memory is read.
    #[arg(long, default_value_t = 64)]
    warmup: usize,
    /// The most resident memory may grow between the warm-up and the end, in MiB.
    #[arg(long, default_value_t = 64)]
    max_rss_growth_mib: u64,
    /// Seconds one request may take.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// Bearer token for servers started with an API key.
    #[arg(long)]
    api_key: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// splitmix64, for the request mix.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const WORDS: &[&str] = &[
    "the", "a", "river", "city", "light", "quiet", "ran", "over", "history", "of", "and",
    "machine", "why", "is", "blue", "tell", "me", "about", "seven", "bridges", "learning", "green",
    "under", "summer", "write", "poem", "list", "three", "facts", "on", "Paris",
];
const STOPS: &[&str] = &["\n", ".", " the", ",", "!"];

/// One request of the mix.
#[derive(Debug, Clone)]
struct Plan {
    endpoint: Endpoint,
    n: usize,
    stream: bool,
    body: Value,
    /// Walk away: after this many stream chunks, or after this many milliseconds.
    disconnect: Option<u64>,
}

fn plan(seed: u64, i: usize, model: &str, disconnect_fraction: f64) -> Plan {
    let mut r = Rng(seed ^ (i as u64).wrapping_mul(0xA076_1D64_78BD_642F));
    let words = 3 + r.below(40) as usize;
    let text: Vec<&str> = (0..words)
        .map(|_| WORDS[r.below(WORDS.len() as u64) as usize])
        .collect();
    let text = text.join(" ");
    let endpoint = if r.below(2) == 0 {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let n = 1 + r.below(3) as usize;
    let stream = r.below(2) == 0;
    let mut body = json!({
        "model": model,
        "max_tokens": 1 + r.below(64),
        "n": n,
        "stream": stream,
        "temperature": 0.8,
        "seed": i,
    });
    match endpoint {
        Endpoint::Chat => body["messages"] = json!([{"role": "user", "content": text}]),
        Endpoint::Completions => body["prompt"] = json!(text),
    }
    let stops = r.below(4) as usize;
    if stops > 0 {
        let list: Vec<&str> = (0..stops)
            .map(|_| STOPS[r.below(STOPS.len() as u64) as usize])
            .collect();
        body["stop"] = json!(list);
    }
    if r.below(2) == 0 {
        body["ignore_eos"] = json!(true);
    }
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    let disconnect = (r.unit() < disconnect_fraction).then(|| {
        if stream {
            1 + r.below(4)
        } else {
            5 + r.below(300)
        }
    });
    Plan {
        endpoint,
        n,
        stream,
        body,
        disconnect,
    }
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
            let r = req.send().await.map_err(|e| e.to_string())?;
            let status = r.status().as_u16();
            let text = r.text().await.map_err(|e| e.to_string())?;
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
        Err(e) => return (None, Fate::Failed(format!("connection: {e}"))),
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
            Err(e) => return (Some(status), Fate::Failed(format!("stream broke: {e}"))),
        }
    }
    parser.finish(&mut events);
    match check::stream(p.endpoint, p.n, &events) {
        Ok(tokens) => (Some(status), Fate::Completed { tokens }),
        Err(e) => (Some(status), Fate::Failed(format!("malformed stream: {e}"))),
    }
}

fn clip(s: &str) -> String {
    crate::bench_serve::request::clip(s, 200)
}

/// Runs `count` planned requests (`first..first + count`) at the concurrency.
async fn load(
    c: &reqwest::Client,
    base: &str,
    model: &str,
    args: &SoakArgs,
    first: usize,
    count: usize,
) -> Tally {
    let next = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let timeout = Duration::from_secs_f64(args.timeout);
    let workers: Vec<_> = (0..args.concurrency.min(count.max(1)))
        .map(|_| {
            let (c, base, model, next, tally) = (
                c.clone(),
                base.to_string(),
                model.to_string(),
                next.clone(),
                tally.clone(),
            );
            let (seed, frac, key) = (args.seed, args.disconnect_fraction, args.api_key.clone());
            tokio::task::spawn_local(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    let p = plan(seed, first + i, &model, frac);
                    let (status, fate) = run_one(&c, &base, key.as_deref(), &p, timeout).await;
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
                                t.failures.push(why);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
    let t = std::mem::take(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()));
    t
}

/// The gauges the soak watches, from `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
struct Gauges {
    running: f64,
    waiting: f64,
    blocks_total: f64,
    blocks_free: f64,
    rss_bytes: Option<f64>,
}

async fn gauges(c: &reqwest::Client, base: &str) -> Result<Gauges> {
    let text = c
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| anyhow!("GET {base}/metrics: {e}"))?
        .text()
        .await?;
    let find = |name: &str| -> Option<f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| {
                l.strip_prefix(name)
                    .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let need = |name: &str| find(name).ok_or_else(|| anyhow!("{base}/metrics has no {name}"));
    Ok(Gauges {
        running: need("ferrum_num_requests_running")?,
        waiting: need("ferrum_num_requests_waiting")?,
        blocks_total: need("ferrum_kv_blocks_total")?,
        blocks_free: need("ferrum_kv_blocks_free")?,
        rss_bytes: find("process_resident_memory_bytes"),
    })
}

/// Polls until nothing runs or waits and every KV block is free; the last gauges either way.
async fn settle(c: &reqwest::Client, base: &str, within: Duration) -> Result<(Gauges, bool)> {
    let deadline = Instant::now() + within;
    loop {
        let g = gauges(c, base).await?;
        let idle = g.running == 0.0 && g.waiting == 0.0 && g.blocks_free == g.blocks_total;
        if idle || Instant::now() > deadline {
            return Ok((g, idle));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    if !(0.0..=1.0).contains(&args.disconnect_fraction) {
        bail!(
            "--disconnect-fraction must be between 0 and 1, got {}",
            args.disconnect_fraction
        );
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    let base = base_url(&args.base_url)?;
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
        let warm = load(&c, &base, &model, args, 0, args.warmup).await;
        let settle_time = Duration::from_secs(60);
        let (before, _) = settle(&c, &base, settle_time).await?;
        let start = Instant::now();
        let t = load(&c, &base, &model, args, args.warmup, args.num_requests).await;
        let elapsed = start.elapsed().as_secs_f64();
        let (after, idle) = settle(&c, &base, settle_time).await?;
        Ok::<_, anyhow::Error>(report(args, &warm, &t, elapsed, before, after, idle))
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

fn mib(b: Option<f64>) -> Value {
    b.map_or(Value::Null, |b| {
        json!((b / (1u64 << 20) as f64 * 10.0).round() / 10.0)
    })
}

fn report(
    args: &SoakArgs,
    warm: &Tally,
    t: &Tally,
    elapsed: f64,
    before: Gauges,
    after: Gauges,
    idle: bool,
) -> Value {
    let server_errors: usize = t
        .statuses
        .iter()
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
    if !idle {
        problems.push(format!(
            "once idle, {} of {} KV blocks are free ({} running, {} waiting)",
            after.blocks_free, after.blocks_total, after.running, after.waiting
        ));
    }
    let growth = match (before.rss_bytes, after.rss_bytes) {
        (Some(b), Some(a)) => Some(a - b),
        _ => None,
    };
    if let Some(g) = growth {
        if g > (args.max_rss_growth_mib << 20) as f64 {
            problems.push(format!(
                "resident memory grew by {:.1} MiB (limit {} MiB)",
                g / (1u64 << 20) as f64,
                args.max_rss_growth_mib
            ));
        }
    }
    let statuses: serde_json::Map<String, Value> = t
        .statuses
        .iter()
        .map(|(s, n)| (s.to_string(), json!(n)))
        .collect();
    json!({
        "requests": args.num_requests,
        "concurrency": args.concurrency,
        "disconnect_fraction": args.disconnect_fraction,
        "seed": args.seed,
        "warmup_requests": args.warmup,
        "completed": t.completed,
        "disconnected": t.disconnected,
        "failed": t.failed,
        "failures": t.failures.iter().chain(&warm.failures).take(10).collect::<Vec<_>>(),
        "statuses": statuses,
        "elapsed_s": (elapsed * 100.0).round() / 100.0,
        "requests_per_s": (t.completed + t.disconnected + t.failed) as f64 / elapsed.max(1e-9),
        "output_tokens": t.output_tokens,
        "rss_before_mib": mib(before.rss_bytes),
        "rss_after_mib": mib(after.rss_bytes),
        "kv_blocks_total": after.blocks_total,
        "kv_blocks_free_before": before.blocks_free,
        "kv_blocks_free_after": after.blocks_free,
        "idle_after": idle,
        "problems": problems,
        "passed": problems.is_empty(),
    })
}

fn print_report(r: &Value) {
    println!(
        "soak: {} requests at concurrency {} in {} s: {} completed, {} disconnected on purpose, {} failed",
        r["requests"], r["concurrency"], r["elapsed_s"], r["completed"], r["disconnected"], r["failed"]
    );
    println!("statuses: {}", r["statuses"]);
    println!(
        "resident memory: {} MiB after the warm-up, {} MiB once idle; KV blocks free once idle: {} of {}",
        r["rss_before_mib"], r["rss_after_mib"], r["kv_blocks_free_after"], r["kv_blocks_total"]
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
