//! [`ToolCallParser`]: a model's output, fed as text deltas, split into content and tool
//! calls, as events a stream can send at once: content, then per call its name
//! ([`ToolEvent::CallStart`]) and its arguments' JSON text in pieces
//! ([`ToolEvent::Arguments`]). A whole answer is the same parser over the whole text, so a
//! streamed answer reassembles to exactly the non-streamed one.
//!
//! Besides the family's markup, calls written without it are read when the syntax names the
//! declared functions ([`super::loose`]).
//!
//! Invariants: no text of the call markup (open and close texts, fences around a call, the
//! call objects) reaches content; text that may be the start of an opening is held back until
//! it is decided; whitespace between or after calls is not content.

use super::loose::{self, CallSyntax, Loose, Opening, FENCE};
use super::ToolFormat;

/// What a piece of output produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    Content(String),
    /// Call `index` (0-based, in order) calls `name`.
    CallStart {
        index: usize,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    Arguments {
        index: usize,
        text: String,
    },
}

/// A call, whole.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// A value being read at the top level of a call object.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Str,
    Nested,
    Primitive,
}

/// What the scanner expects next at the top level of the object.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
enum Expect {
    #[default]
    Key,
    Colon,
    Value,
    In(Kind),
    After,
}

/// Reads the top level of one call object as its text grows, from where it stopped (so a long
/// argument costs linear time, however it is split). Offsets are into the parser's buffer,
/// which keeps the object's text until the object ends.
#[derive(Debug, Default)]
struct ObjectScan {
    /// Byte offset just past the object's closing brace.
    end: Option<usize>,
    /// The first `name`'s value.
    name: Option<String>,
    /// The first arguments value: its start and, once read, its end.
    args: Option<(usize, Option<usize>)>,
    /// Where reading goes on.
    pos: usize,
    depth: usize,
    in_str: bool,
    esc: bool,
    expect: Expect,
    str_start: usize,
    val_start: usize,
    key: String,
}

impl ObjectScan {
    /// A value of the current key ends at `ve`. The first `name` and arguments count (a
    /// streamed call cannot take back what it sent).
    fn end_value(&mut self, text: &str, args_key: &str, ve: usize) {
        let vs = self.val_start;
        if self.key == "name" && self.name.is_none() {
            self.name = serde_json::from_str::<String>(&text[vs..ve]).ok();
        } else if self.key == args_key && self.args.is_none_or(|(s, _)| s == vs) {
            self.args = Some((vs, Some(ve)));
        }
    }

    /// Reads on through `text` (the same text as last time, grown). `false` when the text
    /// does not start with an object.
    fn advance(&mut self, text: &str, args_key: &str) -> bool {
        if self.end.is_some() {
            return true;
        }
        let from = self.pos;
        for (i, c) in text[from..].char_indices() {
            let i = i + from;
            self.pos = i + c.len_utf8();
            if self.depth == 0 {
                match c {
                    c if c.is_whitespace() => continue,
                    '{' => {
                        self.depth = 1;
                        continue;
                    }
                    _ => return false,
                }
            }
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if c == '\\' {
                    self.esc = true;
                } else if c == '"' {
                    self.in_str = false;
                    if self.depth == 1 {
                        match self.expect {
                            Expect::Key => {
                                self.key = serde_json::from_str(&text[self.str_start..=i])
                                    .unwrap_or_default();
                                self.expect = Expect::Colon;
                            }
                            Expect::In(Kind::Str) => {
                                self.end_value(text, args_key, i + 1);
                                self.expect = Expect::After;
                            }
                            _ => {}
                        }
                    }
                }
                continue;
            }
            match c {
                '"' => {
                    self.in_str = true;
                    if self.depth == 1 {
                        self.str_start = i;
                        if self.expect == Expect::Value {
                            self.val_start = i;
                            self.expect = Expect::In(Kind::Str);
                        }
                    }
                }
                '{' | '[' => {
                    if self.depth == 1 && self.expect == Expect::Value {
                        self.val_start = i;
                        self.expect = Expect::In(Kind::Nested);
                    }
                    self.depth += 1;
                }
                '}' | ']' => {
                    self.depth -= 1;
                    if self.depth == 1 && self.expect == Expect::In(Kind::Nested) {
                        self.end_value(text, args_key, i + 1);
                        self.expect = Expect::After;
                    } else if self.depth == 0 {
                        if self.expect == Expect::In(Kind::Primitive) {
                            self.end_value(text, args_key, i);
                        }
                        self.end = Some(i + 1);
                        return true;
                    }
                }
                ':' if self.depth == 1 && self.expect == Expect::Colon => {
                    self.expect = Expect::Value
                }
                ',' if self.depth == 1 => {
                    if self.expect == Expect::In(Kind::Primitive) {
                        self.end_value(text, args_key, i);
                    }
                    self.expect = Expect::Key;
                }
                c if c.is_whitespace() => {}
                _ if self.depth == 1 && self.expect == Expect::Value => {
                    self.val_start = i;
                    self.expect = Expect::In(Kind::Primitive);
                }
                _ => {}
            }
        }
        if self.key == args_key && self.args.is_none() {
            if let Expect::In(_) = self.expect {
                self.args = Some((self.val_start, None));
            }
        }
        true
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Text,
    /// Inside a group of calls (after the open text).
    Calls,
    /// After a call object, before this close text (`hermes`, a fence).
    Close(&'static str),
}

/// Where a call may open in the text being read.
enum Found {
    /// The family's open text at this offset.
    Markup(usize),
    /// A loose call opening at this offset, its object at the second.
    Loose(usize, usize, Loose),
    /// Something from this offset on may open a call: wait for more text.
    Undecided(usize),
    Nothing,
}

/// Splits one choice's output into content and tool calls; see the module docs.
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    /// The declared functions' names, when loose calls are read (else empty).
    names: std::sync::Arc<[String]>,
    /// Whether the answer has said anything but whitespace (a bare call opens it only).
    spoke: bool,
    /// How the current call was written, when without the family's markup.
    loose: Option<Loose>,
    state: State,
    /// Text not yet turned into events.
    buf: String,
    /// Calls started so far.
    calls: Vec<ParsedCall>,
    /// Bytes of the current call's arguments already sent.
    args_sent: usize,
    /// Whether the current call's start was sent.
    started: bool,
    /// `mistral`: inside the list of calls.
    in_list: bool,
    /// `llama3`: after a call, before a `;` that opens the next or anything else that ends
    /// the calls.
    between: bool,
    /// The object being read.
    scan: ObjectScan,
}

impl ToolCallParser {
    pub fn new(syntax: CallSyntax) -> ToolCallParser {
        let names = if syntax.reads_loose() {
            syntax.names
        } else {
            std::sync::Arc::from(Vec::new())
        };
        ToolCallParser {
            format: syntax.format,
            names,
            spoke: false,
            loose: None,
            state: State::Text,
            buf: String::new(),
            calls: Vec::new(),
            args_sent: 0,
            started: false,
            in_list: false,
            between: false,
            scan: ObjectScan::default(),
        }
    }

    /// The calls so far.
    pub fn calls(&self) -> &[ParsedCall] {
        &self.calls
    }

    /// Text as content: once a call has been made, without its trailing whitespace (which is
    /// content only when more text follows it, and never before or after a call).
    fn after_calls<'t>(&self, text: &'t str) -> &'t str {
        if self.calls.is_empty() {
            text
        } else {
            text.trim_end()
        }
    }

    fn content(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        if !text.is_empty() {
            self.spoke |= !text.trim().is_empty();
            out.push(ToolEvent::Content(text.to_string()));
        }
    }

    /// The earliest place in the buffer where a call opens or may open.
    fn find_opening(&self) -> Found {
        let markup = self.buf.find(self.format.open());
        if self.names.is_empty() {
            return markup.map_or(Found::Nothing, Found::Markup);
        }
        let limit = markup.unwrap_or(self.buf.len());
        let decide =
            |at: usize, form: Loose| match loose::opening(&self.buf[at..], form, &self.names) {
                Opening::Yes(obj) => Some(Found::Loose(at, at + obj, form)),
                Opening::Maybe => Some(Found::Undecided(at)),
                Opening::No => None,
            };
        if !self.spoke && self.calls.is_empty() {
            if let Some(f) = decide(0, Loose::Bare) {
                return f;
            }
        }
        let fences = self.buf[..limit]
            .match_indices('`')
            .find_map(|(at, _)| decide(at, Loose::Fenced));
        match (fences, markup) {
            (Some(f), _) => f,
            (None, Some(at)) => Found::Markup(at),
            (None, None) => Found::Nothing,
        }
    }

    /// Feeds a piece of output; returns what it decided.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// Ends the output: held-back text is content; an unfinished call stays as far as it got.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = self.push("");
        if let State::Close(close) = self.state {
            // A close text cut short is markup still.
            if close.starts_with(self.buf.trim()) {
                self.buf.clear();
            }
        }
        if self.state == State::Text {
            let rest = std::mem::take(&mut self.buf);
            let rest = self.after_calls(&rest).to_string();
            self.content(&rest, &mut out);
        } else if !self.started {
            // An unfinished object that named no function: content.
            let rest = std::mem::take(&mut self.buf);
            let rest = self.after_calls(&rest).to_string();
            self.content(&rest, &mut out);
        } else {
            self.buf.clear();
        }
        out
    }

    /// One step of the state machine; `true` when it changed state and should run again.
    fn step(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        let open = self.format.open();
        match self.state {
            State::Text => {
                let found = self.find_opening();
                if let Found::Loose(at, obj, form) = found {
                    let before = self.after_calls(&self.buf[..at]).to_string();
                    self.content(&before, out);
                    self.buf.drain(..obj);
                    self.state = State::Calls;
                    self.loose = Some(form);
                    self.scan = ObjectScan::default();
                    return true;
                }
                let undecided = match found {
                    Found::Undecided(at) => at,
                    _ => self.buf.len(),
                };
                if let Found::Markup(at) = found {
                    let before = self.after_calls(&self.buf[..at]).to_string();
                    self.content(&before, out);
                    let skip = if self.format.open_is_json() {
                        at
                    } else {
                        at + open.len()
                    };
                    self.buf.drain(..skip);
                    self.state = State::Calls;
                    self.in_list = false;
                    self.between = false;
                    self.scan = ObjectScan::default();
                    return true;
                }
                // Hold back a tail that may be the start of an opening.
                let keep = (1..open.len().min(self.buf.len() + 1))
                    .rev()
                    .find(|&k| {
                        self.buf.is_char_boundary(self.buf.len() - k)
                            && open.starts_with(&self.buf[self.buf.len() - k..])
                    })
                    .unwrap_or(0);
                let held = (self.buf.len() - keep).min(undecided);
                // After a call, trailing whitespace waits for text to follow it.
                let cut = self.after_calls(&self.buf[..held]).len();
                let text: String = self.buf.drain(..cut).collect();
                self.content(&text, out);
                false
            }
            State::Calls => self.step_calls(out),
            State::Close(close) => {
                let trimmed = self.buf.trim_start();
                if let Some(rest) = trimmed.strip_prefix(close) {
                    self.buf = rest.to_string();
                    self.state = State::Text;
                    return true;
                }
                if close.starts_with(trimmed) {
                    return false; // wait for the rest of the close text
                }
                self.state = State::Text;
                true
            }
        }
    }

    /// Drops leading whitespace; the next character, if any.
    fn skip_space(&mut self) -> Option<char> {
        let skip = self.buf.len() - self.buf.trim_start().len();
        self.buf.drain(..skip);
        self.buf.chars().next()
    }

    fn step_calls(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        if self.between {
            match self.skip_space() {
                None => return false,
                Some(';') => {
                    self.buf.drain(..1);
                    self.between = false;
                    self.skip_space();
                    return true;
                }
                Some(_) => {
                    self.between = false;
                    self.state = State::Text;
                    return true;
                }
            }
        }
        // Before an object starts: the list's and the whitespace's markup.
        let fresh = self.scan.pos == 0;
        if self.format == ToolFormat::Mistral && fresh && self.loose.is_none() {
            if !self.in_list {
                match self.skip_space() {
                    None => return false,
                    Some('[') => {
                        self.buf.drain(..1);
                        self.in_list = true;
                    }
                    Some(_) => {
                        self.state = State::Text;
                        return true;
                    }
                }
            }
            let t = self
                .buf
                .trim_start_matches(|c: char| c.is_whitespace() || c == ',');
            let skip = self.buf.len() - t.len();
            self.buf.drain(..skip);
            match self.buf.chars().next() {
                None => return false,
                Some(']') => {
                    self.buf.drain(..1);
                    self.state = State::Text;
                    return true;
                }
                Some(_) => {}
            }
        }
        // Whitespace before a call object is markup, however the output is split.
        if fresh && self.skip_space().is_none() {
            return false;
        }
        let key = self.format.arguments_key();
        if !self.scan.advance(&self.buf, key) {
            // Not a call object after all: the rest is text.
            self.scan = ObjectScan::default();
            self.state = State::Text;
            return true;
        }
        let scan = &self.scan;
        if !self.started {
            let Some(name) = scan.name.clone() else {
                let Some(end) = scan.end else {
                    return false;
                };
                // An object that names no function is not a call: it is content.
                let text: String = self.buf.drain(..end).collect();
                self.scan = ObjectScan::default();
                self.content(&text, out);
                return self.after_object();
            };
            let index = self.calls.len();
            self.calls.push(ParsedCall {
                name: name.clone(),
                arguments: String::new(),
            });
            out.push(ToolEvent::CallStart { index, name });
            self.started = true;
            self.args_sent = 0;
        }
        let index = self.calls.len() - 1;
        let scan = &self.scan;
        if let Some((start, end)) = scan.args {
            let end = end.unwrap_or(self.buf.len());
            if end > start + self.args_sent {
                let text = self.buf[start + self.args_sent..end].to_string();
                self.args_sent += text.len();
                self.calls[index].arguments.push_str(&text);
                out.push(ToolEvent::Arguments { index, text });
            }
        }
        let scan = &self.scan;
        let Some(end) = scan.end else {
            return false;
        };
        if scan.args.is_none() && self.calls[index].arguments.is_empty() {
            // A call without arguments: an empty object, as OpenAI's clients expect.
            self.calls[index].arguments.push_str("{}");
            out.push(ToolEvent::Arguments {
                index,
                text: "{}".into(),
            });
        }
        self.buf.drain(..end);
        self.scan = ObjectScan::default();
        self.started = false;
        self.after_object()
    }

    /// Where the format goes after an object: its close text, the list's next element, or
    /// a `;` and the next call.
    fn after_object(&mut self) -> bool {
        match self.loose.take() {
            Some(Loose::Fenced) => self.state = State::Close(FENCE),
            Some(Loose::Bare) => self.state = State::Text,
            None => match self.format {
                ToolFormat::Hermes => self.state = State::Close(self.format.close().unwrap_or("")),
                ToolFormat::Mistral => {}
                ToolFormat::Llama3 => self.between = true,
            },
        }
        true
    }
}

/// A choice's output split into events: through `parser` when the request has tools (all
/// of it when `last`, held-back text included), else all content.
pub fn split_output(parser: Option<&mut ToolCallParser>, text: &str, last: bool) -> Vec<ToolEvent> {
    match parser {
        None if text.is_empty() => Vec::new(),
        None => vec![ToolEvent::Content(text.to_string())],
        Some(p) => {
            let mut ev = p.push(text);
            if last {
                ev.extend(p.finish());
            }
            ev
        }
    }
}

/// Runs a whole output through the parser: the content and the calls.
pub fn parse_whole(syntax: &CallSyntax, text: &str) -> (String, Vec<ParsedCall>) {
    let mut p = ToolCallParser::new(syntax.clone());
    let mut content = String::new();
    for ev in p.push(text).into_iter().chain(p.finish()) {
        if let ToolEvent::Content(c) = ev {
            content.push_str(&c);
        }
    }
    (content, p.calls.clone())
}

/// Runs an output through the parser in pieces of `step` bytes (widened to character
/// boundaries), as a stream would, and rebuilds the content and calls from the events alone:
/// what a client reassembles. Errors when the events come out of order (a call's start out
/// of sequence, arguments before their call's start).
pub fn parse_in_pieces(
    syntax: &CallSyntax,
    text: &str,
    step: usize,
) -> Result<(String, Vec<ParsedCall>), String> {
    let mut p = ToolCallParser::new(syntax.clone());
    let mut events = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let mut j = (i + step.max(1)).min(text.len());
        while !text.is_char_boundary(j) {
            j += 1;
        }
        events.extend(p.push(&text[i..j]));
        i = j;
    }
    events.extend(p.finish());
    let mut content = String::new();
    let mut calls: Vec<ParsedCall> = Vec::new();
    for ev in events {
        match ev {
            ToolEvent::Content(c) => content.push_str(&c),
            ToolEvent::CallStart { index, name } if index == calls.len() => {
                calls.push(ParsedCall {
                    name,
                    arguments: String::new(),
                });
            }
            ToolEvent::Arguments { index, text } if index + 1 == calls.len() => {
                calls[index].arguments.push_str(&text);
            }
            ev => return Err(format!("out of order: {ev:?} after {} calls", calls.len())),
        }
    }
    Ok((content, calls))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format, reading loose calls of the functions the cases declare.
    fn syntax(format: ToolFormat) -> CallSyntax {
        let names = ["get_weather", "now", "a", "b", "f", "w"];
        CallSyntax::new(format, names.map(String::from))
    }

    fn streamed(format: ToolFormat, text: &str, step: usize) -> (String, Vec<ParsedCall>) {
        parse_in_pieces(&syntax(format), text, step).unwrap()
    }

    fn whole(format: ToolFormat, text: &str) -> (String, Vec<ParsedCall>) {
        parse_whole(&syntax(format), text)
    }

    fn call(name: &str, args: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn every_format_at_every_split() {
        let cases = [
            (
                ToolFormat::Hermes,
                "Let me check. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"}\", \"n\": [1, {\"x\": 2}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
                "Let me check. ",
                vec![
                    call("get_weather", "{\"city\": \"Paris \\\"}\", \"n\": [1, {\"x\": 2}]}"),
                    call("now", "{}"),
                ],
            ),
            (
                ToolFormat::Hermes,
                "No tools needed: 1 < 2 and <tool is not a call.",
                "No tools needed: 1 < 2 and <tool is not a call.",
                vec![],
            ),
            (
                ToolFormat::Llama3,
                "{\"name\": \"a\", \"parameters\": {\"k\": \"é\"}}; {\"name\": \"b\", \"parameters\": {}}",
                "",
                vec![call("a", "{\"k\": \"é\"}"), call("b", "{}")],
            ),
            (
                ToolFormat::Mistral,
                "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": 1}}, {\"arguments\": {\"z\": true}, \"name\": \"b\"}]",
                "",
                vec![call("a", "{\"q\": 1}"), call("b", "{\"z\": true}")],
            ),
            (
                ToolFormat::Hermes,
                "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
                "",
                vec![call("f", "{}")],
            ),
            (
                ToolFormat::Hermes,
                "<tool_call>\n{\"tool\": \"x\"}\n</tool_call>\nDone.",
                "{\"tool\": \"x\"}\nDone.",
                vec![],
            ),
            // Calls without the family's markup: a bare object opening the answer, a fenced
            // block anywhere; only when the object names a declared function first.
            (
                ToolFormat::Hermes,
                " \n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n",
                "",
                vec![call("get_weather", "{\"city\": \"Oslo\"}")],
            ),
            (
                ToolFormat::Hermes,
                "Here:\n```json\n{\"name\": \"now\", \"arguments\": {}}\n```\nDone `x`.",
                "Here:\n\nDone `x`.",
                vec![call("now", "{}")],
            ),
            (
                ToolFormat::Mistral,
                "```\n{ \"name\" : \"a\", \"arguments\": {\"q\": 1}}\n```",
                "",
                vec![call("a", "{\"q\": 1}")],
            ),
            (
                ToolFormat::Hermes,
                "{\"name\": \"Bob\", \"age\": 3}",
                "{\"name\": \"Bob\", \"age\": 3}",
                vec![],
            ),
            (
                ToolFormat::Hermes,
                "```json\n{\"city\": \"Oslo\", \"name\": \"now\"}\n```",
                "```json\n{\"city\": \"Oslo\", \"name\": \"now\"}\n```",
                vec![],
            ),
            (
                ToolFormat::Hermes,
                "Call {\"name\": \"now\", \"arguments\": {}} later, ``` or ``",
                "Call {\"name\": \"now\", \"arguments\": {}} later, ``` or ``",
                vec![],
            ),
        ];
        for (format, text, content, calls) in cases {
            assert_eq!(
                whole(format, text),
                (content.to_string(), calls.clone()),
                "{text}"
            );
            for step in 1..=text.len() {
                assert_eq!(
                    streamed(format, text, step),
                    (content.to_string(), calls.clone()),
                    "{text} in pieces of {step}"
                );
            }
        }
    }

    #[test]
    fn a_long_argument_streams_whole() {
        let long = "x".repeat(200_000);
        let text = format!(
            "<tool_call>\n{{\"name\": \"w\", \"arguments\": {{\"s\": \"{long}\"}}}}\n</tool_call>"
        );
        let (content, calls) = streamed(ToolFormat::Hermes, &text, 1);
        assert_eq!(content, "");
        assert_eq!(calls, vec![call("w", &format!("{{\"s\": \"{long}\"}}"))]);
    }

    #[test]
    fn an_unfinished_call_keeps_what_it_has() {
        let (content, calls) = whole(
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"par",
        );
        assert_eq!(content, "");
        assert_eq!(calls, vec![call("f", "{\"a\": \"par")]);
        let (content, calls) = whole(
            ToolFormat::Hermes,
            "```json\n{\"name\": \"w\", \"arguments\": {\"s",
        );
        assert_eq!(content, "");
        assert_eq!(calls, vec![call("w", "{\"s")]);
    }

    #[test]
    fn loose_calls_need_the_declared_names() {
        let bare = "{\"name\": \"now\", \"arguments\": {}}";
        for format in ToolFormat::ALL {
            let (content, calls) = parse_whole(&CallSyntax::markup_only(format), bare);
            if format == ToolFormat::Llama3 {
                assert_eq!((content.as_str(), calls.len()), ("", 1), "its own markup");
            } else {
                assert_eq!((content.as_str(), calls.len()), (bare, 0), "{format:?}");
            }
        }
    }
}
