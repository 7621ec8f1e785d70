//! The OpenAI-compatible HTTP server.
//!
//! Nothing is implemented here yet; the server issue fills this crate.
