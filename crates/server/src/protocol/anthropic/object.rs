//! The `message` object: content blocks, stop reason and usage.

use ferrum_types::FinishReason;
use serde::Serialize;
use serde_json::Value;

/// A message object, whole (fields in alphabetical order).
#[derive(Debug, Clone, Serialize)]
pub struct MessageObject {
    pub content: Vec<Block>,
    pub id: String,
    pub model: String,
    pub role: &'static str,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub usage: MessageUsage,
}

/// A content block of the answer.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        input: Value,
        name: String,
    },
}

/// Anthropic's usage: `input_tokens` are those not read from the prefix cache.
#[derive(Debug, Clone, Serialize)]
pub struct MessageUsage {
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
    pub input_tokens: usize,
    pub output_tokens: usize,
}

impl From<&ferrum_engine::Usage> for MessageUsage {
    fn from(u: &ferrum_engine::Usage) -> Self {
        MessageUsage {
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: u.cached_tokens,
            input_tokens: u.prompt_tokens.saturating_sub(u.cached_tokens),
            output_tokens: u.completion_tokens,
        }
    }
}

/// `stop_reason` and `stop_sequence` of a finish: `max_tokens` when the limit cut the answer
/// (a call it cut off must not be run), else `tool_use` when the answer made calls.
pub fn stop_reason(f: Option<&FinishReason>, has_calls: bool) -> (&'static str, Option<String>) {
    match f {
        Some(FinishReason::MaxTokens | FinishReason::MaxModelLen) => ("max_tokens", None),
        _ if has_calls => ("tool_use", None),
        Some(FinishReason::StopString(s)) => ("stop_sequence", Some(s.clone())),
        _ => ("end_turn", None),
    }
}

/// A call's arguments as the `input` object (a JSON text that does not parse stays a string).
pub fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}
