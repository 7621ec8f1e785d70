//! The OpenAI-compatible HTTP server behind `ferrum serve`, on axum and tokio.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`
//! (OpenAI's Responses API), `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic's
//! Messages API), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus),
//! `POST /tokenize`, `POST /detokenize`, and the chat page at `GET /` ([`webui`]).
//!
//! Design and invariants:
//! - Admission happens here: the body is read into typed requests ([`protocol`]), the chat
//!   template is rendered and the prompt tokenized (on the blocking pool), the context length
//!   checked; only then does a request reach the engine. Every failure is a [`ServerError`],
//!   turned into OpenAI's error JSON in one place ([`error`]).
//! - The engine thread never waits for the HTTP side: it sends events into unbounded
//!   channels, and each HTTP request reads its own at its client's pace.
//! - A request lives exactly as long as its response: a dropped response body or handler
//!   future (the client went away) drops the engine streams, which aborts their requests and
//!   frees their KV blocks.
//! - Shutdown (SIGINT/SIGTERM): the listener closes at once, in-flight requests get up to
//!   the grace period to finish, then whatever is left is aborted and the engine stops. A
//!   second signal skips the wait.

pub mod anthropic;
pub mod chat;
pub mod completions;
pub mod cors;
pub mod error;
pub mod generate;
pub mod json;
pub mod metrics;
pub mod protocol;
pub mod responses;
pub mod routes;
pub mod sse;
pub mod state;
pub mod tools;
pub mod webui;

pub use error::{Result, ServerError};
pub use routes::router;
pub use state::AppState;

use ferrum_engine::EngineHandle;
use ferrum_tokenizer::ChatTemplate;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How `ferrum serve` listens and answers.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port (the bound address is printed).
    pub port: u16,
    /// When set, every route but `/health` and `/metrics` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The name clients pass as `model`.
    pub served_model_name: String,
    /// Larger request bodies get a 413.
    pub max_body_bytes: usize,
    /// How long in-flight requests may run after a shutdown signal.
    pub grace_period: Duration,
    /// Tokio worker threads for HTTP (the engine has its own threads).
    pub http_threads: usize,
    /// The tool-call format, overriding the one read off the chat template.
    pub tool_call_parser: Option<tools::ToolFormat>,
    /// Serve the chat page at `/`.
    pub web_ui: bool,
    /// `--allowed-origins`: origins (or `*`) whose browser pages may call the API.
    pub allowed_origins: Vec<String>,
    /// `--slo-class`: service-level classes a request names with `slo_class`.
    pub slo_classes: Vec<(String, ferrum_engine::Slo)>,
    /// `--api-key-role`: further API keys, each standing for a class and a tenant.
    pub key_roles: Vec<(String, state::KeyRole)>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            api_key: None,
            served_model_name: "ferrum".into(),
            max_body_bytes: 8 << 20,
            grace_period: Duration::from_secs(30),
            http_threads: 2,
            tool_call_parser: None,
            web_ui: true,
            allowed_origins: Vec::new(),
            slo_classes: Vec::new(),
            key_roles: Vec::new(),
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let int = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = int => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = int.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = int.await;
    }
}

/// Serves until a shutdown signal, then drains and stops the engine. Blocks the caller.
/// `on_listening` is told the bound address once the socket accepts connections.
pub fn run(
    engine: EngineHandle,
    template: Option<ChatTemplate>,
    cfg: &ServerConfig,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    let mut state = AppState::new(
        engine.clone(),
        template,
        cfg.served_model_name.clone(),
        cfg.api_key.clone(),
        cfg.max_body_bytes,
    )?;
    if cfg.tool_call_parser.is_some() {
        state.tool_format = cfg.tool_call_parser;
    }
    state.web_ui = cfg.web_ui;
    state.slo_classes = cfg.slo_classes.iter().cloned().collect();
    for (_, role) in &cfg.key_roles {
        if let Some(c) = role
            .slo_class
            .as_ref()
            .filter(|c| !state.slo_classes.contains_key(*c))
        {
            return Err(ServerError::Internal(format!(
                "--api-key-role names the class {c:?}, which no --slo-class defines"
            )));
        }
    }
    state.key_roles = cfg.key_roles.clone();
    state.allowed_origins = cors::parse_origins(&cfg.allowed_origins)?;
    let state = Arc::new(state);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.http_threads.max(1))
        .thread_name("ferrum-http")
        .enable_all()
        .build()?;
    let grace = cfg.grace_period;
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let result = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| {
            ServerError::Io(std::io::Error::new(
                e.kind(),
                format!("cannot listen on {addr}: {e}"),
            ))
        })?;
        on_listening(listener.local_addr()?);
        let (tx, mut signalled) = tokio::sync::watch::channel(false);
        let app = router(state);
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            shutdown_signal().await;
            let _ = tx.send(true);
        });
        let mut server = tokio::spawn(async move { server.await });
        tokio::select! {
            r = &mut server => return r.map_err(|e| ServerError::Internal(e.to_string()))?.map_err(ServerError::Io),
            _ = signalled.changed() => {}
        }
        eprintln!(
            "shutting down: no new connections; in-flight requests have {}s to finish",
            grace.as_secs_f64()
        );
        tokio::select! {
            r = &mut server => {
                r.map_err(|e| ServerError::Internal(e.to_string()))?.map_err(ServerError::Io)?;
            }
            _ = tokio::time::sleep(grace) => {
                eprintln!("grace period over: aborting the requests still running");
            }
            _ = shutdown_signal() => {
                eprintln!("second signal: aborting the requests still running");
            }
        }
        Ok(())
    });
    // Dropping the runtime drops every connection and stream, which aborts their requests.
    rt.shutdown_timeout(Duration::from_secs(1));
    engine.shutdown();
    result
}
