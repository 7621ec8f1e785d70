//! Plain JSON response bodies (streams are in [`crate::sse`]).

use crate::protocol::response::to_json_string;
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde::Serialize;

/// A JSON body with the given status.
pub fn json_response<T: Serialize>(status: StatusCode, v: &T) -> Response {
    let mut r = Response::new(Body::from(to_json_string(v)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
