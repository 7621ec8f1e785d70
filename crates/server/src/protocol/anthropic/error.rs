//! Anthropic's error shape and statuses for a [`ServerError`].

use super::events::{ErrorDetail, ErrorResponse};
use crate::error::ServerError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// A [`ServerError`] in Anthropic's shape and statuses.
#[derive(Debug)]
pub struct AnthropicError(pub ServerError);

impl From<ServerError> for AnthropicError {
    fn from(e: ServerError) -> Self {
        AnthropicError(e)
    }
}

impl AnthropicError {
    /// Status and error type as Anthropic's API answers them.
    pub fn status_and_type(&self) -> (StatusCode, &'static str) {
        match &self.0 {
            ServerError::BadRequest { .. } | ServerError::MethodNotAllowed(_) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error")
            }
            ServerError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "authentication_error"),
            ServerError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found_error"),
            ServerError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
            ServerError::Overloaded(_) => (
                StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                "overloaded_error",
            ),
            ServerError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "api_error"),
            ServerError::TooSoon { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            ServerError::Internal(_) | ServerError::Io(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "api_error")
            }
        }
    }

    /// `{"type": "error", "error": {"type", "message"}}`.
    pub fn body(&self) -> ErrorResponse {
        let (_, kind) = self.status_and_type();
        ErrorResponse {
            kind: "error",
            error: ErrorDetail {
                kind,
                message: self.0.to_string(),
            },
        }
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let (status, _) = self.status_and_type();
        let mut r = crate::json::json_response(status, &self.body());
        if matches!(self.0, ServerError::Overloaded(_)) {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(crate::error::RETRY_AFTER_SECS),
            );
        }
        if let ServerError::TooSoon { retry_after, .. } = self.0 {
            crate::error::insert_retry_after(r.headers_mut(), retry_after);
        }
        r
    }
}
