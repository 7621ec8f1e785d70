//! Cross-origin requests for browser clients (`--allowed-origins`), on tower-http's CORS layer.
//!
//! With no origins (the default) no CORS header is sent, so browsers let only pages of this
//! server's own origin (the chat page) read its answers. Listed origins (or `*`, any origin)
//! get `Access-Control-Allow-Origin` on every answer; their preflights (`OPTIONS` with
//! `Access-Control-Request-Method`) are answered before the API-key check, since browsers send
//! no credentials on a preflight, and allow `GET`/`POST` with the headers the page asked for
//! (`Authorization`, `x-api-key`, `anthropic-version`, ...), cached for ten minutes.

use crate::error::{Result, ServerError};
use axum::http::{HeaderValue, Method};
use std::time::Duration;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// The allowed origins, checked: `*`, or `scheme://host[:port]` each.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Origins {
    #[default]
    None,
    Any,
    List(Vec<HeaderValue>),
}

/// Reads `--allowed-origins` values (each may hold several, comma-separated).
pub fn parse_origins(values: &[String]) -> Result<Origins> {
    let mut list = Vec::new();
    for v in values.iter().flat_map(|v| v.split(',')) {
        let o = v.trim().trim_end_matches('/');
        if o.is_empty() {
            continue;
        }
        if o == "*" {
            return Ok(Origins::Any);
        }
        let ok = o.split_once("://").is_some_and(|(scheme, host)| {
            matches!(scheme, "http" | "https")
                && !host.is_empty()
                && !host.contains(['/', ' ', '?', '#'])
        });
        let value = HeaderValue::from_str(o)
            .ok()
            .filter(|_| ok)
            .ok_or_else(|| {
                ServerError::bad(format!(
                "--allowed-origins: {o:?} is not an origin (scheme://host[:port], or * for any)"
            ))
            })?;
        list.push(value);
    }
    Ok(if list.is_empty() {
        Origins::None
    } else {
        Origins::List(list)
    })
}

/// The CORS layer for `origins`; `None` when no origin is allowed.
pub fn layer(origins: &Origins) -> Option<CorsLayer> {
    let allow = match origins {
        Origins::None => return None,
        Origins::Any => AllowOrigin::any(),
        Origins::List(l) => AllowOrigin::list(l.iter().cloned()),
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers(AllowHeaders::mirror_request())
            .max_age(Duration::from_secs(600)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked() {
        assert_eq!(parse_origins(&[]).unwrap(), Origins::None);
        assert_eq!(parse_origins(&["*".into()]).unwrap(), Origins::Any);
        assert_eq!(
            parse_origins(&["http://localhost:3000, https://app.example.com/".into()]).unwrap(),
            Origins::List(vec![
                HeaderValue::from_static("http://localhost:3000"),
                HeaderValue::from_static("https://app.example.com")
            ])
        );
        for bad in [
            "localhost:3000",
            "ftp://x",
            "http://",
            "http://a/b",
            "http://a b",
        ] {
            let e = parse_origins(&[bad.to_string()]).unwrap_err();
            assert!(e.to_string().contains("--allowed-origins"), "{bad}: {e}");
        }
    }
}
