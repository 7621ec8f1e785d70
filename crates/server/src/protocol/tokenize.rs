//! `/tokenize` and `/detokenize` bodies (vLLM's extra routes).
//!
//! `/tokenize` takes `{"prompt": text, "add_special_tokens": bool}` or a chat body with
//! `messages` (read as [`super::ChatCompletionRequest`], rendered with the chat template), or
//! llama-server's `{"content": text, "add_special": bool, "with_pieces": bool}` (answered in
//! llama-server's shape, `{"tokens": [...]}`);
//! `/detokenize` takes `{"tokens": [ids], "skip_special_tokens": bool}`.

use super::wire::{Flag, Text, TokenIds};
use serde::Deserialize;
use serde_json::Value;

/// A `/tokenize` body, as sent; with `messages` the body is read again as a chat request.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct TokenizeRequest {
    pub model: Option<Text>,
    pub prompt: Option<Text>,
    /// Defaults to true.
    pub add_special_tokens: Option<Flag>,
    /// Present: tokenize the rendered conversation instead of `prompt`.
    pub messages: Option<Value>,
    /// llama-server's text field: the answer takes llama-server's shape.
    pub content: Option<Text>,
    /// llama-server's `add_special` (defaults to false there).
    pub add_special: Option<Flag>,
    /// llama-server's `with_pieces`: each token with its text.
    pub with_pieces: Option<Flag>,
}

/// A `/detokenize` body, as sent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct DetokenizeRequest {
    pub model: Option<Text>,
    pub tokens: Option<TokenIds>,
    /// Defaults to false.
    pub skip_special_tokens: Option<Flag>,
}
