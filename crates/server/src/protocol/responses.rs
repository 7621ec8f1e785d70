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

use super::chat::AdmittedChat;
use super::sampling::{max_tokens, SamplingFields};
use super::structured::StructuredFields;
use super::wire::{from_value, kind, parse_body, Count, Flag, Text};
use crate::error::{Result, ServerError};
use crate::tools::ToolChoice;
use ferrum_tokenizer::{ChatMessage, Content, FunctionCall, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

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

fn bad(param: impl Into<String>, msg: impl Into<String>) -> ServerError {
    ServerError::param(param, msg)
}

/// A string field of an item.
fn text_field(item: &Map<String, Value>, at: &str, key: &str) -> Result<String> {
    match item.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(bad(
            format!("{at}.{key}"),
            format!("'{at}.{key}' must be a string, got {}", kind(v)),
        )),
        None => Err(bad(
            format!("{at}.{key}"),
            format!("'{at}.{key}' is required"),
        )),
    }
}

/// A message's content: a string, or a list of text parts (`input_text`, `output_text`,
/// `text`, `refusal`).
fn content_text(v: Option<&Value>, at: &str) -> Result<String> {
    let at = format!("{at}.content");
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let pat = format!("{at}[{j}]");
                let Some(o) = p.as_object() else {
                    return Err(bad(
                        pat.clone(),
                        format!("'{pat}' must be an object, got {}", kind(p)),
                    ));
                };
                match o.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        text.push_str(&text_field(o, &pat, "text")?)
                    }
                    Some("refusal") => text.push_str(&text_field(o, &pat, "refusal")?),
                    Some(t @ ("input_image" | "input_file" | "input_audio")) => {
                        return Err(ServerError::unsupported(
                            &pat,
                            &format!("content of type '{t}'"),
                        ))
                    }
                    _ => {
                        return Err(bad(
                            pat.clone(),
                            format!(
                                "'{pat}' must be a part with type 'input_text' or 'output_text'"
                            ),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(v) => Err(bad(
            at.clone(),
            format!(
                "'{at}' must be a string or an array of text parts, got {}",
                kind(v)
            ),
        )),
        None => Err(bad(at.clone(), format!("'{at}' is required"))),
    }
}

/// `input` as chat messages.
fn read_input(v: &Value) -> Result<Vec<ChatMessage>> {
    let items = match v {
        Value::String(s) => return Ok(vec![ChatMessage::new("user", s.as_str())]),
        Value::Array(items) => items,
        v => {
            return Err(bad(
                "input",
                format!(
                    "'input' must be a string or an array of items, got {}",
                    kind(v)
                ),
            ))
        }
    };
    if items.is_empty() {
        return Err(bad("input", "'input' must not be empty"));
    }
    if items.len() > MAX_INPUT_ITEMS {
        return Err(bad(
            "input",
            format!(
                "'input' has {} items; at most {MAX_INPUT_ITEMS} are allowed",
                items.len()
            ),
        ));
    }
    let mut out: Vec<ChatMessage> = Vec::new();
    // call_id -> function name, for the tool messages that answer the calls.
    let mut names: Vec<(String, String)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Some(o) = item.as_object() else {
            return Err(bad(
                at.clone(),
                format!("'{at}' must be an object, got {}", kind(item)),
            ));
        };
        let ty = match o.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(t)) => t.as_str(),
            Some(v) => {
                return Err(bad(
                    format!("{at}.type"),
                    format!("'{at}.type' must be a string, got {}", kind(v)),
                ))
            }
        };
        match ty {
            "message" => {
                let role = match o.get("role").and_then(Value::as_str) {
                    Some(r @ ("user" | "system" | "assistant")) => r,
                    Some("developer") => "system",
                    _ => {
                        return Err(bad(
                            format!("{at}.role"),
                            format!("'{at}.role' must be user, system, developer or assistant"),
                        ))
                    }
                };
                let text = content_text(o.get("content"), &at)?;
                out.push(ChatMessage::new(role, text.as_str()));
            }
            "function_call" => {
                let call_id = text_field(o, &at, "call_id")?;
                let name = text_field(o, &at, "name")?;
                let arguments = text_field(o, &at, "arguments")?;
                names.push((call_id.clone(), name.clone()));
                let call = ToolCall {
                    id: call_id,
                    kind: "function".into(),
                    function: FunctionCall { name, arguments },
                };
                match out.last_mut() {
                    Some(m) if m.role == "assistant" => m.tool_calls.push(call),
                    _ => out.push(ChatMessage {
                        role: "assistant".into(),
                        content: Content::default(),
                        tool_calls: vec![call],
                        ..ChatMessage::default()
                    }),
                }
            }
            "function_call_output" => {
                let call_id = text_field(o, &at, "call_id")?;
                let output = match o.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(_)) => content_text(o.get("output"), &at)?,
                    Some(v) => {
                        return Err(bad(
                            format!("{at}.output"),
                            format!("'{at}.output' must be a string, got {}", kind(v)),
                        ))
                    }
                    None => {
                        return Err(bad(
                            format!("{at}.output"),
                            format!("'{at}.output' is required"),
                        ))
                    }
                };
                let name = names
                    .iter()
                    .rev()
                    .find(|(id, _)| *id == call_id)
                    .map(|(_, n)| n.clone());
                out.push(ChatMessage {
                    role: "tool".into(),
                    content: Content::Text(output),
                    tool_call_id: Some(call_id),
                    name,
                    ..ChatMessage::default()
                });
            }
            // A reasoning model's summary of its thinking: no model Ferrum runs reads it back.
            "reasoning" => {}
            "item_reference" => {
                return Err(ServerError::unsupported(
                    &at,
                    "'item_reference' (this server keeps no responses to refer to)",
                ))
            }
            other => {
                return Err(ServerError::unsupported(
                    &format!("{at}.type"),
                    &format!("input items of type '{other}'"),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(bad("input", "'input' has no message"));
    }
    Ok(out)
}

/// Responses `tools` in the chat API's shape (errors name the Responses paths).
fn chat_tools(v: &Value) -> Result<Value> {
    let Some(items) = v.as_array() else {
        return Err(bad("tools", "'tools' must be an array"));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, t) in items.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Some(o) = t.as_object() else {
            return Err(bad(at.clone(), format!("'{at}' must be an object")));
        };
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ServerError::unsupported(
                    &format!("{at}.type"),
                    &format!("tools of type '{other}' (only 'function' tools run here)"),
                ))
            }
            None => {
                return Err(bad(
                    format!("{at}.type"),
                    format!("'{at}.type' must be 'function'"),
                ))
            }
        }
        let mut f = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(v) = o.get(key) {
                f.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// Responses `tool_choice` in the chat API's shape.
fn chat_tool_choice(v: &Value) -> Result<Value> {
    match v {
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => match o.get("name") {
                Some(Value::String(n)) => Ok(json!({"type": "function", "function": {"name": n}})),
                _ => Err(bad(
                    "tool_choice.name",
                    "'tool_choice.name' must name a function",
                )),
            },
            Some(other) => Err(ServerError::unsupported(
                "tool_choice.type",
                &format!("a tool choice of type '{other}'"),
            )),
            None => Err(bad(
                "tool_choice",
                "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
            )),
        },
        v => Ok(v.clone()),
    }
}

/// A chat-path error renamed to the Responses API's parameter: `tools[0].function.name` is
/// `tools[0].name` there, `response_format` is `text.format`.
fn rename(e: ServerError, map: impl Fn(&str) -> String) -> ServerError {
    match e {
        ServerError::BadRequest { msg, param, code } => {
            let new = param.as_deref().map(&map);
            let msg = match (&param, &new) {
                (Some(old), Some(new)) => msg.replace(old.as_str(), new),
                _ => msg,
            };
            ServerError::BadRequest {
                msg,
                param: new,
                code,
            }
        }
        e => e,
    }
}

fn tool_path(p: &str) -> String {
    p.replace(".function.", ".")
        .replace("tool_choice.function.name", "tool_choice.name")
}

/// `text.format` read into the chat route's constraint fields.
fn text_format(text: Option<&Value>) -> Result<(StructuredFields, Value)> {
    let format = match text {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => o.get("format").filter(|f| !f.is_null()),
        Some(v) => {
            return Err(bad(
                "text",
                format!("'text' must be an object, got {}", kind(v)),
            ))
        }
    };
    let Some(format) = format else {
        return Ok((
            StructuredFields::default(),
            json!({"format": {"type": "text"}}),
        ));
    };
    let echo = json!({ "format": format });
    let ty = format.get("type").and_then(Value::as_str);
    let response_format = match ty {
        Some("text") => None,
        Some("json_object") => Some(json!({"type": "json_object"})),
        Some("json_schema") => {
            let mut js = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(key) {
                    js.insert(key.into(), v.clone());
                }
            }
            if !js.contains_key("schema") {
                return Err(bad(
                    "text.format.schema",
                    "'text.format.schema' is required for a 'json_schema' format",
                ));
            }
            Some(json!({"type": "json_schema", "json_schema": js}))
        }
        _ => {
            return Err(bad(
                "text.format.type",
                "'text.format.type' must be 'text', 'json_object' or 'json_schema'",
            ))
        }
    };
    Ok((
        StructuredFields {
            response_format,
            ..StructuredFields::default()
        },
        echo,
    ))
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

/// A `response` object, whole or as the stream's events carry it. Fields in alphabetical order.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub background: bool,
    pub created_at: u64,
    /// `{"code", "message"}` when the response failed.
    pub error: Option<Value>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use ferrum_types::StructuredOutput;

    fn admit(body: &str) -> Result<AdmittedResponse> {
        let r = ResponsesRequest::from_body(body.as_bytes())?;
        r.refuse_unsupported()?;
        r.admit()
    }

    fn param_of(e: ServerError) -> String {
        e.to_json()["error"]["param"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    #[test]
    fn input_items_become_messages() {
        let r = admit(
            r#"{"model":"m","instructions":"be brief","input":[
                {"role":"developer","content":"sys"},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"weather "},{"type":"input_text","text":"in Paris?"}]},
                {"type":"reasoning","id":"r1","summary":[]},
                {"type":"function_call","call_id":"c1","name":"get","arguments":"{\"city\":\"Paris\"}"},
                {"type":"function_call","call_id":"c2","name":"now","arguments":"{}"},
                {"type":"function_call_output","call_id":"c1","output":"sunny"},
                {"role":"assistant","content":[{"type":"output_text","text":"It is sunny."}]}],
                "max_output_tokens":7,"temperature":0.5,"stop":["x"],"seed":3,
                "tools":[{"type":"function","name":"get","parameters":{"type":"object"}},{"type":"function","name":"now"}],
                "tool_choice":{"type":"function","name":"get"},"parallel_tool_calls":false,"store":false}"#,
        )
        .unwrap();
        let m = &r.chat.messages;
        assert_eq!(m[0], ChatMessage::new("system", "be brief"));
        assert_eq!(m[1], ChatMessage::new("system", "sys"));
        assert_eq!(m[2].content.text(), "weather in Paris?");
        assert_eq!(m[3].role, "assistant");
        assert_eq!(m[3].tool_calls.len(), 2);
        assert_eq!(m[3].tool_calls[0].function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(m[4].role, "tool");
        assert_eq!(m[4].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(m[4].name.as_deref(), Some("get"));
        assert_eq!(m[5].content.text(), "It is sunny.");
        let p = &r.chat.opts.params;
        assert_eq!(p.max_tokens, Some(7));
        assert_eq!(p.stop, vec!["x".to_string()]);
        assert_eq!(p.seed, Some(3));
        let t = r.chat.tool_request.as_ref().unwrap();
        assert_eq!(t.choice, ToolChoice::Function("get".into()));
        assert!(!t.parallel);
        assert_eq!(r.chat.tools.as_ref().unwrap()[0]["function"]["name"], "get");
        assert_eq!(r.tool_choice["name"], "get");

        let r = admit(r#"{"input":"hi"}"#).unwrap();
        assert_eq!(r.chat.messages, vec![ChatMessage::new("user", "hi")]);
        assert_eq!(r.text["format"]["type"], "text");
        assert!(r.chat.tool_request.is_none());
    }

    #[test]
    fn text_format_constrains() {
        let r = admit(
            r#"{"input":"x","text":{"format":{"type":"json_schema","name":"p","schema":{"type":"object"},"strict":true}}}"#,
        )
        .unwrap();
        assert_eq!(
            r.chat.opts.params.structured,
            Some(StructuredOutput::JsonSchema(r#"{"type":"object"}"#.into()))
        );
        assert_eq!(r.chat.opts.constraint_param.as_deref(), Some("text.format"));
        let r = admit(r#"{"input":"x","text":{"format":{"type":"json_object"}}}"#).unwrap();
        assert_eq!(
            r.chat.opts.params.structured,
            Some(StructuredOutput::JsonObject)
        );
    }

    #[test]
    fn refusals_name_the_parameter() {
        for (body, param) in [
            (r#"{}"#, "input"),
            (r#"{"input":[]}"#, "input"),
            (r#"{"input":5}"#, "input"),
            (
                r#"{"input":"x","previous_response_id":"resp_1"}"#,
                "previous_response_id",
            ),
            (r#"{"input":"x","store":true}"#, "store"),
            (r#"{"input":"x","conversation":"c"}"#, "conversation"),
            (r#"{"input":"x","background":true}"#, "background"),
            (r#"{"input":"x","reasoning":{"effort":"low"}}"#, "reasoning"),
            (
                r#"{"input":"x","include":["message.output_text.logprobs"]}"#,
                "include",
            ),
            (r#"{"input":"x","truncation":"auto"}"#, "truncation"),
            (
                r#"{"input":"x","max_output_tokens":0}"#,
                "max_output_tokens",
            ),
            (
                r#"{"input":"x","max_output_tokens":"many"}"#,
                "max_output_tokens",
            ),
            (r#"{"input":"x","n":2}"#, "n"),
            (
                r#"{"input":[{"role":"robot","content":"x"}]}"#,
                "input[0].role",
            ),
            (
                r#"{"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}"#,
                "input[0].content[0]",
            ),
            (
                r#"{"input":[{"role":"user","content":[{"type":"input_text"}]}]}"#,
                "input[0].content[0].text",
            ),
            (r#"{"input":[{"role":"user"}]}"#, "input[0].content"),
            (
                r#"{"input":[{"type":"item_reference","id":"x"}]}"#,
                "input[0]",
            ),
            (r#"{"input":[{"type":"web_search_call"}]}"#, "input[0].type"),
            (
                r#"{"input":[{"type":"function_call","name":"f","arguments":"{}"}]}"#,
                "input[0].call_id",
            ),
            (
                r#"{"input":[{"type":"function_call_output","call_id":"c"}]}"#,
                "input[0].output",
            ),
            (
                r#"{"input":"x","tools":[{"type":"web_search"}]}"#,
                "tools[0].type",
            ),
            (
                r#"{"input":"x","tools":[{"type":"function","name":"bad name"}]}"#,
                "tools[0].name",
            ),
            (
                r#"{"input":"x","tools":[{"type":"function","name":"f","parameters":3}]}"#,
                "tools[0].parameters",
            ),
            (
                r#"{"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}}"#,
                "tool_choice",
            ),
            (
                r#"{"input":"x","text":{"format":{"type":"yaml"}}}"#,
                "text.format.type",
            ),
            (
                r#"{"input":"x","text":{"format":{"type":"json_schema","name":"n"}}}"#,
                "text.format.schema",
            ),
            (r#"{"input":"x","temperature":"hot"}"#, "temperature"),
        ] {
            let e = admit(body).expect_err(body);
            assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(param_of(e), param, "{body}");
        }
    }
}
