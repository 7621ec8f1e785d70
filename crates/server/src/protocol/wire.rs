//! Reading a JSON request body into derive-based types whose errors name the field.
//!
//! A body is first parsed into a JSON object (anything else is a 400 with no parameter), then
//! deserialized through `serde_path_to_error`, so a type error anywhere says where it is:
//! `'messages[0].role' must be a string, got an integer`, with `param` set to that path.
//!
//! Invariants:
//! - `null` reads as absent (every field is an `Option`), as OpenAI treats it; unknown fields
//!   are ignored.
//! - The leaf types here ([`Num`], [`Int`], [`Count`], [`Flag`], [`Text`], [`List`], ...) only
//!   check a value's JSON type (and, for numbers, that it fits); ranges and cross-field rules
//!   are checked when a request is admitted, with the parameter named there.
//! - A derived struct or list met with the wrong JSON type reports `must be <expected>, got
//!   <kind>`, `<expected>` being the type's `expecting` text ("an object", "an array").

use crate::error::{Result, ServerError};
use ferrum_types::TokenId;
use serde::de::{DeserializeOwned, Error as _, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::fmt;
use std::marker::PhantomData;

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

/// Parses a body; anything but a JSON object is a 400.
pub fn parse_body(body: &[u8]) -> Result<Value> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ServerError::bad(
            "the request body is empty; expected a JSON object",
        ));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ServerError::bad(format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ServerError::bad(format!(
            "the request body must be a JSON object, got {}",
            kind(&v)
        )));
    }
    Ok(v)
}

/// Deserializes `T` from a parsed body; an error is a 400 whose `param` is the field's path.
pub fn from_value<T: DeserializeOwned>(body: &Value) -> Result<T> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner().to_string();
        // serde's own wording for a derived type met with the wrong JSON type, reworded as
        // the leaf types word it.
        let msg = match inner
            .strip_prefix("invalid type: ")
            .and_then(|r| r.rsplit_once(", expected "))
        {
            Some((_, expected)) => {
                let got = value_at(body, e.path()).map_or("null", kind);
                format!("must be {expected}, got {got}")
            }
            None => inner,
        };
        if path == "." {
            ServerError::bad(format!("the request body {msg}"))
        } else {
            ServerError::param(path.clone(), format!("'{path}' {msg}"))
        }
    })
}

/// The value at `path` in `v`, if there is one.
fn value_at<'a>(v: &'a Value, path: &serde_path_to_error::Path) -> Option<&'a Value> {
    use serde_path_to_error::Segment;
    path.iter().try_fold(v, |v, seg| match seg {
        Segment::Seq { index } => v.get(*index),
        Segment::Map { key } => v.get(key.as_str()),
        Segment::Enum { .. } | Segment::Unknown => Some(v),
    })
}

fn wrong<E: serde::de::Error>(want: &str, v: &Value) -> E {
    E::custom(format!("must be {want}, got {}", kind(v)))
}

/// A number that fits an `f32`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num(pub f32);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        match v.as_f64() {
            Some(x) if x.is_finite() && x.abs() <= f32::MAX as f64 => Ok(Num(x as f32)),
            Some(x) => Err(D::Error::custom(format!("= {x} is out of range"))),
            None => Err(wrong("a number", &v)),
        }
    }
}

/// An integer that fits an `i64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int(pub i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        v.as_i64().map(Int).ok_or_else(|| wrong("an integer", &v))
    }
}

/// A non-negative integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let Int(x) = Int::deserialize(d)?;
        if x < 0 {
            return Err(D::Error::custom(format!("must not be negative, got {x}")));
        }
        Ok(Count(usize::try_from(x).unwrap_or(usize::MAX)))
    }
}

/// A boolean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        v.as_bool().map(Flag).ok_or_else(|| wrong("a boolean", &v))
    }
}

/// A string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Text(s)),
            v => Err(wrong("a string", &v)),
        }
    }
}

/// A JSON object, kept as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Object(pub Map<String, Value>);

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Object(o) => Ok(Object(o)),
            v => Err(wrong("an object", &v)),
        }
    }
}

/// A JSON array of `T`; an item's errors name its index.
#[derive(Debug, Clone, PartialEq)]
pub struct List<T>(pub Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = List<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<List<T>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(x) = seq.next_element()? {
                    items.push(x);
                }
                Ok(List(items))
            }
        }
        d.deserialize_seq(V(PhantomData))
    }
}

/// A string or a list of strings (`stop`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Strings(pub Vec<String>);

impl<'de> Deserialize<'de> for Strings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        const WANT: &str = "a string or a list of strings";
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Strings(vec![s])),
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    v => Err(wrong(WANT, &v)),
                })
                .collect::<std::result::Result<_, _>>()
                .map(Strings),
            v => Err(wrong(WANT, &v)),
        }
    }
}

/// A list of token ids (non-negative integers that fit a [`TokenId`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenIds(pub Vec<TokenId>);

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Array(items) => items
                .iter()
                .map(token_id)
                .collect::<std::result::Result<_, String>>()
                .map(TokenIds)
                .map_err(D::Error::custom),
            v => Err(wrong("an array", &v)),
        }
    }
}

/// One token id, or the message (after the field's name) saying why not.
pub fn token_id(v: &Value) -> std::result::Result<TokenId, String> {
    v.as_u64()
        .and_then(|x| TokenId::try_from(x).ok())
        .ok_or_else(|| format!("must hold token ids (non-negative integers), got {v}"))
}

/// A seed: any integer; negative ones wrap to `u64` as OpenAI clients expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed(pub u64);

impl<'de> Deserialize<'de> for Seed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        v.as_i64()
            .map(|s| s as u64)
            .or_else(|| v.as_u64())
            .map(Seed)
            .ok_or_else(|| wrong("an integer", &v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Probe {
        t: Option<Num>,
        n: Option<Count>,
        s: Option<Strings>,
        z: Option<Num>,
        f: Option<Num>,
        big: Option<Num>,
        i: Option<Int>,
        l: Option<List<Probe>>,
    }

    fn probe(body: &str) -> Result<Probe> {
        from_value(&parse_body(body.as_bytes())?)
    }

    #[test]
    fn reads_name_the_field() {
        let e = probe(r#"{"t": "x"}"#).unwrap_err();
        assert_eq!(e.to_string(), "'t' must be a number, got a string");
        let e = probe(r#"{"n": -1}"#).unwrap_err();
        assert_eq!(e.to_string(), "'n' must not be negative, got -1");
        assert!(probe(r#"{"s": ["a", 1]}"#).is_err());
        let p = probe(r#"{"z": null, "f": 0.5}"#).unwrap();
        assert_eq!((p.z, p.f), (None, Some(Num(0.5))));
        let e = probe(r#"{"big": 1e39}"#).unwrap_err();
        assert!(e.to_string().starts_with("'big' = 1000"), "{e}");
        assert!(e.to_string().ends_with(" is out of range"), "{e}");
        assert!(probe(r#"{"i": 0.5}"#).is_err());
        let e = probe(r#"{"l": [{}, {"i": "x"}]}"#).unwrap_err();
        assert_eq!(e.to_string(), "'l[1].i' must be an integer, got a string");
        let e = probe(r#"{"l": 3}"#).unwrap_err();
        assert_eq!(e.to_string(), "'l' must be an array, got an integer");
        let e = probe(r#"{"l": [3]}"#).unwrap_err();
        assert!(e.to_string().starts_with("'l[0]' must be "), "{e}");
        assert!(parse_body(b"[1]").is_err());
        assert!(parse_body(b"{").is_err());
        assert!(parse_body(b"  ").is_err());
    }
}
