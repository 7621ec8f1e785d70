//! `ferrum bench serve`: an online load generator for any OpenAI-compatible server (Ferrum,
//! vLLM, llama.cpp's servers), so that all of them are measured by the same client.
//!
//! For each `--concurrency` level in order, `--num-prompts` streamed `POST /v1/completions`
//! requests run with at most C in flight: C client tasks pull from a shared queue on a
//! single-threaded runtime (the client stays light next to the server it measures). Every
//! request asks for exactly `--output-len` greedy tokens (`max_tokens`, `temperature: 0`, and
//! `ignore_eos` plus vLLM's `min_tokens` unless `--no-ignore-eos`) and for a final usage chunk.
//! Servers that do not know a field ignore it (llama-cpp-python's pydantic models do too, and
//! it honours `min_tokens`). Per level: wall time, completed and failed requests, token and
//! request rates, and TTFT, inter-token, per-output-token and end-to-end latency percentiles.
//! `--compare` prints the table of several saved `--json` reports; `benchmarks/plot_serve.py`
//! draws them on one chart. With `--class` (repeated) the levels give way to a mixed workload
//! of request classes for `--duration` seconds ([`mix`]): goodput against each class's targets,
//! per-class percentiles and the gaps between streamed chunks.

pub mod mix;
pub(crate) mod prompts;
mod report;
pub(crate) mod request;
pub(crate) mod sse;
mod stats;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use ferrum_tokenizer::{load_special_tokens, TextAssets, Tokenizer};
use report::Report;
use request::{describe, Outcome, Target};
use serde_json::{json, Value};
use stats::LevelReport;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct ServeBenchArgs {
    /// The server's address (http://host:port; a trailing /v1 is fine).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// The `model` sent with each request (default: the first id of GET /v1/models).
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// Concurrency levels, comma-separated, run in this order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,4,16",
        value_name = "C,C,..."
    )]
    concurrency: Vec<usize>,
    /// Requests per concurrency level (distinct prompts, none shared between levels).
    #[arg(long, default_value_t = 64)]
    num_prompts: usize,
    /// Prompt length in tokens (exact with --tokenizer, else approximate).
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// A tokenizer.json, Hugging Face folder or .gguf file: makes each prompt exactly
    /// --input-len tokens (not counting the BOS a server may add).
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Seed of the prompt words.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Seconds a request may take from sending to the end of its stream.
    #[arg(long, default_value_t = 600.0, value_name = "SECS")]
    timeout: f64,
    /// Leave out `ignore_eos` and `min_tokens` (requests may then end early at EOS).
    #[arg(long)]
    no_ignore_eos: bool,
    /// Name of this server in the JSON report and charts (default: the model name).
    #[arg(long, value_name = "NAME")]
    label: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// A request class of a mixed workload, run instead of the concurrency levels
    /// (repeatable): name=N,(rate=R|concurrency=C),input=TOKENS,output=TOKENS and optionally
    /// ttft_ms=T,tpot_ms=T (the targets goodput counts), slo=body|class:NAME (how the server
    /// hears of them), user=TENANT, priority=P, api_key=K, retry=check (a refusal is sent
    /// again at half its Retry-After, then at all of it, to test the wait).
    #[arg(long = "class", value_name = "SPEC")]
    classes: Vec<String>,
    /// Seconds a mixed workload (--class) sends requests for.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    duration: f64,
    /// Instead of running, print the table of these saved `--json` reports (each labelled
    /// with its `label`). `benchmarks/plot_serve.py` draws them on one chart.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "A.json,B.json",
        conflicts_with = "json"
    )]
    compare: Vec<PathBuf>,
}

pub fn bench_serve(args: &ServeBenchArgs) -> Result<()> {
    if !args.compare.is_empty() {
        return compare(args);
    }
    let timeout = validate(args)?;
    let base = base_url(&args.base_url)?;
    let classes = args
        .classes
        .iter()
        .map(|c| c.parse::<mix::ClassSpec>())
        .collect::<Result<Vec<_>>>()?;
    let duration = mix::validate(&classes, args.duration)?;
    let tokenizer = args.tokenizer.as_deref().map(load_tokenizer).transpose()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the HTTP client")?;
    if !classes.is_empty() {
        return rt.block_on(run_mix(
            args,
            &base,
            &classes,
            duration,
            timeout,
            tokenizer.as_deref(),
        ));
    }
    let report = rt.block_on(run(args, &base, timeout, tokenizer.as_deref()))?;
    if args.json {
        println!("{}", report.to_json_string()?);
    } else {
        println!(
            "{} at {}: {} requests per level, input {} / output {} tokens",
            report.model, report.base_url, report.num_prompts, report.input_len, report.output_len
        );
        print!("{}", report::table(std::slice::from_ref(&report)));
    }
    all_failed(
        report.levels.iter().all(|l| l.completed == 0),
        report.levels.iter().flat_map(|l| &l.errors).next(),
    )
}

/// An error when no request completed, with the first error seen.
fn all_failed(none_completed: bool, first: Option<&String>) -> Result<()> {
    if none_completed {
        bail!(
            "every request failed; the first error: {}",
            first.map_or("none recorded", String::as_str)
        );
    }
    Ok(())
}

/// Checks the flags; returns the request timeout.
fn validate(args: &ServeBenchArgs) -> Result<Duration> {
    if args.concurrency.is_empty() {
        bail!("--concurrency: give at least one level, e.g. 1,4,16");
    }
    if args.concurrency.contains(&0) {
        bail!("--concurrency: every level must be at least 1");
    }
    if args.num_prompts == 0 || args.input_len == 0 || args.output_len == 0 {
        bail!("--num-prompts, --input-len and --output-len must be at least 1");
    }
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!("--api-key must not be empty");
    }
    if args.label.as_deref().is_some_and(|l| l.trim().is_empty()) {
        bail!("--label must not be empty");
    }
    if args.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
        bail!("--model must not be empty");
    }
    if args.timeout.is_nan() || args.timeout <= 0.0 {
        bail!("--timeout {}: expected seconds, more than 0", args.timeout);
    }
    Duration::try_from_secs_f64(args.timeout)
        .map_err(|_| anyhow!("--timeout {}: too large", args.timeout))
}

/// `http://host:port` without a trailing `/` or `/v1`.
pub(crate) fn base_url(s: &str) -> Result<String> {
    let url = reqwest::Url::parse(s.trim()).map_err(|e| {
        anyhow!("--base-url {s:?}: not a URL ({e}); expected one like http://127.0.0.1:8000")
    })?;
    match url.scheme() {
        "http" => {}
        "https" => {
            bail!("--base-url {s}: https is not supported (the client has no TLS); use http://")
        }
        _ if !s.contains("://") => {
            bail!("--base-url {s}: expected an http:// URL (did you mean http://{s}?)")
        }
        other => bail!("--base-url {s}: expected an http:// URL, not {other}://"),
    }
    if url.host_str().is_none_or(str::is_empty) {
        bail!("--base-url {s}: no host");
    }
    if url.query().is_some() || url.fragment().is_some() {
        bail!("--base-url {s}: expected no query or fragment");
    }
    let trimmed = url.as_str().trim_end_matches('/');
    Ok(trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string())
}

/// A tokenizer from a tokenizer.json, a Hugging Face folder or a .gguf file.
pub(crate) fn load_tokenizer(path: &Path) -> Result<Arc<Tokenizer>> {
    let what = || format!("loading the tokenizer {}", path.display());
    if !path.exists() {
        bail!("--tokenizer {}: no such file or folder", path.display());
    }
    if path.is_dir() {
        return Ok(TextAssets::from_folder(path).with_context(what)?.tokenizer);
    }
    if path.extension().is_some_and(|e| e == "json") {
        let dir = path.parent().unwrap_or(Path::new("."));
        let special = load_special_tokens(dir).with_context(what)?;
        return Ok(Arc::new(
            Tokenizer::from_json_file(path, special).with_context(what)?,
        ));
    }
    Ok(ferrum_models::load_text_assets(path)
        .with_context(what)?
        .tokenizer)
}

/// The model to ask for: `--model`, else the first id the server lists. Fails early, with a
/// clear message, when the server cannot be reached.
async fn resolve_model(
    client: &reqwest::Client,
    base: &str,
    args: &ServeBenchArgs,
    timeout: Duration,
) -> Result<String> {
    let url = format!("{base}/v1/models");
    let timeout = timeout.min(Duration::from_secs(30));
    let mut req = client.get(&url).timeout(timeout);
    if let Some(key) = &args.api_key {
        req = req.bearer_auth(key);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| anyhow!("cannot connect to {base}: {}", describe(&e, timeout)))?;
    let status = resp.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        bail!("{url}: HTTP 401: the server wants an API key (--api-key) or rejected this one");
    }
    if let Some(m) = &args.model {
        return Ok(m.clone());
    }
    let text = resp
        .text()
        .await
        .map_err(|e| anyhow!("GET {url}: {}", describe(&e, timeout)))?;
    if !status.is_success() {
        bail!(
            "GET {url}: HTTP {status}: {}; pass --model NAME",
            request::clip(&text, 200)
        );
    }
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| anyhow!("GET {url}: not JSON ({e}); pass --model NAME"))?;
    v.get("data")
        .and_then(Value::as_array)
        .and_then(|d| d.first())
        .and_then(|m| m.get("id"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("GET {url} lists no model id; pass --model NAME"))
}

/// The body of one request, and the prompt's length as the client counts it.
fn request_body(args: &ServeBenchArgs, model: &str, prompt: &str) -> Value {
    let mut body = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": args.output_len,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !args.no_ignore_eos {
        body["ignore_eos"] = json!(true);
        body["min_tokens"] = json!(args.output_len);
    }
    body
}

async fn run(
    args: &ServeBenchArgs,
    base: &str,
    timeout: Duration,
    tokenizer: Option<&Tokenizer>,
) -> Result<Report> {
    let client = http_client(timeout)?;
    let model = resolve_model(&client, base, args, timeout).await?;
    let target = Arc::new(Target {
        url: format!("{base}/v1/completions"),
        api_key: args.api_key.clone(),
        timeout,
    });
    let mut levels = Vec::with_capacity(args.concurrency.len());
    for (li, &concurrency) in args.concurrency.iter().enumerate() {
        let mut requests = Vec::with_capacity(args.num_prompts);
        for r in 0..args.num_prompts {
            let p = prompts::prompt(
                args.seed,
                li * args.num_prompts + r,
                args.input_len,
                tokenizer,
            )?;
            requests.push((request_body(args, &model, &p.text), p.num_tokens));
        }
        let (secs, outcomes) = run_level(&client, &target, requests, concurrency).await?;
        let level = LevelReport::new(concurrency, secs, args.output_len, &outcomes);
        progress(&level, &outcomes, args.output_len);
        levels.push(level);
    }
    Ok(Report {
        label: args.label.clone().unwrap_or_else(|| model.clone()),
        base_url: base.to_string(),
        model,
        input_len: args.input_len,
        output_len: args.output_len,
        num_prompts: args.num_prompts,
        seed: args.seed,
        ignore_eos: !args.no_ignore_eos,
        levels,
    })
}

/// The client of every request. A fresh connection per request: llama-server closes idle
/// keep-alive connections, and a request sent on one it has just closed fails with
/// "connection closed before message completed" (14 of 32 requests at concurrency 1 in one
/// run). Connecting over loopback costs well under a millisecond, the same for every server.
fn http_client(timeout: Duration) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .pool_max_idle_per_host(0)
        .build()
        .context("building the HTTP client")
}

/// `--class`: the mixed workload, printed as a table or one JSON object.
async fn run_mix(
    args: &ServeBenchArgs,
    base: &str,
    classes: &[mix::ClassSpec],
    duration: Duration,
    timeout: Duration,
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    let client = http_client(timeout)?;
    let model = resolve_model(&client, base, args, timeout).await?;
    let (wall_s, reports) = mix::run(
        &client, base, &model, classes, duration, timeout, tokenizer, args.seed,
    )
    .await?;
    let report = mix::MixReport {
        label: args.label.clone().unwrap_or_else(|| model.clone()),
        base_url: base.to_string(),
        model,
        duration_s: duration.as_secs_f64(),
        wall_s,
        classes: reports,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", mix::table(&report));
    }
    all_failed(
        report.classes.iter().all(|c| c.completed == 0),
        report.classes.iter().flat_map(|c| &c.errors).next(),
    )
}

/// Runs every request with at most `concurrency` in flight; the wall time and the outcomes.
async fn run_level(
    client: &reqwest::Client,
    target: &Arc<Target>,
    requests: Vec<(Value, usize)>,
    concurrency: usize,
) -> Result<(f64, Vec<Result<Outcome, String>>)> {
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.min(requests.len()) {
        let (client, target) = (client.clone(), Arc::clone(target));
        let (requests, next) = (Arc::clone(&requests), Arc::clone(&next));
        tasks.spawn(async move {
            let mut done = Vec::new();
            while let Some((body, prompt_tokens)) =
                requests.get(next.fetch_add(1, Ordering::Relaxed))
            {
                done.push(request::send(&client, &target, body, *prompt_tokens).await);
            }
            done
        });
    }
    let mut outcomes = Vec::with_capacity(requests.len());
    while let Some(done) = tasks.join_next().await {
        outcomes.extend(done.context("a client task failed")?);
    }
    Ok((start.elapsed().as_secs_f64(), outcomes))
}

/// One line per level on stderr, with the first errors and a warning about short outputs.
fn progress(level: &LevelReport, outcomes: &[Result<Outcome, String>], output_len: usize) {
    eprintln!(
        "concurrency {}: {} completed, {} failed in {:.2} s, {:.1} output tok/s",
        level.concurrency, level.completed, level.failed, level.duration_s, level.output_tok_s
    );
    for e in level.errors.iter().take(3) {
        eprintln!("  error: {e}");
    }
    if level.short > 0 {
        eprintln!(
            "  warning: {} requests returned fewer than {output_len} tokens (does the server \
             honour ignore_eos or min_tokens?)",
            level.short
        );
    }
    let chunk_counted = outcomes.iter().flatten().filter(|o| !o.usage).count();
    if chunk_counted > 0 {
        eprintln!(
            "  note: {chunk_counted} streams had no usage chunk; their tokens were counted as text chunks"
        );
    }
}

/// `--compare`: the saved reports' table.
fn compare(args: &ServeBenchArgs) -> Result<()> {
    let reports = args
        .compare
        .iter()
        .map(|p| Report::load(p))
        .collect::<Result<Vec<_>>>()?;
    print!("{}", report::table(&reports));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let ok = |s: &str| base_url(s).ok();
        assert_eq!(
            ok("http://127.0.0.1:8000").as_deref(),
            Some("http://127.0.0.1:8000")
        );
        assert_eq!(ok("http://h:1/v1/").as_deref(), Some("http://h:1"));
        assert_eq!(ok(" http://h/api ").as_deref(), Some("http://h/api"));
        for bad in [
            "127.0.0.1:8000",
            "https://h",
            "ftp://h",
            "http://",
            "http://h/?q=1",
            "",
        ] {
            assert!(base_url(bad).is_err(), "{bad}");
        }
    }
}
