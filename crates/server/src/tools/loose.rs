//! Calls written without the family's markup, as small and code models often write them with
//! `tool_choice: "auto"`: a bare call object opening the answer,
//! `{"name": "get_weather", "arguments": {"city": "Oslo"}}`, or the same object in a fenced
//! block (three backticks, optionally `json`, a line break, the object, a line break, three
//! backticks) anywhere in it.
//!
//! Invariants: such an object is a call only when `name` is its first key and names a declared
//! function ([`CallSyntax::names`]); any other JSON, fenced or not, stays content. The
//! grammar's triggers ([`super::format`]) are the compact spellings of the same openings, so
//! what the grammar constrains the parser reads as a call.

use super::ToolFormat;
use std::sync::Arc;

/// How a request's output is read for calls: its family's format and the functions it
/// declared (for the calls written without the family's markup; none: markup only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSyntax {
    pub format: ToolFormat,
    pub names: Arc<[String]>,
}

impl CallSyntax {
    /// The family's markup only.
    pub fn markup_only(format: ToolFormat) -> CallSyntax {
        CallSyntax {
            format,
            names: Arc::from(Vec::new()),
        }
    }

    /// The family's markup and the loose forms naming one of `names` (where the family
    /// reads them: not `llama3`, whose markup is the bare object itself).
    pub fn new(format: ToolFormat, names: impl IntoIterator<Item = String>) -> CallSyntax {
        CallSyntax {
            format,
            names: names.into_iter().collect(),
        }
    }

    /// Whether bare and fenced calls are read.
    pub fn reads_loose(&self) -> bool {
        self.format.takes_loose_calls() && !self.names.is_empty()
    }
}

/// A call written without markup: where it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loose {
    /// Opening the answer (after whitespace).
    Bare,
    /// In a fenced block, which a closing fence ends.
    Fenced,
}

/// The fence that opens and closes a block.
pub const FENCE: &str = "```";

/// How far a text goes toward a loose call's opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// A call: its object starts at this byte offset.
    Yes(usize),
    /// Could still become one: more text decides.
    Maybe,
    No,
}

/// Reads the text from a place where a loose call may open (the answer's start for
/// [`Loose::Bare`], a backtick for [`Loose::Fenced`]) through the call's name.
pub fn opening(s: &str, form: Loose, names: &[String]) -> Opening {
    let b = s.as_bytes();
    let mut i = 0;
    let blank = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // `lit` matches a literal at `i`: Some(result) when it decides.
    let lit = |i: &mut usize, l: &[u8]| -> Option<Opening> {
        let rest = &b[*i..];
        if rest.len() < l.len() {
            return Some(if l.starts_with(rest) {
                Opening::Maybe
            } else {
                Opening::No
            });
        }
        if &rest[..l.len()] != l {
            return Some(Opening::No);
        }
        *i += l.len();
        None
    };
    if form == Loose::Fenced {
        if let Some(o) = lit(&mut i, FENCE.as_bytes()) {
            return o;
        }
        let rest = &b[i..];
        if rest.len() < 4 && b"json".starts_with(rest) && !rest.is_empty() {
            return Opening::Maybe;
        }
        if rest.starts_with(b"json") {
            i += 4;
        }
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t' || b[i] == b'\r') {
            i += 1;
        }
        match b.get(i) {
            None => return Opening::Maybe,
            Some(b'\n') => i += 1,
            Some(_) => return Opening::No,
        }
    }
    blank(&mut i);
    let at = i;
    if let Some(o) = lit(&mut i, b"{") {
        return o;
    }
    blank(&mut i);
    if let Some(o) = lit(&mut i, b"\"name\"") {
        return o;
    }
    blank(&mut i);
    if let Some(o) = lit(&mut i, b":") {
        return o;
    }
    blank(&mut i);
    if let Some(o) = lit(&mut i, b"\"") {
        return o;
    }
    let start = i;
    while i < b.len() && b[i] != b'"' {
        if b[i] == b'\\' {
            return Opening::No;
        }
        i += 1;
    }
    let name = &s[start..i];
    if i == b.len() {
        return if names.iter().any(|n| n.starts_with(name)) {
            Opening::Maybe
        } else {
            Opening::No
        };
    }
    if names.iter().any(|n| n == name) {
        Opening::Yes(at)
    } else {
        Opening::No
    }
}

/// The compact spellings of the loose openings of a call to `name`, as the call grammar
/// writes them (the grammar's triggers): the bare object, and the object in a fence with and
/// without its language.
pub fn compact_openings(name: &str) -> [(String, Loose); 3] {
    let object = format!("{{\"name\": \"{name}\"");
    [
        (object.clone(), Loose::Bare),
        (format!("{FENCE}json\n{object}"), Loose::Fenced),
        (format!("{FENCE}\n{object}"), Loose::Fenced),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openings_are_decided_by_the_declared_names() {
        let names = ["get_weather".to_string(), "now".to_string()];
        let cases = [
            ("{\"name\": \"get_weather\"", Loose::Bare, Opening::Yes(0)),
            ("  \n{ \"name\" :\"now\", ", Loose::Bare, Opening::Yes(3)),
            ("", Loose::Bare, Opening::Maybe),
            ("  ", Loose::Bare, Opening::Maybe),
            ("{\"na", Loose::Bare, Opening::Maybe),
            ("{\"name\": \"get_w", Loose::Bare, Opening::Maybe),
            ("{\"name\": \"get_x", Loose::Bare, Opening::No),
            ("{\"name\": \"Bob\", \"age\": 3}", Loose::Bare, Opening::No),
            (
                "{\"city\": \"Oslo\", \"name\": \"now\"}",
                Loose::Bare,
                Opening::No,
            ),
            ("{\"name\": \"no\\u0077\"", Loose::Bare, Opening::No),
            ("Sure: {\"name\": \"now\"", Loose::Bare, Opening::No),
            (
                "```json\n{\"name\": \"now\"",
                Loose::Fenced,
                Opening::Yes(8),
            ),
            ("```\n  {\"name\": \"now\"", Loose::Fenced, Opening::Yes(6)),
            (
                "```json  \r\n{\"name\": \"now\"",
                Loose::Fenced,
                Opening::Yes(11),
            ),
            ("`", Loose::Fenced, Opening::Maybe),
            ("```js", Loose::Fenced, Opening::Maybe),
            ("```json", Loose::Fenced, Opening::Maybe),
            ("```python\n", Loose::Fenced, Opening::No),
            ("```json\n[1, 2]", Loose::Fenced, Opening::No),
            ("``", Loose::Fenced, Opening::Maybe),
            ("`x", Loose::Fenced, Opening::No),
        ];
        for (text, form, want) in cases {
            assert_eq!(opening(text, form, &names), want, "{text:?}");
        }
        for (text, form) in compact_openings("now") {
            assert!(matches!(opening(&text, form, &names), Opening::Yes(_)));
        }
    }
}
