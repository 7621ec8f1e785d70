//! The messages of a conversation as a chat template sees them: a role, content (text or a
//! list of parts), the tool calls an assistant made and, for a tool's answer, the id of the call
//! it answers.
//!
//! Invariants of what a template gets (see [`ChatMessage::to_template`]):
//! - `role` and `content` always; `content` is a string whenever every part is text (the parts'
//!   texts joined, as vLLM's default "string" content format does), so a plain conversation
//!   renders byte for byte as it did when messages were `(role, text)` pairs.
//! - `tool_calls`, `tool_call_id` and `name` only when present, so templates that test
//!   `message.tool_calls is defined` see exactly what transformers would pass them.
//! - A tool call's `function.arguments` is the JSON object it encodes when it parses as one
//!   (HF templates apply `tojson` or iterate `arguments.items()`), else the string as sent.

use serde::{Deserialize, Serialize};

/// A message's content: plain text or a list of parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl Default for Content {
    fn default() -> Self {
        Content::Text(String::new())
    }
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
}

impl Content {
    /// The text of every part, joined.
    pub fn text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text { text } => text.as_str(),
                })
                .collect(),
        }
    }

    /// Bytes of text, for the render's output cap.
    pub fn len(&self) -> usize {
        match self {
            Content::Text(t) => t.len(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text { text } => text.len(),
                })
                .sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl PartialEq<str> for Content {
    fn eq(&self, other: &str) -> bool {
        matches!(self, Content::Text(t) if t == other)
    }
}

impl PartialEq<&str> for Content {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

/// A call of a tool that an assistant message made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    /// Always `function` in OpenAI's API.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// The function a [`ToolCall`] calls and its arguments (a JSON text, as OpenAI sends it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Content,
    /// The calls an assistant message made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` message: the function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A plain text message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Content::Text(content.into()),
            ..ChatMessage::default()
        }
    }

    /// Bytes of text the message brings (role, content, tool calls), for the output cap.
    pub fn text_len(&self) -> usize {
        let calls: usize = self
            .tool_calls
            .iter()
            .map(|c| c.function.name.len() + c.function.arguments.len())
            .sum();
        self.role.len() + self.content.len() + calls
    }

    /// The message as the template's `messages[i]` (see the module docs).
    pub(crate) fn to_template(&self) -> minijinja::Value {
        use minijinja::Value;
        let mut fields: Vec<(&str, Value)> = vec![
            ("role", Value::from(self.role.as_str())),
            ("content", Value::from(self.content.text())),
        ];
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self.tool_calls.iter().map(tool_call_value).collect();
            fields.push(("tool_calls", Value::from(calls)));
        }
        if let Some(id) = &self.tool_call_id {
            fields.push(("tool_call_id", Value::from(id.as_str())));
        }
        if let Some(name) = &self.name {
            fields.push(("name", Value::from(name.as_str())));
        }
        Value::from_iter(fields)
    }
}

fn tool_call_value(c: &ToolCall) -> minijinja::Value {
    use minijinja::Value;
    let arguments = match serde_json::from_str::<serde_json::Value>(&c.function.arguments) {
        Ok(v @ serde_json::Value::Object(_)) => Value::from_serialize(&v),
        _ => Value::from(c.function.arguments.as_str()),
    };
    let function = Value::from_iter([
        ("name", Value::from(c.function.name.as_str())),
        ("arguments", arguments),
    ]);
    Value::from_iter([
        ("id", Value::from(c.id.as_str())),
        ("type", Value::from(c.kind.as_str())),
        ("function", function),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_reads_text_or_parts() {
        let m: ChatMessage = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(m.content.text(), "ab");
        assert_eq!(m.text_len(), 6);
        let m: ChatMessage = serde_json::from_str(
            r#"{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]}"#,
        )
        .unwrap();
        assert_eq!(m.tool_calls[0].function.name, "f");
        let back = serde_json::to_string(&ChatMessage::new("user", "hi")).unwrap();
        assert_eq!(back, r#"{"role":"user","content":"hi"}"#);
    }
}
