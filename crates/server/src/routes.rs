//! The router: OpenAI routes, operational routes, API-key check, body limit, and JSON
//! errors for unknown routes and wrong methods.
//!
//! `/health` and `/metrics` are open so that probes and scrapers need no key; every other
//! route needs `Authorization: Bearer <key>` when the server has one.

use crate::anthropic::{count_tokens, messages};
use crate::chat::chat_completions;
use crate::completions::completions;
use crate::error::{Result, ServerError};
use crate::json::json_response;
use crate::protocol::anthropic::AnthropicError;
use crate::protocol::response::{
    DetokenizeResponse, LlamaTokenizeResponse, LlamaTokens, ModelCard, ModelList, TokenPiece,
    TokenizeResponse,
};
use crate::protocol::tokenize::{DetokenizeRequest, TokenizeRequest};
use crate::protocol::wire::{from_value, parse_body, Flag, Text, TokenIds};
use crate::protocol::ChatCompletionRequest;
use crate::responses::responses;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

/// Every route of the server over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.max_body_bytes;
    let mut app = Router::new();
    if state.web_ui {
        app = app.route("/", get(crate::webui::page));
    }
    let app = app
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/models", get(models))
        .route("/v1/models/{*model}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(from_fn_with_state(state.clone(), auth));
    // Outermost, so preflights are answered before the key check.
    let app = match crate::cors::layer(&state.allowed_origins) {
        Some(cors) => app.layer(cors),
        None => app,
    };
    app.with_state(state)
}

/// Constant-time comparison, so the key cannot be guessed byte by byte from timings.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a path takes Anthropic's error shape.
fn anthropic_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// The key a request carries: `Authorization: Bearer <key>` (OpenAI) or `x-api-key: <key>`
/// (Anthropic).
fn given_key(req: &Request) -> Option<&str> {
    let h = req.headers();
    h.get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| h.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim)
}

async fn auth(State(s): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    // The chat page is open: it asks for the key and sends it with its API calls.
    let open = matches!(req.uri().path(), "/health" | "/metrics" | "/");
    if (s.api_key.is_some() || !s.key_roles.is_empty()) && !open {
        let refusal = match given_key(&req) {
            None => Some(ServerError::Unauthorized(
                "no API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'".into(),
            )),
            Some(g) => {
                // Every key is compared, so timings do not tell which one came close.
                let plain = s
                    .api_key
                    .as_ref()
                    .is_some_and(|k| same(g.as_bytes(), k.as_bytes()));
                let role = s.key_roles.iter().fold(None, |found, (k, r)| {
                    if same(g.as_bytes(), k.as_bytes()) {
                        Some(r.clone())
                    } else {
                        found
                    }
                });
                match role {
                    Some(r) => {
                        req.extensions_mut().insert(r);
                        None
                    }
                    None if plain => None,
                    None => Some(ServerError::Unauthorized("the API key is not valid".into())),
                }
            }
        };
        if let Some(e) = refusal {
            return if anthropic_path(req.uri().path()) {
                AnthropicError(e).into_response()
            } else {
                e.into_response()
            };
        }
    }
    next.run(req).await
}

async fn not_found(uri: Uri) -> ServerError {
    ServerError::NotFound {
        msg: format!("no route {}", uri.path()),
        code: "not_found",
    }
}

async fn method_not_allowed(uri: Uri, req: Request) -> ServerError {
    ServerError::MethodNotAllowed(format!("{} is not allowed on {}", req.method(), uri.path()))
}

fn model_card(s: &AppState) -> ModelCard {
    ModelCard {
        created: s.created,
        id: s.model_name.clone(),
        max_model_len: s.engine.max_model_len(),
        object: "model",
        owned_by: "ferrum",
    }
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    let list = ModelList {
        data: vec![model_card(&s)],
        object: "list",
    };
    json_response(StatusCode::OK, &list)
}

async fn model(State(s): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Response> {
    s.check_model(Some(&name))?;
    Ok(json_response(StatusCode::OK, &model_card(&s)))
}

async fn health(State(s): State<Arc<AppState>>) -> Result<Response> {
    if !s.engine.is_healthy() {
        return Err(ServerError::Unavailable("the engine is not running".into()));
    }
    Ok(StatusCode::OK.into_response())
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let text = crate::metrics::render(&s.engine.metrics(), &s.model_name);
    let mut r = Response::new(axum::body::Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// `{"prompt": text, "add_special_tokens": true}` or `{"messages": [...]}` (rendered with
/// the chat template) -> `{"tokens", "count", "max_model_len"}`; llama-server's
/// `{"content": text, "add_special": false, "with_pieces": false}` -> `{"tokens"}`.
async fn tokenize(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = parse_body(&s.body(body)?)?;
    let req: TokenizeRequest = from_value(&body)?;
    s.check_model(req.model.as_ref().map(|Text(m)| m.as_str()))?;
    if let (Some(Text(content)), None, None) = (&req.content, &req.prompt, &req.messages) {
        let add = req.add_special.is_some_and(|Flag(b)| b);
        let ids = s.tokenizer.encode(content, add)?;
        let tokens = if req.with_pieces.is_some_and(|Flag(b)| b) {
            let pieces = ids
                .iter()
                .map(|&id| {
                    Ok(TokenPiece {
                        id,
                        piece: s.tokenizer.token_text(id)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            LlamaTokens::Pieces(pieces)
        } else {
            LlamaTokens::Ids(ids)
        };
        return Ok(json_response(
            StatusCode::OK,
            &LlamaTokenizeResponse { tokens },
        ));
    }
    let tokens = if req.messages.is_some() {
        let chat = ChatCompletionRequest::from_json(&body)?;
        chat.refuse_unsupported()?;
        let chat = chat.admit()?;
        crate::chat::chat_prompt(&s, &chat).await?
    } else {
        let Some(Text(prompt)) = &req.prompt else {
            return Err(ServerError::param(
                "prompt",
                "'prompt' (a string), 'messages' or 'content' is required",
            ));
        };
        let add = req.add_special_tokens.is_none_or(|Flag(b)| b);
        s.tokenizer.encode(prompt, add)?
    };
    let answer = TokenizeResponse {
        count: tokens.len(),
        max_model_len: s.engine.max_model_len(),
        tokens,
    };
    Ok(json_response(StatusCode::OK, &answer))
}

/// `{"tokens": [ids]}` -> `{"prompt": text}`.
async fn detokenize(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let req: DetokenizeRequest = from_value(&parse_body(&s.body(body)?)?)?;
    s.check_model(req.model.as_ref().map(|Text(m)| m.as_str()))?;
    let Some(TokenIds(ids)) = req.tokens else {
        return Err(ServerError::param("tokens", "'tokens' is required"));
    };
    let skip = req.skip_special_tokens.is_some_and(|Flag(b)| b);
    let prompt = s
        .tokenizer
        .decode(&ids, skip)
        .map_err(|e| ServerError::param("tokens", e.to_string()))?;
    Ok(json_response(
        StatusCode::OK,
        &DetokenizeResponse { prompt },
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_comparison() {
        assert!(super::same(b"abc", b"abc"));
        assert!(!super::same(b"abc", b"abd"));
        assert!(!super::same(b"abc", b"ab"));
    }
}
