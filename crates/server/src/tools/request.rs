//! A chat request's `tools`, `tool_choice` and `parallel_tool_calls`, checked.

use crate::error::{Result, ServerError};
use serde_json::Value;

/// Most tools per request.
pub const MAX_TOOLS: usize = 128;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of the arguments (an object schema; `{}` when none was given).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    /// This function, exactly once.
    Function(String),
}

/// The tool part of a chat request, when it has tools and does not turn them off.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// More than one call in one answer.
    pub parallel: bool,
}

fn name_ok(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// Reads `tools` (a list of `{"type": "function", "function": {"name", "description",
/// "parameters"}}`).
pub fn read_tools(v: &Value) -> Result<Vec<Tool>> {
    let items = v
        .as_array()
        .ok_or_else(|| ServerError::param("tools", "'tools' must be an array"))?;
    if items.len() > MAX_TOOLS {
        return Err(ServerError::param(
            "tools",
            format!(
                "'tools' has {} entries; at most {MAX_TOOLS} are allowed",
                items.len()
            ),
        ));
    }
    let mut tools: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, t) in items.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ServerError::param(
                format!("{at}.type"),
                format!("'{at}.type' must be 'function'"),
            ));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                ServerError::param(
                    format!("{at}.function"),
                    format!("'{at}.function' must be an object"),
                )
            })?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or("");
        if !name_ok(name) {
            return Err(ServerError::param(
                format!("{at}.function.name"),
                format!(
                    "'{at}.function.name' must be 1 to 64 letters, digits, '_', '-' or '.', got {name:?}"
                ),
            ));
        }
        if tools.iter().any(|x| x.name == name) {
            return Err(ServerError::param(
                format!("{at}.function.name"),
                format!("two tools are named {name:?}"),
            ));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(ServerError::param(
                    format!("{at}.function.parameters"),
                    format!("'{at}.function.parameters' must be a JSON schema object"),
                ))
            }
        };
        tools.push(Tool {
            name: name.to_string(),
            parameters,
        });
    }
    Ok(tools)
}

/// Reads `tool_choice` against the tools: `none`, `auto`, `required` or
/// `{"type": "function", "function": {"name"}}`.
pub fn read_choice(v: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice> {
    let p = "tool_choice";
    Ok(match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ServerError::param(
                    p,
                    format!(
                    "'tool_choice' must be 'none', 'auto', 'required' or a function, got {other:?}"
                ),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ServerError::param(p, "'tool_choice' names a function as {\"type\": \"function\", \"function\": {\"name\": ...}}")
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ServerError::param(
                    p,
                    format!("'tool_choice' names the function {name:?}, which is not in 'tools'"),
                ));
            }
            ToolChoice::Function(name.to_string())
        }
        Some(_) => {
            return Err(ServerError::param(
                p,
                "'tool_choice' must be a string or an object",
            ))
        }
    })
}

/// The request's tool part: `None` without tools (then `tool_choice` may only be `none` or
/// `auto`).
pub fn read(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<&Value>,
) -> Result<Option<ToolRequest>> {
    let tools = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => read_tools(v)?,
    };
    let parallel = match parallel {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ServerError::param(
                "parallel_tool_calls",
                "'parallel_tool_calls' must be a boolean",
            ))
        }
    };
    let choice = read_choice(choice, &tools)?;
    if tools.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(None),
            _ => Err(ServerError::param(
                "tool_choice",
                "'tool_choice' asks for a tool call, but 'tools' is empty",
            )),
        };
    }
    Ok(Some(ToolRequest {
        tools,
        choice,
        parallel,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
               {"type": "function", "function": {"name": "now"}}])
    }

    #[test]
    fn reads_tools_and_choices() {
        let r = read(Some(&tools()), None, None).unwrap().unwrap();
        assert_eq!(r.tools.len(), 2);
        assert_eq!(r.tools[1].parameters, json!({"type": "object"}));
        assert_eq!(r.choice, ToolChoice::Auto);
        assert!(r.parallel);
        let named = json!({"type": "function", "function": {"name": "now"}});
        let r = read(Some(&tools()), Some(&named), Some(&json!(false)))
            .unwrap()
            .unwrap();
        assert_eq!(r.choice, ToolChoice::Function("now".into()));
        assert!(!r.parallel);
        assert_eq!(read(None, Some(&json!("none")), None).unwrap(), None);
        assert_eq!(read(Some(&json!([])), None, None).unwrap(), None);
    }

    #[test]
    fn bad_tools_name_the_field() {
        let cases = [
            (json!([{"type": "x"}]), None, "tools[0].type"),
            (json!([{"type": "function"}]), None, "tools[0].function"),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                None,
                "tools[0].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": "a", "parameters": 3}}]),
                None,
                "tools[0].function.parameters",
            ),
            (
                tools(),
                Some(json!({"type": "function", "function": {"name": "missing"}})),
                "tool_choice",
            ),
            (tools(), Some(json!("sometimes")), "tool_choice"),
            (json!([]), Some(json!("required")), "tool_choice"),
        ];
        for (t, c, param) in cases {
            let e = read(Some(&t), c.as_ref(), None).unwrap_err().to_json();
            assert_eq!(e["error"]["param"], param, "{e}");
        }
    }
}
