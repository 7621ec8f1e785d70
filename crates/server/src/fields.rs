//! Typed reads of a JSON request body that name the field on error.
//!
//! Bodies are parsed into a `serde_json` object and read field by field, so every type or
//! range error says which parameter is wrong ("'temperature' must be a number, got a
//! string"). `null` reads as absent, as OpenAI treats it; unknown fields are ignored.

use crate::error::{Result, ServerError};
use serde_json::{Map, Value};

/// A request body: a JSON object.
#[derive(Debug)]
pub struct Fields {
    obj: Map<String, Value>,
}

/// What a JSON value is, for error messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a fraction",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Fields {
    /// Parses a body; anything but a JSON object is a 400.
    pub fn parse(body: &[u8]) -> Result<Fields> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(ServerError::bad(
                "the request body is empty; expected a JSON object",
            ));
        }
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ServerError::bad(format!("the request body is not valid JSON: {e}")))?;
        match v {
            Value::Object(obj) => Ok(Fields { obj }),
            other => Err(ServerError::bad(format!(
                "the request body must be a JSON object, got {}",
                kind(&other)
            ))),
        }
    }

    pub fn from_map(obj: Map<String, Value>) -> Fields {
        Fields { obj }
    }

    /// The value of `key`, `None` when missing or null.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn wrong(key: &str, want: &str, v: &Value) -> ServerError {
        ServerError::param(key, format!("'{key}' must be {want}, got {}", kind(v)))
    }

    pub fn f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x.abs() <= f32::MAX as f64 => Ok(Some(x as f32)),
                Some(x) => Err(ServerError::param(
                    key,
                    format!("'{key}' = {x} is out of range"),
                )),
                None => Err(Self::wrong(key, "a number", v)),
            },
        }
    }

    pub fn i64(&self, key: &str) -> Result<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "an integer", v)),
        }
    }

    /// A non-negative integer.
    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.i64(key)? {
            None => Ok(None),
            Some(x) if x < 0 => Err(ServerError::param(
                key,
                format!("'{key}' must not be negative, got {x}"),
            )),
            Some(x) => Ok(Some(usize::try_from(x).unwrap_or(usize::MAX))),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "a boolean", v)),
        }
    }

    pub fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "a string", v)),
        }
    }

    pub fn array(&self, key: &str) -> Result<Option<&Vec<Value>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "an array", v)),
        }
    }

    pub fn object(&self, key: &str) -> Result<Option<&Map<String, Value>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_object()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "an object", v)),
        }
    }

    /// A string or a list of strings (`stop`).
    pub fn strings(&self, key: &str) -> Result<Vec<String>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| Self::wrong(key, "a string or a list of strings", v))
                })
                .collect(),
            Some(v) => Err(Self::wrong(key, "a string or a list of strings", v)),
        }
    }

    /// A list of non-negative integers that fit a token id.
    pub fn token_ids(&self, key: &str) -> Result<Option<Vec<u32>>> {
        match self.array(key)? {
            None => Ok(None),
            Some(items) => items
                .iter()
                .map(|v| token_id(key, v))
                .collect::<Result<Vec<_>>>()
                .map(Some),
        }
    }
}

/// One token id, or a 400 naming `key`.
pub fn token_id(key: &str, v: &Value) -> Result<u32> {
    v.as_u64()
        .and_then(|x| u32::try_from(x).ok())
        .ok_or_else(|| {
            ServerError::param(
                key,
                format!("'{key}' must hold token ids (non-negative integers), got {v}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_name_the_field() {
        let f = Fields::parse(
            br#"{"t": "x", "n": -1, "s": ["a", 1], "z": null, "f": 0.5, "big": 1e39}"#,
        )
        .unwrap();
        let e = f.f32("t").unwrap_err();
        assert!(e.to_string().contains("'t' must be a number, got a string"));
        assert!(f.usize("n").unwrap_err().to_string().contains("negative"));
        assert!(f.strings("s").is_err());
        assert_eq!(f.f32("z").unwrap(), None);
        assert_eq!(f.f32("f").unwrap(), Some(0.5));
        assert!(f
            .f32("big")
            .unwrap_err()
            .to_string()
            .contains("out of range"));
        assert!(f.i64("f").is_err());
        assert!(Fields::parse(b"[1]").is_err());
        assert!(Fields::parse(b"{").is_err());
        assert!(Fields::parse(b"  ").is_err());
    }
}
