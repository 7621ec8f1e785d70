//! Known OpenAI features that Ferrum does not serve yet: a request that asks for one is
//! refused with a 400 naming the parameter (code `unsupported_parameter`) instead of being
//! answered as if it had not asked. A feature's neutral value (`tools: []`,
//! `tool_choice: "none"`, text-only `modalities`, an empty `suffix`) asks for nothing and
//! passes.

use crate::error::{Result, ServerError};
use serde_json::Value;

/// Whether a value of an unsupported feature asks for nothing (absent or its neutral value).
pub fn is_harmless(key: &str, v: &Value) -> bool {
    match key {
        "tools" | "functions" => v.as_array().is_some_and(Vec::is_empty),
        "tool_choice" => v.as_str() == Some("none"),
        "modalities" => v
            .as_array()
            .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text"))),
        "suffix" => v.as_str() == Some(""),
        _ => false,
    }
}

/// Refuses the first feature in `keys` that is present and not harmless.
pub fn refuse<'v>(keys: &[(&str, &str)], value: impl Fn(&str) -> Option<&'v Value>) -> Result<()> {
    for &(key, what) in keys {
        if value(key).is_some_and(|v| !is_harmless(key, v)) {
            return Err(ServerError::unsupported(key, what));
        }
    }
    Ok(())
}
