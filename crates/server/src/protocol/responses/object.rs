//! The `response` object and its parts, as the whole answer and the stream's events carry them.

use super::AdmittedResponse;
use serde::Serialize;
use serde_json::Value;

/// A `response` object, whole or as the stream's events carry it. Fields in alphabetical order.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub background: bool,
    pub created_at: u64,
    /// When the response failed.
    pub error: Option<ResponseError>,
    pub id: String,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub metadata: Value,
    pub model: String,
    pub object: &'static str,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    pub store: bool,
    pub temperature: f32,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Value,
    pub top_p: f32,
    pub truncation: &'static str,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
}

impl ResponseObject {
    /// The object of an admitted request before any output.
    pub fn new(id: String, model: String, created_at: u64, r: &AdmittedResponse) -> Self {
        ResponseObject {
            background: false,
            created_at,
            error: None,
            id,
            incomplete_details: None,
            instructions: r.instructions.clone(),
            max_output_tokens: r.max_output_tokens,
            metadata: r.metadata.clone(),
            model,
            object: "response",
            output: Vec::new(),
            parallel_tool_calls: r.parallel_tool_calls,
            previous_response_id: None,
            status: "in_progress",
            store: false,
            temperature: r.chat.opts.params.temperature,
            text: r.text.clone(),
            tool_choice: r.tool_choice.clone(),
            tools: r.tools.clone(),
            top_p: r.chat.opts.params.top_p,
            truncation: "disabled",
            usage: None,
            user: r.user.clone(),
        }
    }
}

/// What made a response fail.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseError {
    /// `server_error`.
    pub code: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct IncompleteDetails {
    /// `max_output_tokens` (the limit or the context was reached).
    pub reason: &'static str,
}

/// An output item: the assistant's message, or a function call.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message {
        content: Vec<OutputText>,
        id: String,
        role: &'static str,
        status: &'static str,
    },
    FunctionCall {
        arguments: String,
        call_id: String,
        id: String,
        name: String,
        status: &'static str,
    },
}

/// The `output_text` part of a message.
#[derive(Debug, Clone, Serialize)]
pub struct OutputText {
    pub annotations: Vec<Value>,
    pub logprobs: Vec<Value>,
    pub text: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl OutputText {
    pub fn new(text: String) -> Self {
        OutputText {
            annotations: Vec::new(),
            logprobs: Vec::new(),
            text,
            kind: "output_text",
        }
    }
}

/// The Responses API's usage object.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct InputTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

impl From<&ferrum_engine::Usage> for ResponseUsage {
    fn from(u: &ferrum_engine::Usage) -> Self {
        ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u.cached_tokens,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}
