//! A Responses body's parts in the chat path's terms: `input` items as messages, function
//! tools and `tool_choice` in the chat API's shape, `text.format` as the constraint; errors
//! name the Responses API's own paths.

use super::MAX_INPUT_ITEMS;
use crate::error::{Result, ServerError};
use crate::protocol::structured::StructuredFields;
use crate::protocol::wire::kind;
use ferrum_tokenizer::{ChatMessage, Content, FunctionCall, ToolCall};
use serde_json::{json, Map, Value};

pub(super) fn bad(param: impl Into<String>, msg: impl Into<String>) -> ServerError {
    ServerError::param(param, msg)
}

/// A string field of an item.
pub(super) fn text_field(item: &Map<String, Value>, at: &str, key: &str) -> Result<String> {
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
pub(super) fn content_text(v: Option<&Value>, at: &str) -> Result<String> {
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
pub(super) fn read_input(v: &Value) -> Result<Vec<ChatMessage>> {
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
pub(super) fn chat_tools(v: &Value) -> Result<Value> {
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
pub(super) fn chat_tool_choice(v: &Value) -> Result<Value> {
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
pub(super) fn rename(e: ServerError, map: impl Fn(&str) -> String) -> ServerError {
    e.rename_bad_request(|msg, param| match param {
        Some(old) => {
            let new = map(&old);
            (msg.replace(old.as_str(), &new), Some(new))
        }
        None => (msg, None),
    })
}

pub(super) fn tool_path(p: &str) -> String {
    p.replace(".function.", ".")
        .replace("tool_choice.function.name", "tool_choice.name")
}

/// `text.format` read into the chat route's constraint fields.
pub(super) fn text_format(text: Option<&Value>) -> Result<(StructuredFields, Value)> {
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
