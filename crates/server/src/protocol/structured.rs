//! The structured-output fields both endpoints take, in the three dialects clients send, read
//! into one [`StructuredOutput`]:
//! - OpenAI: `response_format` `{"type": "text"}`, `{"type": "json_object"}` or
//!   `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`;
//! - vLLM: `structured_outputs` (one of `json`, `regex`, `choice`, `grammar`, `json_object`)
//!   and the older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`;
//! - llama.cpp's server: `json_schema` (a schema), `grammar` (GBNF), and `response_format`
//!   `{"type": "json_object", "schema": {...}}`.
//!
//! A grammar given to vLLM's fields is GBNF when it has a `::=` rule and llguidance's Lark
//! otherwise. At most one constraint per request: two are a 400 naming both. Whether the
//! constraint compiles is the engine's to say (a 400 naming the field, see
//! [`StructuredFields::constraint`]).

use crate::error::{Result, ServerError};
use ferrum_types::StructuredOutput;
use serde::Deserialize;
use serde_json::Value;

/// The structured-output fields of a body, as sent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct StructuredFields {
    pub response_format: Option<Value>,
    pub structured_outputs: Option<Value>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<Value>,
    pub guided_choice: Option<Value>,
    pub guided_grammar: Option<Value>,
    /// llama.cpp's server.
    pub json_schema: Option<Value>,
    pub grammar: Option<Value>,
}

/// Most bytes of a schema, regex or grammar.
pub const MAX_CONSTRAINT_BYTES: usize = 256 * 1024;

/// Most strings of a choice.
pub const MAX_CHOICES: usize = 1024;

/// A constraint and the field it came from (errors name it).
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    pub spec: StructuredOutput,
    pub param: String,
}

fn text<'v>(param: &str, v: &'v Value) -> Result<&'v str> {
    let s = v.as_str().ok_or_else(|| {
        ServerError::param(
            param,
            format!("'{param}' must be a string, got {}", super::wire::kind(v)),
        )
    })?;
    if s.is_empty() {
        return Err(ServerError::param(
            param,
            format!("'{param}' must not be empty"),
        ));
    }
    if s.len() > MAX_CONSTRAINT_BYTES {
        return Err(ServerError::param(
            param,
            format!(
                "'{param}' is {} bytes; at most {MAX_CONSTRAINT_BYTES} are allowed",
                s.len()
            ),
        ));
    }
    Ok(s)
}

/// A schema given as an object (or a JSON text of one, as vLLM allows), not strict: keywords
/// the engine cannot enforce are left out (vLLM's fields, llama.cpp's `json_schema`, a
/// `json_schema` response format without `strict: true`).
fn schema(param: &str, v: &Value) -> Result<StructuredOutput> {
    let json = match v {
        Value::Object(_) | Value::Bool(_) => v.to_string(),
        Value::String(_) => text(param, v)?.to_string(),
        other => {
            return Err(ServerError::param(
                param,
                format!(
                    "'{param}' must be a JSON schema (an object), got {}",
                    super::wire::kind(other)
                ),
            ))
        }
    };
    if json.len() > MAX_CONSTRAINT_BYTES {
        return Err(ServerError::param(
            param,
            format!(
                "'{param}' is {} bytes; at most {MAX_CONSTRAINT_BYTES} are allowed",
                json.len()
            ),
        ));
    }
    Ok(StructuredOutput::JsonSchema {
        schema: json,
        strict: false,
    })
}

/// Reads one field's value into a constraint (the field's name for errors).
type Reader = fn(&str, &Value) -> Result<StructuredOutput>;

/// A field that is there and not `null`.
fn present(v: &Option<Value>) -> Option<&Value> {
    v.as_ref().filter(|v| !v.is_null())
}

fn choice(param: &str, v: &Value) -> Result<StructuredOutput> {
    let items = v.as_array().ok_or_else(|| {
        ServerError::param(param, format!("'{param}' must be an array of strings"))
    })?;
    if items.is_empty() || items.len() > MAX_CHOICES {
        return Err(ServerError::param(
            param,
            format!(
                "'{param}' must have between 1 and {MAX_CHOICES} strings, got {}",
                items.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, it) in items.iter().enumerate() {
        out.push(text(&format!("{param}[{i}]"), it)?.to_string());
    }
    Ok(StructuredOutput::Choice(out))
}

/// A grammar in vLLM's fields: GBNF when it has a `::=` rule, else Lark.
fn grammar(param: &str, v: &Value) -> Result<StructuredOutput> {
    let g = text(param, v)?;
    Ok(if g.contains("::=") {
        StructuredOutput::Gbnf(g.to_string())
    } else {
        StructuredOutput::Lark(g.to_string())
    })
}

fn response_format(v: &Value) -> Result<Option<Constraint>> {
    let p = "response_format";
    let obj = v
        .as_object()
        .ok_or_else(|| ServerError::param(p, "'response_format' must be an object"))?;
    let kind = obj.get("type").and_then(Value::as_str).ok_or_else(|| {
        ServerError::param("response_format.type", "'response_format.type' is required")
    })?;
    let spec = match kind {
        "text" => return Ok(None),
        "json_object" => match obj.get("schema") {
            Some(s) if !s.is_null() => {
                return Ok(Some(Constraint {
                    spec: schema("response_format.schema", s)?,
                    param: "response_format.schema".into(),
                }))
            }
            _ => StructuredOutput::JsonObject,
        },
        "json_schema" => {
            let js = obj.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                ServerError::param(
                    "response_format.json_schema",
                    "'response_format.json_schema' (an object with 'name' and 'schema') is required",
                )
            })?;
            if let Some(n) = js.get("name") {
                text("response_format.json_schema.name", n)?;
            }
            let strict = match js.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ServerError::param(
                        "response_format.json_schema.strict",
                        "'response_format.json_schema.strict' must be a boolean",
                    ))
                }
            };
            match js.get("schema") {
                Some(s) if !s.is_null() => {
                    schema("response_format.json_schema.schema", s)?.with_strict(strict)
                }
                _ => {
                    return Err(ServerError::param(
                        "response_format.json_schema.schema",
                        "'response_format.json_schema.schema' is required",
                    ))
                }
            }
        }
        other => {
            return Err(ServerError::param(
                "response_format.type",
                format!("'response_format.type' must be 'text', 'json_object' or 'json_schema', got {other:?}"),
            ))
        }
    };
    Ok(Some(Constraint {
        spec,
        param: p.into(),
    }))
}

fn structured_outputs(v: &Value) -> Result<Option<Constraint>> {
    let p = "structured_outputs";
    let obj = v
        .as_object()
        .ok_or_else(|| ServerError::param(p, "'structured_outputs' must be an object"))?;
    let set: Vec<(&String, &Value)> = obj
        .iter()
        .filter(|(k, v)| {
            !v.is_null()
                && matches!(
                    k.as_str(),
                    "json" | "regex" | "choice" | "grammar" | "json_object"
                )
                && !(k.as_str() == "json_object" && v.as_bool() == Some(false))
        })
        .collect();
    let [(key, value)] = set.as_slice() else {
        return Err(ServerError::param(
            p,
            "'structured_outputs' must set exactly one of 'json', 'regex', 'choice', 'grammar' or 'json_object'",
        ));
    };
    let param = format!("{p}.{key}");
    let spec = match key.as_str() {
        "json" => schema(&param, value)?,
        "regex" => StructuredOutput::Regex(text(&param, value)?.to_string()),
        "choice" => choice(&param, value)?,
        "grammar" => grammar(&param, value)?,
        _ => match value.as_bool() {
            Some(true) => StructuredOutput::JsonObject,
            _ => {
                return Err(ServerError::param(
                    &param,
                    format!("'{param}' must be a boolean"),
                ))
            }
        },
    };
    Ok(Some(Constraint { spec, param }))
}

impl StructuredFields {
    /// The request's constraint, if it asks for one; 400s name the field.
    pub fn constraint(&self) -> Result<Option<Constraint>> {
        let mut found: Vec<Constraint> = Vec::new();
        if let Some(v) = present(&self.response_format) {
            found.extend(response_format(v)?);
        }
        if let Some(v) = present(&self.structured_outputs) {
            found.extend(structured_outputs(v)?);
        }
        let simple: [(&str, &Option<Value>, Reader); 6] = [
            ("guided_json", &self.guided_json, schema),
            ("guided_regex", &self.guided_regex, |p, v| {
                Ok(StructuredOutput::Regex(text(p, v)?.to_string()))
            }),
            ("guided_choice", &self.guided_choice, choice),
            ("guided_grammar", &self.guided_grammar, grammar),
            ("json_schema", &self.json_schema, schema),
            ("grammar", &self.grammar, |p, v| {
                Ok(StructuredOutput::Gbnf(text(p, v)?.to_string()))
            }),
        ];
        for (param, v, read) in simple {
            if let Some(v) = present(v) {
                found.push(Constraint {
                    spec: read(param, v)?,
                    param: param.into(),
                });
            }
        }
        match found.len() {
            0 | 1 => Ok(found.pop()),
            _ => Err(ServerError::param(
                &found[1].param,
                format!(
                    "'{}' and '{}' both constrain the output; give one",
                    found[0].param, found[1].param
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<Option<Constraint>> {
        let f: StructuredFields = serde_json::from_value(body).unwrap();
        f.constraint()
    }

    fn spec(body: Value) -> StructuredOutput {
        read(body).unwrap().unwrap().spec
    }

    fn err(body: Value) -> (String, String) {
        let e = read(body).unwrap_err().to_json();
        (
            e["error"]["param"].as_str().unwrap_or("").to_string(),
            e["error"]["message"].as_str().unwrap_or("").to_string(),
        )
    }

    #[test]
    fn every_dialect_reads_into_one_constraint() {
        let s = json!({"type": "object"});
        let js = StructuredOutput::JsonSchema {
            schema: s.to_string(),
            strict: false,
        };
        let strict_js = StructuredOutput::JsonSchema {
            schema: s.to_string(),
            strict: true,
        };
        assert_eq!(
            read(json!({"response_format": {"type": "text"}})).unwrap(),
            None
        );
        assert_eq!(
            spec(json!({"response_format": {"type": "json_object"}})),
            StructuredOutput::JsonObject
        );
        assert_eq!(
            spec(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}})
            ),
            strict_js
        );
        assert_eq!(
            spec(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}})
            ),
            js
        );
        assert_eq!(
            spec(json!({"response_format": {"type": "json_object", "schema": s}})),
            js
        );
        assert_eq!(spec(json!({"structured_outputs": {"json": s}})), js);
        assert_eq!(
            spec(json!({"structured_outputs": {"json": s.to_string()}})),
            js
        );
        assert_eq!(
            spec(json!({"structured_outputs": {"regex": "a+"}})),
            StructuredOutput::Regex("a+".into())
        );
        assert_eq!(
            spec(json!({"structured_outputs": {"choice": ["x", "y"]}})),
            StructuredOutput::Choice(vec!["x".into(), "y".into()])
        );
        assert_eq!(
            spec(json!({"structured_outputs": {"grammar": "start: \"a\""}})),
            StructuredOutput::Lark("start: \"a\"".into())
        );
        assert_eq!(
            spec(json!({"structured_outputs": {"json_object": true}})),
            StructuredOutput::JsonObject
        );
        assert_eq!(spec(json!({"guided_json": s})), js);
        assert_eq!(
            spec(json!({"guided_regex": "[0-9]+"})),
            StructuredOutput::Regex("[0-9]+".into())
        );
        assert_eq!(
            spec(json!({"guided_choice": ["a"]})),
            StructuredOutput::Choice(vec!["a".into()])
        );
        assert_eq!(
            spec(json!({"guided_grammar": "root ::= \"a\""})),
            StructuredOutput::Gbnf("root ::= \"a\"".into())
        );
        assert_eq!(spec(json!({"json_schema": s})), js);
        assert_eq!(
            spec(json!({"grammar": "root ::= \"a\""})),
            StructuredOutput::Gbnf("root ::= \"a\"".into())
        );
        assert_eq!(
            read(json!({"grammar": null, "guided_json": null})).unwrap(),
            None
        );
    }

    #[test]
    fn bad_fields_are_400s_naming_the_field() {
        let cases = [
            (
                json!({"response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format.json_schema.schema",
            ),
            (json!({"response_format": "json"}), "response_format"),
            (json!({"structured_outputs": {}}), "structured_outputs"),
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"choice": []}}),
                "structured_outputs.choice",
            ),
            (
                json!({"structured_outputs": {"choice": ["a", ""]}}),
                "structured_outputs.choice[1]",
            ),
            (json!({"guided_json": 3}), "guided_json"),
            (json!({"guided_regex": ""}), "guided_regex"),
            (json!({"grammar": ["x"]}), "grammar"),
            (
                json!({"guided_regex": "a", "json_schema": {}}),
                "json_schema",
            ),
        ];
        for (body, param) in cases {
            let (p, msg) = err(body.clone());
            assert_eq!(p, param, "{body}: {msg}");
        }
        let (_, msg) =
            err(json!({"guided_regex": "a", "response_format": {"type": "json_object"}}));
        assert!(msg.contains("both constrain"), "{msg}");
    }
}
