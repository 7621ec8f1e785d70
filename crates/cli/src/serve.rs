//! `ferrum serve`: the OpenAI-compatible HTTP server over the batching engine.

use crate::common::{load_parts, EngineArgs, ModelArgs};
use crate::parallel::Launch;
use anyhow::{bail, Context, Result};
use clap::Args;
use ferrum_server::ServerConfig;
use ferrum_tokenizer::TextAssets;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require the key (`Authorization: Bearer KEY` or `x-api-key: KEY`) on every route but
    /// /health, /metrics and the chat page.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// The model name clients pass as `model` (default: the --model argument).
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
    /// Requests queued beyond the running ones before new ones get 503 + Retry-After.
    #[arg(long, default_value_t = 1024)]
    max_waiting_requests: usize,
    /// Largest request body in bytes (larger ones get 413).
    #[arg(long, default_value_t = 8 << 20)]
    max_request_bytes: usize,
    /// How the model writes tool calls: hermes (Qwen2.5/3), llama3 (Llama 3.1/3.2) or
    /// mistral (default: read off the chat template).
    #[arg(long, value_name = "FORMAT", value_parser = ["hermes", "llama3", "mistral"])]
    tool_call_parser: Option<String>,
    /// Do not serve the chat page at `/`.
    #[arg(long)]
    no_web_ui: bool,
    /// Origins whose browser pages may call the API (CORS), such as
    /// http://localhost:3000; comma-separated or repeated; `*` allows any. Default: none.
    #[arg(long, value_name = "ORIGINS")]
    allowed_origins: Vec<String>,
    /// A service-level class requests name with `"slo_class": NAME`: `NAME:TTFT_MS[:TPOT_MS]`,
    /// its time-to-first-token target (a request the engine predicts will miss it is refused
    /// with 429 and `Retry-After`; `-` for none) and time-per-output-token target (prefill
    /// chunks are kept short enough for it) in milliseconds, and `:best-effort` to serve
    /// requests predicted to miss the first instead of refusing them. Repeatable.
    #[arg(
        long = "slo-class",
        value_name = "NAME:TTFT_MS[:TPOT_MS][:best-effort]"
    )]
    slo_class: Vec<String>,
    /// A further API key, and what it stands for: `class=NAME` a --slo-class for its requests
    /// that name none, `tenant=NAME` its tenant under --scheduling fair (the key fixes it: a
    /// request's `user` cannot claim another). With any of these, every route but /health,
    /// /metrics and the chat page needs a key (this one or --api-key). Repeatable.
    #[arg(long = "api-key-role", value_name = "KEY[:class=NAME][:tenant=NAME]")]
    api_key_role: Vec<String>,
    /// Seconds in-flight requests may run after SIGINT/SIGTERM before they are aborted.
    #[arg(long, default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Skip the step cost model's calibration at start (a few synthetic requests, about as
    /// long as prefilling 700 tokens twice); the model then learns from the first requests'
    /// steps, and first-token targets are not judged until it has seen enough of them.
    #[arg(long)]
    no_calibration: bool,
    #[command(flatten, next_help_heading = "Batching engine")]
    engine: EngineArgs,
}

pub fn serve(args: &ServeArgs, launch: &Launch) -> Result<()> {
    if !(args.shutdown_timeout.is_finite() && args.shutdown_timeout >= 0.0) {
        bail!(
            "--shutdown-timeout {}: expected seconds, 0 or more",
            args.shutdown_timeout
        );
    }
    if args.max_request_bytes == 0 {
        bail!("--max-request-bytes must be at least 1");
    }
    let name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| args.model.model.clone());
    if name.trim().is_empty() {
        bail!("--served-model-name must not be empty");
    }
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!("--api-key must not be empty");
    }
    ferrum_server::cors::parse_origins(&args.allowed_origins)?;
    // Checked before the model loads.
    let slo_classes = args
        .slo_class
        .iter()
        .map(|c| parse_slo_class(c))
        .collect::<Result<Vec<_>>>()?;
    let key_roles = args
        .api_key_role
        .iter()
        .map(|k| parse_key_role(k, &slo_classes))
        .collect::<Result<Vec<_>>>()?;
    let (model, text, _) = load_parts(&args.model, launch)?;
    let TextAssets {
        tokenizer,
        chat_template,
    } = text.map_err(|why| anyhow::anyhow!("the server needs a tokenizer: {why}"))?;
    let mut cfg = args.engine.config(&args.model, args.max_waiting_requests)?;
    // A server's KV cache becomes resident in its first idle seconds, not over hours of
    // traffic: its resident size then stays flat under load.
    cfg.prefault_kv_cache = true;
    cfg.calibrate = !args.no_calibration;
    let kv_dtype = model.config().kv_cache_dtype;
    let device = model.device_name();
    let engine = crate::common::start_engine(
        model,
        Some(tokenizer),
        &cfg,
        &args.engine.speculative,
        &args.model,
    )?;
    let max_model_len = engine.max_model_len();
    let kv_tokens = engine.metrics().kv_blocks_total * cfg.block_size;
    let m = engine.metrics();
    if let Some(dir) = &m.kv_disk_dir {
        eprintln!(
            "ferrum: KV disk tier in {} ({} blocks, {} bytes, from earlier runs)",
            dir.display(),
            m.kv_disk.blocks,
            m.kv_disk.bytes
        );
    }
    if let Some(s) = m.calibration_seconds {
        let [step, prefill, decode, _] = m.cost;
        eprintln!(
            "ferrum: step cost calibrated in {s:.2} s: {:.2} ms a step + {:.3} ms a prefill token \
             + {:.3} ms a decode row",
            step * 1e3,
            prefill * 1e3,
            decode * 1e3
        );
    }
    if let Some(bytes) = cfg.kv_offload_memory {
        if m.kv_host.enabled {
            eprintln!(
                "ferrum: KV host tier: up to {bytes} bytes of page-locked memory below the GPU's \
                 KV cache"
            );
        } else {
            eprintln!(
                "ferrum: the KV cache is in host memory already: --kv-offload-memory's {bytes} \
                 bytes joined it ({} blocks in all)",
                m.kv_blocks_total
            );
        }
    }
    let server = ServerConfig {
        host: args.host.clone(),
        port: args.port,
        api_key: args.api_key.clone(),
        served_model_name: name.clone(),
        max_body_bytes: args.max_request_bytes,
        grace_period: Duration::from_secs_f64(args.shutdown_timeout),
        http_threads: 2,
        tool_call_parser: args
            .tool_call_parser
            .as_deref()
            .and_then(ferrum_server::tools::ToolFormat::from_name),
        web_ui: !args.no_web_ui,
        allowed_origins: args.allowed_origins.clone(),
        slo_classes,
        key_roles,
    };
    let has_template = chat_template.is_some();
    let web_ui = server.web_ui;
    ferrum_server::run(engine, chat_template, &server, |addr| {
        eprintln!(
            "ferrum: serving '{name}' on {device} (context {max_model_len} tokens, KV cache \
             {kv_tokens} tokens in {kv_dtype}{}) on http://{addr}{}",
            if has_template {
                ""
            } else {
                ", no chat template"
            },
            if web_ui && has_template {
                format!("\nferrum: chat page at http://{addr}/")
            } else {
                String::new()
            }
        );
    })
    .context("serving")
}

/// `--api-key-role KEY[:class=NAME][:tenant=NAME]`, its class checked against `classes`.
fn parse_key_role(
    spec: &str,
    classes: &[(String, ferrum_engine::Slo)],
) -> Result<(String, ferrum_server::state::KeyRole)> {
    let bad = |why: &str| {
        anyhow::anyhow!("--api-key-role {spec:?}: {why} (expected KEY[:class=NAME][:tenant=NAME])")
    };
    let mut parts = spec.split(':');
    let key = parts
        .next()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| bad("no key"))?;
    let mut role = ferrum_server::state::KeyRole::default();
    for p in parts {
        match p.split_once('=') {
            Some(("class", c)) if !c.is_empty() => {
                if !classes.iter().any(|(n, _)| n == c) {
                    return Err(bad(&format!("no --slo-class {c:?}")));
                }
                role.slo_class = Some(c.to_string());
            }
            Some(("tenant", t)) if !t.is_empty() && t.len() <= 256 => {
                role.tenant = Some(t.to_string())
            }
            _ => return Err(bad(&format!("{p:?} is not class=NAME or tenant=NAME"))),
        }
    }
    Ok((key.to_string(), role))
}

/// `--slo-class NAME:TTFT_MS[:TPOT_MS][:best-effort]` (a time `-`: no target).
fn parse_slo_class(spec: &str) -> Result<(String, ferrum_engine::Slo)> {
    let bad = || {
        anyhow::anyhow!(
            "--slo-class {spec:?}: expected NAME:TTFT_MS[:TPOT_MS][:best-effort] (times whole \
             numbers of milliseconds, at least 1, or - for none; at least one of them)"
        )
    };
    let ms = |p: Option<&str>| -> Result<Option<Duration>> {
        match p {
            Some("-") => Ok(None),
            Some(m) => m
                .parse::<u64>()
                .ok()
                .filter(|&m| m >= 1)
                .map(|m| Some(Duration::from_millis(m)))
                .ok_or_else(bad),
            None => Err(bad()),
        }
    };
    let mut parts: Vec<&str> = spec.split(':').collect();
    let best_effort = parts.last() == Some(&"best-effort");
    if best_effort {
        parts.pop();
    }
    let (name, ttft, tpot) = match parts.as_slice() {
        [name, ttft] => (*name, ms(Some(ttft))?, None),
        [name, ttft, tpot] => (*name, ms(Some(ttft))?, ms(Some(tpot))?),
        _ => return Err(bad()),
    };
    if name.is_empty() || (ttft.is_none() && tpot.is_none()) {
        return Err(bad());
    }
    Ok((
        name.to_string(),
        ferrum_engine::Slo {
            ttft,
            tpot,
            best_effort,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slo_classes_are_read_and_checked() {
        let (n, s) = parse_slo_class("chat:800").unwrap();
        assert_eq!(
            (n.as_str(), s.ttft, s.tpot, s.best_effort),
            ("chat", Some(Duration::from_millis(800)), None, false)
        );
        let (_, s) = parse_slo_class("chat:1000:100").unwrap();
        assert_eq!(s.tpot, Some(Duration::from_millis(100)));
        let (_, s) = parse_slo_class("stream:-:50:best-effort").unwrap();
        assert_eq!(
            (s.ttft, s.tpot, s.best_effort),
            (None, Some(Duration::from_millis(50)), true)
        );
        assert!(
            parse_slo_class("batch:60000:best-effort")
                .unwrap()
                .1
                .best_effort
        );
        for bad in [
            "",
            "x",
            ":5",
            "x:0",
            "x:y",
            "x:5:maybe",
            "x:5:best-effort:1",
            "x:-",
            "x:-:-",
            "x:5:0",
            "x:5:6:7",
        ] {
            assert!(parse_slo_class(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn key_roles_are_read_and_checked() {
        let classes = vec![parse_slo_class("chat:800").unwrap()];
        let (k, r) = parse_key_role("sk-1:class=chat:tenant=acme", &classes).unwrap();
        assert_eq!(
            (k.as_str(), r.slo_class.as_deref(), r.tenant.as_deref()),
            ("sk-1", Some("chat"), Some("acme"))
        );
        assert_eq!(
            parse_key_role("sk-2", &classes).unwrap().1,
            Default::default()
        );
        for bad in [
            "",
            ":class=chat",
            "k:class=none",
            "k:tenant=",
            "k:colour=red",
            "k:chat",
        ] {
            assert!(parse_key_role(bad, &classes).is_err(), "{bad}");
        }
    }
}
