//! A Messages body's parts in the chat path's terms: content blocks as messages (and the
//! prefill), client tools and `tool_choice` in the chat API's shape, `output_config.format` as
//! the constraint; errors name Anthropic's paths (`messages.0.content.1`).

use super::MAX_MESSAGES;
use crate::error::{Result, ServerError};
use crate::protocol::structured::{Constraint, StructuredFields};
use crate::protocol::wire::kind;
use ferrum_tokenizer::{ChatMessage, Content, FunctionCall, ToolCall};
use serde_json::{json, Map, Value};

pub(super) fn bad(param: impl Into<String>, msg: impl Into<String>) -> ServerError {
    ServerError::param(param, msg)
}

pub(super) fn string_field(o: &Map<String, Value>, at: &str, key: &str) -> Result<String> {
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
pub(super) fn text_blocks(v: &Value, at: &str) -> Result<String> {
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
pub(super) fn read_messages(v: &Value) -> Result<(Vec<ChatMessage>, Option<String>)> {
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
pub(super) fn chat_tools(v: &Value) -> Result<Value> {
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
pub(super) fn chat_tool_choice(v: Option<&Value>) -> Result<(Option<Value>, bool)> {
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
pub(super) fn rename(e: ServerError) -> ServerError {
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
    e.rename_bad_request(|msg, param| (fix(&msg), param.as_deref().map(fix)))
}

/// `output_config.format` as the request's constraint.
pub(super) fn output_format(config: Option<&Value>) -> Result<Option<Constraint>> {
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
        .map_err(|e| {
            e.rename_bad_request(|msg, _| {
                (
                    msg.replace("'json_schema'", "output_config.format.schema"),
                    Some(format!("{AT}.schema")),
                )
            })
        })?
        .map(|c| Constraint {
            // Anthropic's structured outputs refuse what they cannot enforce.
            spec: c.spec.with_strict(true),
            param: AT.into(),
        }))
}

/// `stop` errors name `stop_sequences`.
pub(super) fn rename_stop(e: ServerError) -> ServerError {
    e.rename_bad_request(|msg, param| match param.as_deref() {
        Some("stop") => (
            msg.replace("'stop'", "stop_sequences")
                .replace("stop strings", "stop sequences"),
            Some("stop_sequences".into()),
        ),
        Some("user") => (
            msg.replace("'user'", "metadata.user_id"),
            Some("metadata.user_id".into()),
        ),
        _ => (msg, param),
    })
}
