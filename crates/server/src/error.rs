//! The server's error type and the one place where errors become HTTP responses.
//!
//! Every failure a handler can meet is a [`ServerError`]; its `IntoResponse` writes OpenAI's
//! error shape, `{"error": {"message", "type", "param", "code"}}`, with the status that fits.
//! A client mistake is a 4xx, never a 500; overload is a 503 with `Retry-After`.

use crate::protocol::response::{ErrorBody, ErrorResponse};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ferrum_engine::EngineError;
use ferrum_types::TypesError;

/// Seconds a client is told to wait when the queue is full.
pub const RETRY_AFTER_SECS: u64 = 1;

/// Everything that can go wrong while serving a request (or starting the server).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The request is malformed or asks for something invalid (400); `param` names the field.
    #[error("{msg}")]
    BadRequest {
        msg: String,
        param: Option<String>,
        code: Option<&'static str>,
    },
    /// No API key or the wrong one (401).
    #[error("{0}")]
    Unauthorized(String),
    /// No such route or model (404).
    #[error("{msg}")]
    NotFound { msg: String, code: &'static str },
    /// The route exists but not for this method (405).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The body is over the size limit (413).
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The engine's queue is full (503 with `Retry-After`).
    #[error("{0}")]
    Overloaded(String),
    /// The request's time-to-first-token target cannot be met now (429 with when it could
    /// be: `Retry-After` in whole seconds, `retry-after-ms` as the OpenAI and Anthropic
    /// SDKs read it first).
    #[error("{msg}")]
    TooSoon {
        msg: String,
        retry_after: std::time::Duration,
    },
    /// The engine is stopping or has stopped (503).
    #[error("{0}")]
    Unavailable(String),
    /// A fault on our side (500).
    #[error("{0}")]
    Internal(String),
    /// Binding or serving the socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, ServerError>;

impl ServerError {
    /// A 400 that names the offending parameter.
    pub fn param(param: impl Into<String>, msg: impl Into<String>) -> Self {
        ServerError::BadRequest {
            msg: msg.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    /// A 400 with no single parameter to blame.
    pub fn bad(msg: impl Into<String>) -> Self {
        ServerError::BadRequest {
            msg: msg.into(),
            param: None,
            code: None,
        }
    }

    /// A 400 for a known OpenAI feature that Ferrum does not implement yet.
    pub fn unsupported(param: &str, what: &str) -> Self {
        ServerError::BadRequest {
            msg: format!("'{param}': {what} is not supported by this server yet"),
            param: Some(param.to_string()),
            code: Some("unsupported_parameter"),
        }
    }

    /// A 400 with its message and parameter rewritten by `f` (another API's names for the
    /// same field); any other error as it is.
    pub fn rename_bad_request(
        self,
        f: impl FnOnce(String, Option<String>) -> (String, Option<String>),
    ) -> Self {
        match self {
            ServerError::BadRequest { msg, param, code } => {
                let (msg, param) = f(msg, param);
                ServerError::BadRequest { msg, param, code }
            }
            e => e,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ServerError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ServerError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ServerError::NotFound { .. } => StatusCode::NOT_FOUND,
            ServerError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ServerError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ServerError::TooSoon { .. } => StatusCode::TOO_MANY_REQUESTS,
            ServerError::Overloaded(_) | ServerError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ServerError::Internal(_) | ServerError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The body OpenAI clients parse: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> ErrorResponse {
        let (kind, param, code): (&'static str, Option<&str>, Option<&'static str>) = match self {
            ServerError::BadRequest { param, code, .. } => {
                ("invalid_request_error", param.as_deref(), *code)
            }
            ServerError::Unauthorized(_) => {
                ("invalid_request_error", None, Some("invalid_api_key"))
            }
            ServerError::NotFound { code, .. } => ("invalid_request_error", None, Some(*code)),
            ServerError::MethodNotAllowed(_) => {
                ("invalid_request_error", None, Some("method_not_allowed"))
            }
            ServerError::PayloadTooLarge(_) => {
                ("invalid_request_error", None, Some("request_too_large"))
            }
            ServerError::Overloaded(_) => ("server_overloaded", None, Some("overloaded")),
            ServerError::TooSoon { .. } => ("server_overloaded", None, Some("slo_unmeetable")),
            ServerError::Unavailable(_) => ("server_error", None, Some("unavailable")),
            ServerError::Internal(_) | ServerError::Io(_) => ("server_error", None, None),
        };
        ErrorResponse {
            error: ErrorBody {
                code,
                message: self.to_string(),
                param: param.map(str::to_string),
                kind,
            },
        }
    }

    /// [`ServerError::body`] as a JSON value (for tests and checks).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.body()).unwrap_or_default()
    }
}

impl From<EngineError> for ServerError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Params(TypesError::InvalidParam { param, msg }) => {
                ServerError::param(param, format!("'{param}': {msg}"))
            }
            EngineError::Params(e) => ServerError::bad(e.to_string()),
            EngineError::Request(msg) => ServerError::bad(msg),
            // Not the client's fault: a server that cannot serve it, or a fault inside.
            EngineError::Config(msg) | EngineError::Internal(msg) => ServerError::Internal(msg),
            EngineError::Constraint { .. } => ServerError::bad(e.to_string()),
            EngineError::Overloaded(_) => ServerError::Overloaded(e.to_string()),
            EngineError::Unmeetable { msg, retry_after } => {
                ServerError::TooSoon { msg, retry_after }
            }
            EngineError::Unavailable(msg) => ServerError::Unavailable(msg),
            EngineError::Model(_) | EngineError::Tokenizer(_) => {
                ServerError::Internal(e.to_string())
            }
        }
    }
}

impl From<ferrum_tokenizer::TokenizerError> for ServerError {
    fn from(e: ferrum_tokenizer::TokenizerError) -> Self {
        ServerError::bad(e.to_string())
    }
}

/// `Retry-After` (whole seconds, rounded up, at least 1, as HTTP has it) and `retry-after-ms`
/// (milliseconds, rounded up, at least 1: the precision a first-token target needs, and the
/// header the OpenAI and Anthropic SDKs prefer) for a wait of `d`.
pub(crate) fn insert_retry_after(headers: &mut axum::http::HeaderMap, d: std::time::Duration) {
    let secs = d.as_secs_f64().ceil().max(1.0) as u64;
    let ms = (d.as_secs_f64() * 1e3).ceil().max(1.0) as u64;
    headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    headers.insert(
        header::HeaderName::from_static("retry-after-ms"),
        HeaderValue::from(ms),
    );
}

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut resp = crate::json::json_response(status, &self.body());
        if matches!(self, ServerError::Overloaded(_)) {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if let ServerError::TooSoon { retry_after, .. } = self {
            insert_retry_after(resp.headers_mut(), retry_after);
        }
        if matches!(self, ServerError::Unauthorized(_)) {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_statuses() {
        let e: ServerError = EngineError::Overloaded(3).into();
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        let r = e.into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let e: ServerError = EngineError::Unmeetable {
            msg: "late".into(),
            retry_after: std::time::Duration::from_millis(2300),
        }
        .into();
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.to_json()["error"]["code"], "slo_unmeetable");
        let r = e.into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        assert_eq!(r.headers()["retry-after-ms"], "2300");
        let e: ServerError = EngineError::Unmeetable {
            msg: "late".into(),
            retry_after: std::time::Duration::from_micros(120_400),
        }
        .into();
        let r = e.into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(r.headers()["retry-after-ms"], "121");
        let e: ServerError = EngineError::Params(TypesError::InvalidParam {
            param: "top_p",
            msg: "2 is outside (0, 1]".into(),
        })
        .into();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.to_json()["error"]["param"], "top_p");
        let e: ServerError = EngineError::Request("prompt too long".into()).into();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        // An engine fault is never the client's: a 500 whose body says it is the server's.
        for e in [
            EngineError::Internal("step failed: kernel".into()),
            EngineError::Config("no draft model".into()),
        ] {
            let e: ServerError = e.into();
            assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(e.to_json()["error"]["type"], "server_error");
        }
    }
}
