//! `/v1/responses` bodies (OpenAI's Responses API, stateless): [`ResponsesRequest`] as sent,
//! admitted into the same [`AdmittedChat`] the chat route builds, and the response objects.
//!
//! Invariants:
//! - `input` (a string, or a list of items: messages with text parts, `function_call` and
//!   `function_call_output`) becomes the chat template's messages; `instructions` is a system
//!   message before them. Consecutive `function_call` items join the assistant message before
//!   them as its `tool_calls`; a `function_call_output` is a `tool` message.
//! - Function tools (`{"type": "function", "name", "parameters"}`), `tool_choice` and
//!   `text.format` read into the chat route's tool request and constraint; errors name the
//!   Responses API's own paths (`tools[0].name`, `text.format`).
//! - The server keeps no state: `previous_response_id`, `conversation`, `store: true`,
//!   `background: true` and `item_reference` items are 400s saying so. Other features it lacks
//!   (hosted tools, images, reasoning settings, logprobs) are refused naming the parameter;
//!   `reasoning` items in `input` are skipped (no model here reads them).

pub mod events;
mod input;
mod object;
#[cfg(test)]
mod tests;

pub use object::{
    IncompleteDetails, InputTokensDetails, OutputItem, OutputText, OutputTokensDetails,
    ResponseError, ResponseObject, ResponseUsage,
};

use crate::error::{Result, ServerError};
use crate::protocol::chat::AdmittedChat;
use crate::protocol::sampling::{max_tokens, SamplingFields};
use crate::protocol::wire::{from_value, parse_body, Count, Flag, Text};
use crate::tools::ToolChoice;
use ferrum_tokenizer::ChatMessage;
use input::{bad, chat_tool_choice, chat_tools, read_input, rename, text_format, tool_path};
use serde::Deserialize;
use serde_json::{json, Value};

/// Most items in `input`.
pub const MAX_INPUT_ITEMS: usize = 4096;

/// A Responses body, as sent: the sampling fields (shared with chat) and the Responses fields.
#[derive(Debug, Clone, Default)]
pub struct ResponsesRequest {
    pub sampling: SamplingFields,
    pub fields: ResponsesFields,
}

/// The fields only the Responses API has.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct ResponsesFields {
    pub input: Option<Value>,
    pub instructions: Option<Text>,
    pub max_output_tokens: Option<Count>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Flag>,
    pub text: Option<Value>,
    pub metadata: Option<Value>,
    pub truncation: Option<Text>,
    pub previous_response_id: Option<Value>,
    pub conversation: Option<Value>,
    pub store: Option<Flag>,
    pub background: Option<Flag>,
    pub prompt: Option<Value>,
    pub reasoning: Option<Value>,
    pub include: Option<Value>,
    pub top_logprobs: Option<Value>,
    pub max_tool_calls: Option<Value>,
}

/// A Responses request ready for the chat path, and what the response object echoes.
#[derive(Debug, Clone)]
pub struct AdmittedResponse {
    pub chat: AdmittedChat,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub metadata: Value,
    /// `tools` as sent (`[]` when absent).
    pub tools: Value,
    /// `tool_choice` as sent (`"auto"` when absent).
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    /// `text` as the response echoes it: `{"format": {...}}`.
    pub text: Value,
    pub user: Option<String>,
}

impl ResponsesRequest {
    pub fn from_body(body: &[u8]) -> Result<Self> {
        Self::from_json(&parse_body(body)?)
    }

    /// Reads a parsed body.
    pub fn from_json(v: &Value) -> Result<Self> {
        Ok(ResponsesRequest {
            sampling: from_value(v)?,
            fields: from_value(v)?,
        })
    }

    /// The 400 for the first feature asked for that needs server-side state or that Ferrum
    /// lacks.
    pub fn refuse_unsupported(&self) -> Result<()> {
        let f = &self.fields;
        let stateless =
            "this server keeps no state between requests: send the whole conversation in 'input'";
        if f.previous_response_id
            .as_ref()
            .is_some_and(|v| !v.is_null())
        {
            return Err(ServerError::BadRequest {
                msg: format!("'previous_response_id' is not supported: {stateless}"),
                param: Some("previous_response_id".into()),
                code: Some("unsupported_parameter"),
            });
        }
        if f.conversation.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ServerError::BadRequest {
                msg: format!("'conversation' is not supported: {stateless}"),
                param: Some("conversation".into()),
                code: Some("unsupported_parameter"),
            });
        }
        if f.store.is_some_and(|Flag(b)| b) {
            return Err(ServerError::BadRequest {
                msg: format!("'store': true is not supported: {stateless} (send 'store': false or leave it out)"),
                param: Some("store".into()),
                code: Some("unsupported_parameter"),
            });
        }
        if f.background.is_some_and(|Flag(b)| b) {
            return Err(ServerError::unsupported(
                "background",
                "running a response in the background",
            ));
        }
        let present = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
        if present(&f.prompt) {
            return Err(ServerError::unsupported(
                "prompt",
                "stored prompt templates",
            ));
        }
        if present(&f.reasoning) {
            return Err(ServerError::unsupported("reasoning", "reasoning settings"));
        }
        if present(&f.top_logprobs) {
            return Err(ServerError::unsupported("top_logprobs", "logprobs"));
        }
        if present(&f.max_tool_calls) {
            return Err(ServerError::unsupported(
                "max_tool_calls",
                "a limit on tool calls (use 'parallel_tool_calls': false for one call)",
            ));
        }
        if f.include
            .as_ref()
            .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
        {
            return Err(ServerError::unsupported(
                "include",
                "extra output data ('include')",
            ));
        }
        match f.truncation.as_ref().map(|Text(t)| t.as_str()) {
            None | Some("disabled") => {}
            Some("auto") => {
                return Err(ServerError::unsupported(
                    "truncation",
                    "'auto' truncation (the input must fit the context)",
                ))
            }
            Some(t) => {
                return Err(bad(
                    "truncation",
                    format!("'truncation' must be 'auto' or 'disabled', got {t:?}"),
                ))
            }
        }
        if let Some(v) = &f.metadata {
            if !(v.is_null() || v.is_object()) {
                return Err(bad("metadata", "'metadata' must be an object"));
            }
        }
        Ok(())
    }

    pub fn admit(self) -> Result<AdmittedResponse> {
        let f = self.fields;
        let max = max_tokens("max_output_tokens", f.max_output_tokens)?;
        let mut opts = self.sampling.options(max)?;
        if opts.params.n != 1 {
            return Err(bad(
                "n",
                "the Responses API gives one answer per request ('n' must be 1)",
            ));
        }
        if opts.include_usage {
            return Err(bad(
                "stream_options.include_usage",
                "the Responses API reports usage in 'response.completed'",
            ));
        }
        let (structured, text) = text_format(f.text.as_ref())?;
        opts.set_constraint(structured.constraint().map_err(|e| {
            rename(e, |p| {
                p.replace("response_format.json_schema", "text.format")
                    .replace("response_format", "text.format")
            })
        })?);
        if let Some(c) = &mut opts.constraint_param {
            *c = "text.format".into();
        }
        let Some(input) = f.input.as_ref().filter(|v| !v.is_null()) else {
            return Err(bad("input", "'input' is required"));
        };
        let mut messages = read_input(input)?;
        let instructions = f.instructions.map(|Text(t)| t);
        if let Some(i) = &instructions {
            messages.insert(0, ChatMessage::new("system", i.as_str()));
        }
        let tools_sent = f.tools.clone().filter(|v| !v.is_null());
        let tools = tools_sent.as_ref().map(chat_tools).transpose()?;
        let choice = f
            .tool_choice
            .as_ref()
            .filter(|v| !v.is_null())
            .map(chat_tool_choice)
            .transpose()?;
        let parallel = f.parallel_tool_calls.is_none_or(|Flag(b)| b);
        let tool_request =
            crate::tools::request::read(tools.as_ref(), choice.as_ref(), Some(&json!(parallel)))
                .map_err(|e| rename(e, tool_path))?
                .filter(|t| t.choice != ToolChoice::None);
        if let (Some(_), Some(p)) = (&tool_request, &opts.constraint_param) {
            return Err(bad(
                p.as_str(),
                format!("'{p}' and tool calls both constrain the output; give one (or tool_choice 'none')"),
            ));
        }
        let template_tools = tools
            .filter(|t| !t.as_array().is_some_and(Vec::is_empty))
            .filter(|_| tool_request.is_some());
        let user = self.sampling.user.as_ref().map(|Text(u)| u.clone());
        Ok(AdmittedResponse {
            chat: AdmittedChat {
                opts,
                messages,
                tools: template_tools,
                tool_request,
                add_generation_prompt: true,
                prefill: None,
                prompt_param: "input",
                logprobs: false,
            },
            instructions,
            max_output_tokens: max,
            metadata: f
                .metadata
                .filter(|v| v.is_object())
                .unwrap_or_else(|| json!({})),
            tools: tools_sent.unwrap_or_else(|| json!([])),
            tool_choice: f
                .tool_choice
                .filter(|v| !v.is_null())
                .unwrap_or_else(|| json!("auto")),
            parallel_tool_calls: parallel,
            text,
            user,
        })
    }
}
