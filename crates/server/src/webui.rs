//! The chat page at `GET /`: one HTML file with its styles and script inline, embedded in the
//! binary, so there is nothing to install and nothing fetched from the network.
//!
//! The page talks to this server's own `/v1/models` and `/v1/chat/completions` (streamed),
//! asks for the API key when the server answers 401 (kept in the browser's local storage),
//! and aborts a streaming answer with its Stop button, which closes the connection, so the
//! engine aborts the request and frees its KV blocks. `--no-web-ui` turns the page off (then
//! `/` is a 404 like any unknown route).

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// The page.
pub const PAGE: &str = include_str!("webui/index.html");

/// Scripts and styles only from the page itself, requests only to this server.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

pub async fn page() -> Response {
    let mut r = PAGE.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}
