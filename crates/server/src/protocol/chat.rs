//! `/v1/chat/completions` bodies: [`ChatCompletionRequest`] as sent, then admitted into an
//! [`AdmittedChat`] (sampling parameters built, messages as the chat template takes them).
//!
//! Invariants:
//! - Every field of OpenAI's chat API that Ferrum knows is parsed and carried, including
//!   `tools`, `response_format`, assistant `tool_calls` and `tool` messages, so later features
//!   build on the types; [`ChatCompletionRequest::refuse_unsupported`] refuses what the server
//!   cannot serve yet with a 400 naming the parameter (the routes call it before admitting).
//! - A message's content reaches the template as text parts or a string; `developer` is the
//!   template's `system`; an assistant message without content has empty content.

use super::sampling::{max_tokens, SamplingFields};
use super::structured::StructuredFields;
use super::unsupported::refuse;
use super::wire::{from_value, parse_body, Count, Flag, List, Text};
use super::Options;
use crate::error::{Result, ServerError};
use crate::tools::{ToolChoice, ToolRequest};
use ferrum_tokenizer::{ChatMessage, Content, ContentPart, FunctionCall, ToolCall};
use ferrum_types::MAX_LOGPROBS;
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::fmt;

/// A chat completions body, as sent: the shared sampling fields and the chat fields, each a
/// derived type read from the same body (not one struct with `#[serde(flatten)]`, which
/// would lose the field paths that errors name).
#[derive(Debug, Clone, Default)]
pub struct ChatCompletionRequest {
    pub sampling: SamplingFields,
    pub chat: ChatFields,
    pub structured: StructuredFields,
}

/// The fields only the chat endpoint has.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct ChatFields {
    pub messages: Option<List<ChatCompletionMessage>>,
    /// Takes precedence over `max_tokens`.
    pub max_completion_tokens: Option<Count>,
    pub max_tokens: Option<Count>,
    pub logprobs: Option<Flag>,
    pub top_logprobs: Option<Count>,
    pub add_generation_prompt: Option<Flag>,
    /// vLLM's: continue the last (assistant) message rather than answer after it. A last
    /// assistant message is continued anyway, as llama-server does, unless this is false.
    pub continue_final_message: Option<Flag>,
    /// OpenAI's tool definitions, passed to the chat template as `tools`.
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    pub audio: Option<Value>,
    pub modalities: Option<Value>,
    pub prediction: Option<Value>,
    pub web_search_options: Option<Value>,
    pub reasoning_effort: Option<Value>,
}

/// One message, as sent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct ChatCompletionMessage {
    pub role: Option<Text>,
    pub content: Option<MessageContent>,
    pub tool_calls: Option<List<ToolCallIn>>,
    pub tool_call_id: Option<Text>,
    pub name: Option<Text>,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Clone, PartialEq)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPartIn>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MessageContent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of text parts")
            }
            fn visit_str<E: serde::de::Error>(
                self,
                s: &str,
            ) -> std::result::Result<Self::Value, E> {
                Ok(MessageContent::Text(s.to_string()))
            }
            fn visit_string<E: serde::de::Error>(
                self,
                s: String,
            ) -> std::result::Result<Self::Value, E> {
                Ok(MessageContent::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut parts = Vec::new();
                while let Some(p) = seq.next_element()? {
                    parts.push(p);
                }
                Ok(MessageContent::Parts(parts))
            }
        }
        d.deserialize_any(V)
    }
}

/// One part of a message's content, as sent (`{"type": "text", "text": ...}`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(expecting = "an object")]
pub struct ContentPartIn {
    #[serde(rename = "type")]
    pub kind: Option<Text>,
    pub text: Option<Text>,
}

/// Part types OpenAI has and Ferrum does not read yet.
const UNSUPPORTED_PARTS: &[&str] = &["image_url", "input_audio", "file", "refusal"];

/// An assistant's tool call, as sent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct ToolCallIn {
    pub id: Option<Text>,
    #[serde(rename = "type")]
    pub kind: Option<Text>,
    pub function: Option<FunctionCallIn>,
}

/// The function of a tool call: its name and arguments (a JSON text).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct FunctionCallIn {
    pub name: Option<Text>,
    pub arguments: Option<Text>,
}

/// A chat request ready for the template and the engine.
#[derive(Debug, Clone)]
pub struct AdmittedChat {
    pub opts: Options,
    pub messages: Vec<ChatMessage>,
    /// The template's `tools`: a non-empty array, or `None`.
    pub tools: Option<Value>,
    /// The request's tools, choice and parallelism, unless it has no tools or
    /// `tool_choice: "none"`.
    pub tool_request: Option<ToolRequest>,
    pub add_generation_prompt: bool,
    /// Text the answer continues from, after the rendered conversation: a last message from
    /// the assistant (Anthropic's assistant prefill; on chat completions vLLM's
    /// `continue_final_message` and llama-server's habit).
    pub prefill: Option<String>,
    /// The parameter a prompt longer than the context is blamed on (`messages`, `input`).
    pub prompt_param: &'static str,
    /// `logprobs: true`: the sampled token's logprob per token, with `top_logprobs` more.
    pub logprobs: bool,
}

/// Features of the chat API that Ferrum does not have (key, what it is).
const UNSUPPORTED_CHAT: &[(&str, &str)] = &[
    (
        "functions",
        "function calling (the legacy API; use 'tools')",
    ),
    ("function_call", "function calling"),
    ("audio", "audio output"),
    ("modalities", "output modalities other than text"),
    ("prediction", "predicted outputs"),
    ("web_search_options", "web search"),
    ("reasoning_effort", "reasoning effort"),
];

impl ChatCompletionRequest {
    /// Reads a body (see [`super::wire`]): types checked, nothing else.
    pub fn from_body(body: &[u8]) -> Result<Self> {
        Self::from_json(&parse_body(body)?)
    }

    /// Reads a parsed body.
    pub fn from_json(body: &Value) -> Result<Self> {
        Ok(ChatCompletionRequest {
            sampling: from_value(body)?,
            chat: from_value(body)?,
            structured: from_value(body)?,
        })
    }

    /// The 400 for the first feature asked for that this server does not serve yet (tools,
    /// structured output, tool messages, non-text content, ...).
    pub fn refuse_unsupported(&self) -> Result<()> {
        let c = &self.chat;
        refuse(UNSUPPORTED_CHAT, |key| match key {
            "functions" => c.functions.as_ref(),
            "function_call" => c.function_call.as_ref(),
            "audio" => c.audio.as_ref(),
            "modalities" => c.modalities.as_ref(),
            "prediction" => c.prediction.as_ref(),
            "web_search_options" => c.web_search_options.as_ref(),
            "reasoning_effort" => c.reasoning_effort.as_ref(),
            _ => None,
        })?;
        let messages = c.messages.as_ref().map_or(&[][..], |List(m)| m);
        for (i, m) in messages.iter().enumerate() {
            if let Some(Text(r)) = &m.role {
                if r == "function" {
                    return Err(ServerError::unsupported(
                        &format!("messages[{i}].role"),
                        "the 'function' role (the legacy API; use 'tool')",
                    ));
                }
            }
            if let Some(MessageContent::Parts(parts)) = &m.content {
                for (j, p) in parts.iter().enumerate() {
                    if let Some(Text(t)) = &p.kind {
                        if UNSUPPORTED_PARTS.contains(&t.as_str()) {
                            return Err(ServerError::unsupported(
                                &format!("messages[{i}].content[{j}]"),
                                &format!("content of type '{t}'"),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks every rule and builds the request the template and engine take.
    pub fn admit(self) -> Result<AdmittedChat> {
        let c = self.chat;
        let max = match max_tokens("max_completion_tokens", c.max_completion_tokens)? {
            Some(m) => Some(m),
            None => max_tokens("max_tokens", c.max_tokens)?,
        };
        let mut opts = self.sampling.options(max)?;
        opts.set_constraint(self.structured.constraint()?);
        let logprobs = c.logprobs.is_some_and(|Flag(b)| b);
        if let Some(Count(k)) = c.top_logprobs {
            if k > MAX_LOGPROBS {
                return Err(ServerError::param(
                    "top_logprobs",
                    format!("'top_logprobs' must be between 0 and {MAX_LOGPROBS}, got {k}"),
                ));
            }
            if !logprobs {
                return Err(ServerError::param(
                    "top_logprobs",
                    "'top_logprobs' needs 'logprobs' set to true",
                ));
            }
        }
        if logprobs {
            opts.params.logprobs = Some(c.top_logprobs.map_or(0, |Count(k)| k));
        }
        let Some(List(items)) = c.messages else {
            return Err(ServerError::param("messages", "'messages' is required"));
        };
        if items.is_empty() {
            return Err(ServerError::param(
                "messages",
                "'messages' must not be empty",
            ));
        }
        let messages = items
            .into_iter()
            .enumerate()
            .map(|(i, m)| admit_message(i, m))
            .collect::<Result<_>>()?;
        let tool_request = crate::tools::request::read(
            c.tools.as_ref(),
            c.tool_choice.as_ref(),
            c.parallel_tool_calls.as_ref(),
        )?
        .filter(|t| t.choice != ToolChoice::None);
        if let (Some(_), Some(p)) = (&tool_request, &opts.constraint_param) {
            return Err(ServerError::param(
                p.as_str(),
                format!("'{p}' and tool calls both constrain the output; give one (or tool_choice 'none')"),
            ));
        }
        let (messages, prefill) = continuation(
            messages,
            c.continue_final_message.map(|Flag(b)| b),
            c.add_generation_prompt.map(|Flag(b)| b),
            tool_request.is_some() || opts.constraint_param.is_some(),
        )?;
        // `tool_choice: "none"`: the template does not see the tools either.
        let tools = c
            .tools
            .filter(|t| !t.as_array().is_some_and(Vec::is_empty))
            .filter(|_| tool_request.is_some());
        Ok(AdmittedChat {
            opts,
            messages,
            tools,
            tool_request,
            // A continued message follows the assistant's header, which the generation
            // prompt writes.
            add_generation_prompt: prefill.is_some()
                || c.add_generation_prompt.is_none_or(|Flag(b)| b),
            prefill,
            prompt_param: "messages",
            logprobs,
        })
    }
}

/// Whether the answer continues the last message, and then the conversation without it and
/// the text it continues from. A last assistant message (with text, without tool calls) is
/// continued unless `continue_final_message` is false (llama-server continues it; vLLM asks
/// for `continue_final_message: true` with `add_generation_prompt: false`).
fn continuation(
    mut messages: Vec<ChatMessage>,
    continue_final: Option<bool>,
    add_generation_prompt: Option<bool>,
    constrained: bool,
) -> Result<(Vec<ChatMessage>, Option<String>)> {
    let param = "continue_final_message";
    let last_continues = messages
        .last()
        .is_some_and(|m| m.role == "assistant" && m.tool_calls.is_empty());
    if continue_final == Some(true) {
        if add_generation_prompt == Some(true) {
            return Err(ServerError::param(
                param,
                "'continue_final_message' continues the last message; it cannot be combined \
                 with 'add_generation_prompt': true",
            ));
        }
        if !last_continues {
            return Err(ServerError::param(
                param,
                "'continue_final_message' needs a last message from the assistant, without \
                 tool calls",
            ));
        }
    }
    if !last_continues || continue_final == Some(false) {
        return Ok((messages, None));
    }
    let Some(last) = messages.pop() else {
        return Ok((messages, None));
    };
    let text = last.content.text();
    // A grammar starts at the answer's first token, which would follow the continued text:
    // the two would not make one valid whole.
    if constrained && !text.is_empty() {
        return Err(ServerError::param(
            "messages",
            "continuing a last assistant message cannot be combined with tools or a \
             response format",
        ));
    }
    Ok((messages, Some(text)))
}

fn admit_message(i: usize, m: ChatCompletionMessage) -> Result<ChatMessage> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let role = match m.role.as_ref().map(|Text(r)| r.as_str()) {
        Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
        // OpenAI's newer name for the system role; templates only know "system".
        Some("developer") => "system",
        Some(r) => {
            return Err(ServerError::param(
                at("role"),
                format!(
                    "'{}' must be system, developer, user or assistant, got {r:?}",
                    at("role")
                ),
            ))
        }
        None => {
            return Err(ServerError::param(
                at("role"),
                format!("'{}' is required and must be a string", at("role")),
            ))
        }
    };
    let content = match m.content {
        Some(MessageContent::Text(s)) => Content::Text(s),
        None if role == "assistant" => Content::default(),
        None => {
            return Err(ServerError::param(
                at("content"),
                format!("'{}' is required", at("content")),
            ))
        }
        Some(MessageContent::Parts(parts)) => Content::Parts(
            parts
                .into_iter()
                .enumerate()
                .map(|(j, p)| {
                    let field = at(&format!("content[{j}]"));
                    match (p.kind, p.text) {
                        (Some(Text(k)), Some(Text(text))) if k == "text" => {
                            Ok(ContentPart::Text { text })
                        }
                        (Some(Text(k)), None) if k == "text" => Err(ServerError::param(
                            field.clone(),
                            format!("'{field}.text' must be a string"),
                        )),
                        _ => Err(ServerError::param(
                            field.clone(),
                            format!("'{field}' must be a part with type 'text'"),
                        )),
                    }
                })
                .collect::<Result<_>>()?,
        ),
    };
    let tool_calls = m
        .tool_calls
        .map_or_else(Vec::new, |List(c)| c)
        .into_iter()
        .enumerate()
        .map(|(j, c)| admit_tool_call(&at(&format!("tool_calls[{j}]")), c))
        .collect::<Result<_>>()?;
    let is_tool = role == "tool";
    Ok(ChatMessage {
        role: role.to_string(),
        content,
        tool_calls,
        tool_call_id: m.tool_call_id.filter(|_| is_tool).map(|Text(t)| t),
        // Only a tool answer's `name` reaches the template, as before tools were carried.
        name: m.name.filter(|_| is_tool).map(|Text(t)| t),
    })
}

fn admit_tool_call(at: &str, c: ToolCallIn) -> Result<ToolCall> {
    let Some(f) = c.function else {
        return Err(ServerError::param(
            format!("{at}.function"),
            format!("'{at}.function' is required"),
        ));
    };
    let Some(Text(name)) = f.name else {
        return Err(ServerError::param(
            format!("{at}.function.name"),
            format!("'{at}.function.name' is required"),
        ));
    };
    Ok(ToolCall {
        id: c.id.map(|Text(t)| t).unwrap_or_default(),
        kind: c.kind.map_or_else(|| "function".to_string(), |Text(t)| t),
        function: FunctionCall {
            name,
            arguments: f.arguments.map(|Text(t)| t).unwrap_or_default(),
        },
    })
}
