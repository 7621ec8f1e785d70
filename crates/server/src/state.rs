//! What every handler shares: the engine handle, the text assets, the served name and the
//! checks every generation request goes through (model name, context length, body size).

use crate::cors::Origins;
use crate::error::{Result, ServerError};
use crate::protocol::Options;
use crate::tools::ToolFormat;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use ferrum_engine::{EngineError, EngineHandle, Guide};
use ferrum_tokenizer::{ChatTemplate, Tokenizer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Shared by all handlers; cheap to reach through an `Arc`.
#[derive(Debug)]
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<Arc<ChatTemplate>>,
    /// How this model writes tool calls: `--tool-call-parser`, or read off the template;
    /// `None` when the template takes no tools.
    pub tool_format: Option<ToolFormat>,
    /// The name clients pass as `model`.
    pub model_name: String,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Whether `GET /` serves the chat page.
    pub web_ui: bool,
    /// Origins whose browser pages may call the API (CORS).
    pub allowed_origins: Origins,
    /// When the server started (Unix seconds), reported as the model's `created`.
    pub created: u64,
    /// `--slo-class`: service-level classes by name.
    pub slo_classes: std::collections::HashMap<String, ferrum_engine::Slo>,
    /// `--api-key-role`: further keys, each with what it stands for.
    pub key_roles: Vec<(String, KeyRole)>,
    next_id: AtomicU64,
    id_salt: u64,
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What an API key of `--api-key-role` stands for: a service-level class for requests that
/// name none, and a tenant, which the key fixes (a request's `user` cannot claim another).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRole {
    pub slo_class: Option<String>,
    pub tenant: Option<String>,
}

impl KeyRole {
    /// Applies the role to an admitted request's options.
    pub fn apply(&self, opts: &mut crate::protocol::Options) {
        if opts.slo.is_none() {
            if let Some(c) = &self.slo_class {
                opts.slo = Some(crate::protocol::sampling::SloAsk::Class(c.clone()));
            }
        }
        if let Some(t) = &self.tenant {
            opts.tenant = Some(t.clone());
        }
    }
}

impl AppState {
    /// The engine's target for what a request asked (`slo_class` must name a class of the
    /// server's).
    pub fn slo(
        &self,
        ask: Option<&crate::protocol::sampling::SloAsk>,
    ) -> Result<Option<ferrum_engine::Slo>> {
        use crate::protocol::sampling::SloAsk;
        Ok(match ask {
            None => None,
            Some(SloAsk::Target {
                ttft_ms,
                tpot_ms,
                best_effort,
            }) => Some(ferrum_engine::Slo {
                ttft: ttft_ms.map(std::time::Duration::from_millis),
                tpot: tpot_ms.map(std::time::Duration::from_millis),
                best_effort: *best_effort,
            }),
            Some(SloAsk::Class(c)) => Some(*self.slo_classes.get(c).ok_or_else(|| {
                crate::error::ServerError::param(
                    "slo_class",
                    format!("no service-level class {c:?} on this server (see --slo-class)"),
                )
            })?),
        })
    }

    pub fn new(
        engine: EngineHandle,
        template: Option<ChatTemplate>,
        model_name: String,
        api_key: Option<String>,
        max_body_bytes: usize,
    ) -> Result<AppState> {
        let tokenizer = engine.tokenizer().cloned().ok_or_else(|| {
            ServerError::Internal("the server needs a model with a tokenizer".into())
        })?;
        let salt = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ (u64::from(std::process::id()) << 40);
        let tool_format = template
            .as_ref()
            .and_then(|t| ToolFormat::detect(t.source()));
        Ok(AppState {
            engine,
            tokenizer,
            tool_format,
            template: template.map(Arc::new),
            model_name,
            api_key,
            max_body_bytes,
            web_ui: true,
            allowed_origins: Origins::None,
            created: unix_now(),
            slo_classes: Default::default(),
            key_roles: Vec::new(),
            next_id: AtomicU64::new(0),
            id_salt: salt,
        })
    }

    /// A fresh response id such as `chatcmpl-3f2a...`: unique within the process, and
    /// unlikely to repeat across restarts.
    /// Compiles the request's structured-output constraint, if any, on a blocking thread (a
    /// schema compiles in milliseconds; the first constraint also builds the tokenizer's
    /// trie). A constraint that does not compile is a 400 naming its field.
    pub async fn compile_constraint(&self, opts: &Options) -> Result<Option<Guide>> {
        let Some(spec) = opts.params.structured.clone() else {
            return Ok(None);
        };
        let engine = self.engine.clone();
        let compiled = tokio::task::spawn_blocking(move || engine.compile_guide(&spec))
            .await
            .map_err(|e| ServerError::Internal(format!("compiling the constraint failed: {e}")))?;
        match compiled {
            Ok(g) => Ok(Some(g)),
            Err(e @ EngineError::Constraint { .. }) => Err(match &opts.constraint_param {
                Some(p) => ServerError::param(p.as_str(), format!("'{p}': {e}")),
                None => ServerError::bad(e.to_string()),
            }),
            Err(e) => Err(e.into()),
        }
    }

    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        // Consecutive ids look unrelated.
        let x = ferrum_types::splitmix::mix64(self.id_salt ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        format!("{prefix}-{x:016x}{n:08x}")
    }

    /// A request naming another model is a 404, as OpenAI answers; no name means this one.
    pub fn check_model(&self, requested: Option<&str>) -> Result<()> {
        match requested {
            Some(m) if m != self.model_name => Err(ServerError::NotFound {
                msg: format!(
                    "The model '{m}' does not exist; this server serves '{}'",
                    self.model_name
                ),
                code: "model_not_found",
            }),
            _ => Ok(()),
        }
    }

    /// Prompt and requested output must fit the context, as OpenAI checks it.
    pub fn check_context(
        &self,
        prompt_len: usize,
        max_tokens: Option<usize>,
        what: &str,
    ) -> Result<()> {
        let limit = self.engine.max_model_len();
        let wanted = prompt_len.saturating_add(max_tokens.unwrap_or(1));
        if prompt_len >= limit || wanted > limit {
            let detail = match max_tokens {
                Some(m) => format!(
                    "you requested {wanted} tokens ({prompt_len} in the {what}, {m} in the completion)"
                ),
                None => format!("your {what} resulted in {prompt_len} tokens"),
            };
            return Err(ServerError::BadRequest {
                msg: format!(
                    "This model's maximum context length is {limit} tokens. However, {detail}. Please reduce the length of the {what} or completion."
                ),
                param: Some(what.to_string()),
                code: Some("context_length_exceeded"),
            });
        }
        Ok(())
    }

    /// The body, or the right error for one that could not be read (413 when too large).
    pub fn body(&self, body: std::result::Result<Bytes, BytesRejection>) -> Result<Bytes> {
        body.map_err(|rej| {
            if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ServerError::PayloadTooLarge(format!(
                    "the request body is larger than this server's limit of {} bytes",
                    self.max_body_bytes
                ))
            } else {
                ServerError::bad(format!("cannot read the request body: {}", rej.body_text()))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::sampling::SloAsk;

    /// A key's class stands in for a request that names none; its tenant always wins.
    #[test]
    fn key_roles_apply_their_class_and_tenant() {
        let role = KeyRole {
            slo_class: Some("chat".into()),
            tenant: Some("a".into()),
        };
        let opts_of = |body: &str| {
            crate::protocol::completions::CompletionRequest::from_body(body.as_bytes())
                .unwrap()
                .admit()
                .unwrap()
                .opts
        };
        let mut opts = opts_of(r#"{"prompt":"x","user":"b"}"#);
        role.apply(&mut opts);
        assert_eq!(opts.slo, Some(SloAsk::Class("chat".into())));
        assert_eq!(opts.tenant.as_deref(), Some("a"));
        let mut opts = opts_of(r#"{"prompt":"x","slo_class":"bulk"}"#);
        KeyRole::default().apply(&mut opts);
        assert_eq!(
            (opts.slo.clone(), opts.tenant.clone()),
            (Some(SloAsk::Class("bulk".into())), None)
        );
        role.apply(&mut opts);
        assert_eq!(
            opts.slo,
            Some(SloAsk::Class("bulk".into())),
            "the request's own"
        );
    }
}
