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

use super::chat::AdmittedChat;
use super::sampling::{max_tokens, SamplingFields};
use super::structured::{Constraint, StructuredFields};
use super::wire::{from_value, kind, parse_body, Count, Flag, Int, Num, Strings, Text};
use crate::error::{Result, ServerError};
use crate::tools::ToolChoice;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ferrum_tokenizer::{ChatMessage, Content, FunctionCall, ToolCall};
use ferrum_types::FinishReason;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

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
}

fn bad(param: impl Into<String>, msg: impl Into<String>) -> ServerError {
    ServerError::param(param, msg)
}

fn string_field(o: &Map<String, Value>, at: &str, key: &str) -> Result<String> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(bad(
            format!("{at}.{key}"),
            format!("{at}.{key}: must be a string, got {}", kind(v)),
        )),
        None => Err(bad(
            format!("{at}.{key}"),
            format!("{at}.{key}: Field required"),
        )),
    }
}

/// Text of a string or a list of `text` blocks (`system`, a `tool_result`'s content).
fn text_blocks(v: &Value, at: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let bat = format!("{at}[{j}]");
                let Some(o) = b.as_object() else {
                    return Err(bad(bat.clone(), format!("{bat}: must be an object")));
                };
                match o.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(&string_field(o, &bat, "text")?),
                    Some(t @ ("image" | "document" | "search_result")) => {
                        return Err(ServerError::unsupported(
                            &bat,
                            &format!("content blocks of type '{t}'"),
                        ))
                    }
                    _ => {
                        return Err(bad(
                            format!("{bat}.type"),
                            format!("{bat}.type: must be 'text'"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        v => Err(bad(
            at,
            format!(
                "{at}: must be a string or a list of text blocks, got {}",
                kind(v)
            ),
        )),
    }
}

/// `messages` as chat messages, and the assistant prefill when the last message is one.
fn read_messages(v: &Value) -> Result<(Vec<ChatMessage>, Option<String>)> {
    let Some(items) = v.as_array() else {
        return Err(bad(
            "messages",
            format!("messages: must be a list, got {}", kind(v)),
        ));
    };
    if items.is_empty() {
        return Err(bad(
            "messages",
            "messages: at least one message is required",
        ));
    }
    if items.len() > MAX_MESSAGES {
        return Err(bad(
            "messages",
            format!("messages: at most {MAX_MESSAGES} messages are allowed"),
        ));
    }
    let mut out = Vec::new();
    let mut prefill = None;
    for (i, m) in items.iter().enumerate() {
        let at = format!("messages.{i}");
        let Some(o) = m.as_object() else {
            return Err(bad(at.clone(), format!("{at}: must be an object")));
        };
        let role = match o.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant")) => r,
            _ => {
                return Err(bad(
                    format!("{at}.role"),
                    format!("{at}.role: must be 'user' or 'assistant'"),
                ))
            }
        };
        let blocks: Vec<Value> = match o.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(b)) => b.clone(),
            Some(v) => {
                return Err(bad(
                    format!("{at}.content"),
                    format!(
                        "{at}.content: must be a string or a list of blocks, got {}",
                        kind(v)
                    ),
                ))
            }
            None => {
                return Err(bad(
                    format!("{at}.content"),
                    format!("{at}.content: Field required"),
                ))
            }
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let bat = format!("{at}.content.{j}");
            let Some(bo) = b.as_object() else {
                return Err(bad(bat.clone(), format!("{bat}: must be an object")));
            };
            match (bo.get("type").and_then(Value::as_str), role) {
                (Some("text"), _) => text.push_str(&string_field(bo, &bat, "text")?),
                (Some("tool_use"), "assistant") => {
                    let input = match bo.get("input") {
                        Some(v @ Value::Object(_)) => v.to_string(),
                        _ => {
                            return Err(bad(
                                format!("{bat}.input"),
                                format!("{bat}.input: must be an object"),
                            ))
                        }
                    };
                    calls.push(ToolCall {
                        id: string_field(bo, &bat, "id")?,
                        kind: "function".into(),
                        function: FunctionCall {
                            name: string_field(bo, &bat, "name")?,
                            arguments: input,
                        },
                    });
                }
                (Some("tool_result"), "user") => {
                    let id = string_field(bo, &bat, "tool_use_id")?;
                    let content = match bo.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(c) => text_blocks(c, &format!("{bat}.content"))?,
                    };
                    let name = out.iter().rev().find_map(|m: &ChatMessage| {
                        m.tool_calls
                            .iter()
                            .find(|c| c.id == id)
                            .map(|c| c.function.name.clone())
                    });
                    out.push(ChatMessage {
                        role: "tool".into(),
                        content: Content::Text(content),
                        tool_call_id: Some(id),
                        name,
                        ..ChatMessage::default()
                    });
                }
                (Some("thinking" | "redacted_thinking"), "assistant") => {}
                (Some(t @ ("tool_use" | "tool_result" | "thinking" | "redacted_thinking")), r) => {
                    return Err(bad(
                        format!("{bat}.type"),
                        format!("{bat}: a '{t}' block cannot be in a '{r}' message"),
                    ))
                }
                (Some(t), _) => {
                    return Err(ServerError::unsupported(
                        &bat,
                        &format!("content blocks of type '{t}'"),
                    ))
                }
                (None, _) => {
                    return Err(bad(
                        format!("{bat}.type"),
                        format!("{bat}.type: Field required"),
                    ))
                }
            }
        }
        let last = i + 1 == items.len();
        if role == "assistant" && last && calls.is_empty() {
            prefill = Some(text);
            continue;
        }
        if role == "user" && text.is_empty() && out.last().is_some_and(|m| m.role == "tool") {
            continue;
        }
        out.push(ChatMessage {
            role: role.into(),
            content: Content::Text(text),
            tool_calls: calls,
            ..ChatMessage::default()
        });
    }
    Ok((out, prefill))
}

/// Anthropic `tools` in the chat API's shape (errors name Anthropic's paths).
fn chat_tools(v: &Value) -> Result<Value> {
    let Some(items) = v.as_array() else {
        return Err(bad("tools", "tools: must be a list"));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, t) in items.iter().enumerate() {
        let at = format!("tools.{i}");
        let Some(o) = t.as_object() else {
            return Err(bad(at.clone(), format!("{at}: must be an object")));
        };
        match o.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                return Err(ServerError::unsupported(
                    &format!("{at}.type"),
                    &format!("server tools such as '{other}' (only client tools run here)"),
                ))
            }
        }
        let mut f = Map::new();
        for (from, to) in [
            ("name", "name"),
            ("description", "description"),
            ("input_schema", "parameters"),
        ] {
            if let Some(v) = o.get(from) {
                f.insert(to.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// Anthropic `tool_choice` as the chat API's, and whether calls may be parallel.
fn chat_tool_choice(v: Option<&Value>) -> Result<(Option<Value>, bool)> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok((None, true));
    };
    let Some(o) = v.as_object() else {
        return Err(bad("tool_choice", "tool_choice: must be an object"));
    };
    let parallel = !o
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let choice = match o.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match o.get("name") {
            Some(Value::String(n)) => json!({"type": "function", "function": {"name": n}}),
            _ => return Err(bad("tool_choice.name", "tool_choice.name: Field required")),
        },
        _ => {
            return Err(bad(
                "tool_choice.type",
                "tool_choice.type: must be 'auto', 'any', 'tool' or 'none'",
            ))
        }
    };
    Ok((Some(choice), parallel))
}

/// A chat-path error with Anthropic's parameter names.
fn rename(e: ServerError) -> ServerError {
    match e {
        ServerError::BadRequest { msg, param, code } => {
            let fix = |s: &str| {
                let mut s = s.replace(".function.parameters", ".input_schema");
                s = s.replace(".function.", ".");
                // tools[3] -> tools.3, as Anthropic writes paths.
                if let Some(start) = s.find("tools[") {
                    if let Some(end) = s[start..].find(']') {
                        let n = s[start + 6..start + end].to_string();
                        s.replace_range(start..start + end + 1, &format!("tools.{n}"));
                    }
                }
                s
            };
            ServerError::BadRequest {
                msg: fix(&msg),
                param: param.as_deref().map(fix),
                code,
            }
        }
        e => e,
    }
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
        let sampling = SamplingFields {
            model: self.model.clone(),
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
        if tool_request.is_some() && prefill.as_deref().is_some_and(|p| !p.is_empty()) {
            return Err(bad(
                "messages",
                "messages: an assistant prefill cannot be combined with tools",
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
            logprobs: false,
        })
    }
}

/// `output_config.format` as the request's constraint.
fn output_format(config: Option<&Value>) -> Result<Option<Constraint>> {
    const AT: &str = "output_config.format";
    let format = match config.filter(|v| !v.is_null()) {
        None => return Ok(None),
        Some(Value::Object(o)) => match o.get("format").filter(|v| !v.is_null()) {
            None => return Ok(None),
            Some(f) => f,
        },
        Some(v) => {
            return Err(bad(
                "output_config",
                format!("output_config: must be an object, got {}", kind(v)),
            ))
        }
    };
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Err(bad(
            format!("{AT}.type"),
            format!("{AT}.type: must be 'json_schema'"),
        ));
    }
    let Some(schema) = format.get("schema").filter(|v| v.is_object()) else {
        return Err(bad(
            format!("{AT}.schema"),
            format!("{AT}.schema: must be a JSON schema object"),
        ));
    };
    let fields = StructuredFields {
        json_schema: Some(schema.clone()),
        ..StructuredFields::default()
    };
    Ok(fields
        .constraint()
        .map_err(|e| match e {
            ServerError::BadRequest { msg, code, .. } => ServerError::BadRequest {
                msg: msg.replace("'json_schema'", "output_config.format.schema"),
                param: Some(format!("{AT}.schema")),
                code,
            },
            e => e,
        })?
        .map(|c| Constraint {
            spec: c.spec,
            param: AT.into(),
        }))
}

/// `stop` errors name `stop_sequences`.
fn rename_stop(e: ServerError) -> ServerError {
    match e {
        ServerError::BadRequest {
            msg,
            param: Some(p),
            code,
        } if p == "stop" => ServerError::BadRequest {
            msg: msg
                .replace("'stop'", "stop_sequences")
                .replace("stop strings", "stop sequences"),
            param: Some("stop_sequences".into()),
            code,
        },
        e => e,
    }
}

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

/// `stop_reason` and `stop_sequence` of a finish (`tool_use` when the answer made calls).
pub fn stop_reason(f: Option<&FinishReason>, has_calls: bool) -> (&'static str, Option<String>) {
    match f {
        _ if has_calls => ("tool_use", None),
        Some(FinishReason::StopString(s)) => ("stop_sequence", Some(s.clone())),
        Some(FinishReason::MaxTokens | FinishReason::MaxModelLen) => ("max_tokens", None),
        _ => ("end_turn", None),
    }
}

/// A call's arguments as the `input` object (a JSON text that does not parse stays a string).
pub fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}

/// A [`ServerError`] in Anthropic's shape and statuses.
#[derive(Debug)]
pub struct AnthropicError(pub ServerError);

impl From<ServerError> for AnthropicError {
    fn from(e: ServerError) -> Self {
        AnthropicError(e)
    }
}

impl AnthropicError {
    /// Status and error type as Anthropic's API answers them.
    pub fn status_and_type(&self) -> (StatusCode, &'static str) {
        match &self.0 {
            ServerError::BadRequest { .. } | ServerError::MethodNotAllowed(_) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error")
            }
            ServerError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "authentication_error"),
            ServerError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found_error"),
            ServerError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
            ServerError::Overloaded(_) => (
                StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                "overloaded_error",
            ),
            ServerError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "api_error"),
            ServerError::Internal(_) | ServerError::Io(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "api_error")
            }
        }
    }

    /// `{"type": "error", "error": {"type", "message"}}`.
    pub fn body(&self) -> Value {
        let (_, kind) = self.status_and_type();
        json!({"type": "error", "error": {"type": kind, "message": self.0.to_string()}})
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let (status, _) = self.status_and_type();
        let mut r = crate::json::json_response(status, &self.body());
        if matches!(self.0, ServerError::Overloaded(_)) {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(crate::error::RETRY_AFTER_SECS),
            );
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(body: &str) -> Result<AdmittedChat> {
        MessagesRequest::from_body(body.as_bytes())?.admit(false)
    }

    #[test]
    fn messages_become_chat_messages() {
        let r = admit(
            r#"{"model":"m","max_tokens":9,"system":[{"type":"text","text":"be "},{"type":"text","text":"brief"}],
                "messages":[{"role":"user","content":"weather?"},
                {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Let me look."},
                    {"type":"tool_use","id":"t1","name":"get","input":{"city":"Paris"}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"sunny"}]},{"type":"text","text":"thanks"}]}],
                "stop_sequences":["END"],"temperature":0.5,"top_k":4,
                "tools":[{"name":"get","description":"d","input_schema":{"type":"object"}}],
                "tool_choice":{"type":"any","disable_parallel_tool_use":true}}"#,
        )
        .unwrap();
        let m = &r.messages;
        assert_eq!(m[0], ChatMessage::new("system", "be brief"));
        assert_eq!(m[1], ChatMessage::new("user", "weather?"));
        assert_eq!(m[2].content.text(), "Let me look.");
        assert_eq!(m[2].tool_calls[0].function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(m[3].role, "tool");
        assert_eq!(m[3].name.as_deref(), Some("get"));
        assert_eq!(m[3].content.text(), "sunny");
        assert_eq!(m[4], ChatMessage::new("user", "thanks"));
        assert_eq!(r.opts.params.max_tokens, Some(9));
        assert_eq!(r.opts.params.stop, vec!["END".to_string()]);
        assert_eq!(r.opts.params.top_k, Some(4));
        let t = r.tool_request.unwrap();
        assert_eq!(t.choice, ToolChoice::Required);
        assert!(!t.parallel);
        assert_eq!(
            r.tools.unwrap()[0]["function"]["parameters"]["type"],
            "object"
        );
    }

    #[test]
    fn output_config_format_constrains() {
        let r = admit(
            r#"{"model":"m","max_tokens":5,"output_config":{"effort":"low","format":{"type":"json_schema","schema":{"type":"object"}}},"messages":[{"role":"user","content":"x"}]}"#,
        )
        .unwrap();
        assert_eq!(
            r.opts.params.structured,
            Some(ferrum_types::StructuredOutput::JsonSchema(
                r#"{"type":"object"}"#.into()
            ))
        );
        assert_eq!(
            r.opts.constraint_param.as_deref(),
            Some("output_config.format")
        );
    }

    #[test]
    fn a_last_assistant_message_is_a_prefill() {
        let r = admit(
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"Name a color."},{"role":"assistant","content":"The color is"}]}"#,
        )
        .unwrap();
        assert_eq!(r.messages.len(), 1);
        assert_eq!(r.prefill.as_deref(), Some("The color is"));
    }

    #[test]
    fn errors_name_the_parameter() {
        for (body, param) in [
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
                "max_tokens",
            ),
            (
                r#"{"max_tokens":3,"messages":[{"role":"user","content":"x"}]}"#,
                "model",
            ),
            (r#"{"model":"m","max_tokens":3}"#, "messages"),
            (r#"{"model":"m","max_tokens":3,"messages":[]}"#, "messages"),
            (
                r#"{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","max_tokens":3,"temperature":1.5,"messages":[{"role":"user","content":"x"}]}"#,
                "temperature",
            ),
            (
                r#"{"model":"m","max_tokens":3,"top_k":-2,"messages":[{"role":"user","content":"x"}]}"#,
                "top_k",
            ),
            (
                r#"{"model":"m","max_tokens":3,"messages":[{"role":"system","content":"x"}]}"#,
                "messages.0.role",
            ),
            (
                r#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":5}]}"#,
                "messages.0.content",
            ),
            (
                r#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}"#,
                "messages.0.content.0",
            ),
            (
                r#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}"#,
                "messages.0.content.0.type",
            ),
            (
                r#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
                "messages.0.content.0.text",
            ),
            (
                r#"{"model":"m","max_tokens":3,"stop_sequences":[""],"messages":[{"role":"user","content":"x"}]}"#,
                "stop_sequences",
            ),
            (
                r#"{"model":"m","max_tokens":3,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"x"}]}"#,
                "thinking",
            ),
            (
                r#"{"model":"m","max_tokens":3,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"x"}]}"#,
                "tools.0.type",
            ),
            (
                r#"{"model":"m","max_tokens":3,"tools":[{"name":"bad name"}],"messages":[{"role":"user","content":"x"}]}"#,
                "tools.0.name",
            ),
            (
                r#"{"model":"m","max_tokens":3,"tools":[{"name":"f","input_schema":3}],"messages":[{"role":"user","content":"x"}]}"#,
                "tools.0.input_schema",
            ),
            (
                r#"{"model":"m","max_tokens":3,"tools":[{"name":"f"}],"tool_choice":{"type":"tool"},"messages":[{"role":"user","content":"x"}]}"#,
                "tool_choice.name",
            ),
            (
                r#"{"model":"m","max_tokens":3,"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"x"}]}"#,
                "tool_choice",
            ),
        ] {
            let e = admit(body).expect_err(body);
            let ae = AnthropicError(e);
            assert_eq!(ae.status_and_type().0, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(ae.body()["error"]["type"], "invalid_request_error");
            assert_eq!(ae.0.to_json()["error"]["param"], param, "{body}");
        }
        // Counting needs no max_tokens.
        let r = MessagesRequest::from_body(
            br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
        )
        .unwrap()
        .admit(true)
        .unwrap();
        assert_eq!(r.opts.params.max_tokens, None);
        let e = AnthropicError(ServerError::Overloaded("full".into()));
        assert_eq!(
            e.status_and_type(),
            (StatusCode::from_u16(529).unwrap(), "overloaded_error")
        );
    }
}
