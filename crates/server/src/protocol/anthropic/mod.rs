//! `/v1/messages` bodies (Anthropic's Messages API): [`MessagesRequest`] as sent, admitted
//! into the same [`AdmittedChat`] the chat route builds; the message object; Anthropic's error
//! shape.
//!
//! Invariants:
//! - `system` (a string or text blocks) is a system message before the conversation. A user
//!   message's `tool_result` blocks become `tool` messages (before the user's text, which
//!   follows as a user message); an assistant message's `tool_use` blocks become its
//!   `tool_calls`; `thinking` blocks are skipped (no model here reads them back).
//! - A last message from the assistant is a prefill: the answer continues from its text, which
//!   the answer does not repeat (as Anthropic does).
//! - `max_tokens` is required (as Anthropic requires) except when counting tokens;
//!   `temperature` and `top_p` are in [0, 1].
//! - Errors are Anthropic's: `{"type": "error", "error": {"type", "message"}}` with its status
//!   codes (529 when overloaded).

mod blocks;
mod error;
pub mod events;
mod object;
#[cfg(test)]
mod tests;

pub use error::AnthropicError;
pub use object::{stop_reason, tool_input, Block, MessageObject, MessageUsage};

use crate::error::{Result, ServerError};
use crate::protocol::chat::AdmittedChat;
use crate::protocol::sampling::{max_tokens, SamplingFields};
use crate::protocol::wire::{from_value, parse_body, Count, Flag, Int, Num, Strings, Text};
use crate::tools::ToolChoice;
use blocks::{
    bad, chat_tool_choice, chat_tools, output_format, read_messages, rename, rename_stop,
    text_blocks,
};
use ferrum_tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};

/// Most messages per request.
pub const MAX_MESSAGES: usize = 4096;

/// A Messages body, as sent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct MessagesRequest {
    pub model: Option<Text>,
    pub messages: Option<Value>,
    pub system: Option<Value>,
    pub max_tokens: Option<Count>,
    pub stop_sequences: Option<Strings>,
    pub temperature: Option<Num>,
    pub top_p: Option<Num>,
    pub top_k: Option<Int>,
    pub stream: Option<Flag>,
    pub metadata: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
    /// `{"format": {"type": "json_schema", "schema": {...}}, "effort": ...}`: the format
    /// constrains the output; `effort` (a reasoning hint) has nothing to act on here.
    pub output_config: Option<Value>,
    pub container: Option<Value>,
    pub mcp_servers: Option<Value>,
    /// Ferrum's (and vLLM's) scheduling priority: lower first.
    pub priority: Option<Int>,
    /// Ferrum's service-level target and class (as on the OpenAI routes).
    pub slo: Option<crate::protocol::sampling::SloFields>,
    pub slo_class: Option<Text>,
}

impl MessagesRequest {
    pub fn from_body(body: &[u8]) -> Result<Self> {
        Self::from_json(&parse_body(body)?)
    }

    /// Reads a parsed body.
    pub fn from_json(v: &Value) -> Result<Self> {
        from_value(v)
    }

    /// Checks every rule and builds the chat request; `count` is for `count_tokens`, where
    /// `max_tokens` is not needed.
    pub fn admit(self, count: bool) -> Result<AdmittedChat> {
        if self.model.is_none() {
            return Err(bad("model", "model: Field required"));
        }
        if self.container.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ServerError::unsupported("container", "containers"));
        }
        if self.mcp_servers.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ServerError::unsupported("mcp_servers", "MCP servers"));
        }
        match self
            .thinking
            .as_ref()
            .filter(|v| !v.is_null())
            .map(|t| t.get("type").and_then(Value::as_str))
        {
            None | Some(Some("disabled")) => {}
            Some(_) => return Err(ServerError::unsupported("thinking", "extended thinking")),
        }
        let max = max_tokens("max_tokens", self.max_tokens)?;
        if max.is_none() && !count {
            return Err(bad("max_tokens", "max_tokens: Field required"));
        }
        for (key, v) in [("temperature", self.temperature), ("top_p", self.top_p)] {
            if let Some(Num(x)) = v {
                if !(0.0..=1.0).contains(&x) {
                    return Err(bad(key, format!("{key}: must be between 0 and 1, got {x}")));
                }
            }
        }
        if let Some(Int(k)) = self.top_k {
            if k < 0 {
                return Err(bad("top_k", format!("top_k: must be at least 0, got {k}")));
            }
        }
        if let Some(m) = &self.metadata {
            if !(m.is_null() || m.is_object()) {
                return Err(bad("metadata", "metadata: must be an object"));
            }
        }
        // `metadata.user_id` names the tenant, as `user` does on OpenAI's APIs.
        let user = match self.metadata.as_ref().and_then(|m| m.get("user_id")) {
            None | Some(Value::Null) => None,
            Some(Value::String(u)) => Some(Text(u.clone())),
            Some(_) => {
                return Err(bad(
                    "metadata.user_id",
                    "metadata.user_id: must be a string",
                ))
            }
        };
        let sampling = SamplingFields {
            model: self.model.clone(),
            user,
            priority: self.priority,
            slo: self.slo.clone(),
            slo_class: self.slo_class.clone(),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stream: self.stream,
            stop: self.stop_sequences.clone(),
            ..SamplingFields::default()
        };
        let mut opts = sampling.options(max).map_err(|e| rename_stop(rename(e)))?;
        opts.set_constraint(output_format(self.output_config.as_ref())?);
        let Some(messages) = self.messages.as_ref().filter(|v| !v.is_null()) else {
            return Err(bad("messages", "messages: Field required"));
        };
        let (mut messages, prefill) = read_messages(messages)?;
        if let Some(system) = self.system.as_ref().filter(|v| !v.is_null()) {
            messages.insert(
                0,
                ChatMessage::new("system", text_blocks(system, "system")?.as_str()),
            );
        }
        let tools = self
            .tools
            .as_ref()
            .filter(|v| !v.is_null())
            .map(chat_tools)
            .transpose()?;
        let (choice, parallel) = chat_tool_choice(self.tool_choice.as_ref())?;
        let tool_request =
            crate::tools::request::read(tools.as_ref(), choice.as_ref(), Some(&json!(parallel)))
                .map_err(rename)?
                .filter(|t| t.choice != ToolChoice::None);
        if let (Some(_), Some(p)) = (&tool_request, &opts.constraint_param) {
            return Err(bad(
                p.as_str(),
                format!(
                    "{p}: a response format and tool calls both constrain the output; give one"
                ),
            ));
        }
        // A grammar starts at the answer's first token, which follows the prefill: the two
        // would not make one valid whole.
        let constrained = tool_request.is_some() || opts.constraint_param.is_some();
        if constrained && prefill.as_deref().is_some_and(|p| !p.is_empty()) {
            return Err(bad(
                "messages",
                "messages: an assistant prefill cannot be combined with tools or output_config.format",
            ));
        }
        let template_tools = tools
            .filter(|t| !t.as_array().is_some_and(Vec::is_empty))
            .filter(|_| tool_request.is_some());
        Ok(AdmittedChat {
            opts,
            messages,
            tools: template_tools,
            tool_request,
            add_generation_prompt: true,
            prefill: prefill.filter(|p| !p.is_empty()),
            prompt_param: "messages",
            logprobs: false,
        })
    }
}
