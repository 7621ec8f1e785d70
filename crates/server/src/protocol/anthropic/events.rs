//! The events of a streamed message, as serde types.
//!
//! Every event is its body's fields, then `type` ([`Event`]); fields are in the order the
//! stream has always sent them (the opening `message` lists `id`, `type`, `role`, ...; a
//! `tool_use` block opens as `type`, `id`, `name`, `input`), which the writer's recorded
//! streams check byte for byte (`testdata/messages.sse`).

use super::object::MessageUsage;
use serde::Serialize;

/// One event: the body's fields, then its kind.
#[derive(Debug, Serialize)]
pub struct Event<B> {
    #[serde(flatten)]
    pub body: B,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The body of `ping` and `message_stop`.
#[derive(Debug, Serialize)]
pub struct Empty {}

/// `message_start`.
#[derive(Debug, Serialize)]
pub struct MessageStart<'a> {
    pub message: StartedMessage<'a>,
}

/// The message as it starts: no content, no stop reason, the prompt's tokens.
#[derive(Debug, Serialize)]
pub struct StartedMessage<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub content: [(); 0],
    pub model: &'a str,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<&'static str>,
    pub usage: StartUsage,
}

impl<'a> StartedMessage<'a> {
    pub fn new(id: &'a str, model: &'a str, input_tokens: usize) -> Self {
        StartedMessage {
            id,
            kind: "message",
            role: "assistant",
            content: [],
            model,
            stop_reason: None,
            stop_sequence: None,
            usage: StartUsage {
                input_tokens,
                output_tokens: 0,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
            },
        }
    }
}

/// The usage of `message_start` (the whole prompt: the cache is not looked up yet).
#[derive(Debug, Serialize)]
pub struct StartUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
}

/// `content_block_start`.
#[derive(Debug, Serialize)]
pub struct BlockStart<'a> {
    pub index: usize,
    pub content_block: StartedBlock<'a>,
}

/// A block as it starts: empty text, or a call with its input still to come.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StartedBlock<'a> {
    Text {
        text: &'static str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Empty,
    },
}

/// `content_block_delta`.
#[derive(Debug, Serialize)]
pub struct BlockDelta<'a> {
    pub index: usize,
    pub delta: Delta<'a>,
}

/// More of a block: text, or a piece of a call's input JSON.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Delta<'a> {
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
}

/// `content_block_stop`.
#[derive(Debug, Serialize)]
pub struct BlockStop {
    pub index: usize,
}

/// `message_delta`: how the message stopped, and its usage.
#[derive(Debug, Serialize)]
pub struct MessageDelta {
    pub delta: StopDelta,
    pub usage: MessageUsage,
}

#[derive(Debug, Serialize)]
pub struct StopDelta {
    pub stop_reason: &'static str,
    pub stop_sequence: Option<String>,
}

/// `error` (an event) and the body of an error response.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
}

/// An error response's body: `type` first, as Anthropic sends it.
#[derive(Debug, Serialize)]
pub struct ErrorResponse {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub error: ErrorDetail,
}

/// `count_tokens`' answer.
#[derive(Debug, Serialize)]
pub struct TokenCount {
    pub input_tokens: usize,
}
