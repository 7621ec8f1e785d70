//! The tool-call formats of the model families and the grammars that enforce them.

use super::loose::{compact_openings, CallSyntax, Loose, FENCE};
use super::request::{ToolChoice, ToolRequest};
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{StructuredOutput, Trigger};
use serde_json::{json, Value};

/// How a model family writes its tool calls (see the module docs of [`super`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
}

impl ToolFormat {
    /// The names `--tool-call-parser` takes.
    pub const NAMES: &'static [&'static str] = &["hermes", "llama3", "mistral"];

    pub const ALL: [ToolFormat; 3] = [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral];

    pub fn from_name(name: &str) -> Option<ToolFormat> {
        match name {
            "hermes" => Some(ToolFormat::Hermes),
            "llama3" | "llama3_json" => Some(ToolFormat::Llama3),
            "mistral" => Some(ToolFormat::Mistral),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Mistral => "mistral",
        }
    }

    /// The format a chat template asks for, from its source; `None` when the template does
    /// not take tools or its format is not one of these.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if !template.contains("tools") {
            return None;
        }
        if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("[TOOL_CALLS]") || template.contains("[AVAILABLE_TOOLS]") {
            Some(ToolFormat::Mistral)
        } else if template.contains("<|start_header_id|>") {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    /// The text that opens a call (for `llama3`, the start of its JSON object).
    pub fn open(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Llama3 => "{\"name\"",
            ToolFormat::Mistral => "[TOOL_CALLS]",
        }
    }

    /// The text that closes a call block, when the format has one.
    pub fn close(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes => Some("</tool_call>"),
            _ => None,
        }
    }

    /// The key of a call's arguments.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// Whether calls written without the markup (a bare or fenced call object,
    /// [`super::loose`]) are read and triggered: not for `llama3`, whose markup is the bare
    /// object itself.
    pub fn takes_loose_calls(self) -> bool {
        self != ToolFormat::Llama3
    }

    /// How a request's output is read for calls: this format and the request's functions.
    pub fn syntax(self, req: &ToolRequest) -> CallSyntax {
        CallSyntax::new(self, req.tools.iter().map(|t| t.name.clone()))
    }

    /// Whether the open text is kept in the call's JSON (`llama3`) rather than stripped.
    pub fn open_is_json(self) -> bool {
        self == ToolFormat::Llama3
    }

    /// The schema of one call to any of `req`'s callable tools.
    fn call_schema(self, req: &ToolRequest) -> Value {
        let key = self.arguments_key();
        let calls: Vec<Value> = req
            .tools
            .iter()
            .filter(|t| match &req.choice {
                ToolChoice::Function(n) => &t.name == n,
                _ => true,
            })
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, key: t.parameters},
                    "required": ["name", key],
                    "additionalProperties": false
                })
            })
            .collect();
        match <[Value; 1]>::try_from(calls) {
            Ok([one]) => one,
            Err(many) => json!({"anyOf": many}),
        }
    }

    /// A `%json` schema with the calls' separators, as the families' templates show them,
    /// `{"name": "f", "arguments": {...}}`: one space after `:` and `,`, no line breaks (a
    /// small model given free whitespace drifts into pretty-printing, and from there into
    /// repeating itself). llguidance reads these settings at the top of the schema only.
    fn compact(mut schema: Value) -> Value {
        schema["x-guidance"] = json!({
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": "
        });
        schema
    }

    /// Whether the format's markup is made of special tokens of this vocabulary (which the
    /// detokenizer would leave out of the text unless told otherwise).
    pub fn markup_is_special(self, tok: &Tokenizer) -> bool {
        [self.open(), self.close().unwrap_or("")]
            .iter()
            .filter_map(|m| tok.token_to_id(m))
            .any(|id| tok.is_special(id))
    }

    /// A literal in the grammar: the token, when the text is one token of the vocabulary
    /// (so the model writes it as it was trained to), else the text.
    fn literal(text: &str, tok: &Tokenizer) -> String {
        match tok.token_to_id(text) {
            Some(id) => format!("<[{id}]>"),
            None => serde_json::to_string(text).unwrap_or_default(),
        }
    }

    /// The constraint for a request's tool calls: the calls only (`required`, a named
    /// function), or free text until a call opens (`auto`); `None` for `none`. With `auto`,
    /// the loose openings of a call of a declared function (a bare object opening the answer,
    /// a fenced one anywhere, in their compact spelling) trigger the grammar too, which then
    /// takes one such call.
    pub fn constraint(self, req: &ToolRequest, tok: &Tokenizer) -> Option<StructuredOutput> {
        let many = req.parallel && !matches!(req.choice, ToolChoice::Function(_));
        let schema = Self::compact(self.call_schema(req));
        // `calls`: the family's markup around one or more calls.
        let calls = match self {
            ToolFormat::Hermes => {
                let open = Self::literal("<tool_call>", tok);
                let close = Self::literal("</tool_call>", tok);
                let rest = if many { " (\"\\n\" call)*" } else { "" };
                format!("calls: call{rest}\ncall: {open} \"\\n\" body \"\\n\" {close}\nbody: %json {schema}\n")
            }
            ToolFormat::Llama3 => {
                let rest = if many { " (\"; \" body)*" } else { "" };
                format!("calls: body{rest}\nbody: %json {schema}\n")
            }
            ToolFormat::Mistral => {
                let open = Self::literal("[TOOL_CALLS]", tok);
                let mut list =
                    json!({"type": "array", "items": self.call_schema(req), "minItems": 1});
                if !many {
                    list["maxItems"] = json!(1);
                }
                let list = Self::compact(list);
                format!("calls: {open} body\nbody: %json {list}\n")
            }
        };
        match req.choice {
            ToolChoice::None => None,
            ToolChoice::Required | ToolChoice::Function(_) => {
                Some(StructuredOutput::Lark(format!("start: calls\n{calls}")))
            }
            ToolChoice::Auto if !self.takes_loose_calls() => Some(StructuredOutput::Triggered {
                triggers: vec![Trigger::anywhere(self.open())],
                grammar: format!("start: calls\n{calls}"),
            }),
            ToolChoice::Auto => {
                let fence = serde_json::to_string(FENCE).unwrap_or_default();
                let grammar = format!(
                    "start: calls | loose\n{calls}loose: one | {fence} \"json\\n\" one \"\\n\" {fence} | {fence} \"\\n\" one \"\\n\" {fence}\none: %json {schema}\n"
                );
                let mut triggers = vec![Trigger::anywhere(self.open())];
                for t in &req.tools {
                    for (text, form) in compact_openings(&t.name) {
                        triggers.push(match form {
                            Loose::Bare => Trigger::at_start(text),
                            Loose::Fenced => Trigger::anywhere(text),
                        });
                    }
                }
                Some(StructuredOutput::Triggered { triggers, grammar })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::parser::{parse_whole, ParsedCall};
    use crate::tools::request::read;
    use ferrum_engine::GuideCompiler;
    use ferrum_tokenizer::load_special_tokens;

    /// The tiny fixture's byte-level tokenizer (49k tokens, no tool tokens).
    fn tokenizer() -> Tokenizer {
        let dir = ferrum_testdata::fixture("tiny-smollm");
        let special = load_special_tokens(&dir).unwrap();
        Tokenizer::from_json_file(&dir.join("tokenizer.json"), special).unwrap()
    }

    /// Each format's grammar accepts its own call text token by token, ends there, and the
    /// parser reads the same call back; `auto` leaves text before the call free.
    #[test]
    fn grammars_accept_their_calls_and_the_parser_reads_them() {
        let tok = tokenizer();
        let eos = tok.special().stop_token_ids.clone();
        let compiler = GuideCompiler::new(&tok, &eos, tok.vocab_size()).unwrap();
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]);
        let cases = [
            (ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
            (ToolFormat::Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"),
            (ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"),
        ];
        let want = vec![ParsedCall {
            name: "get_weather".into(),
            arguments: "{\"city\": \"Oslo\"}".into(),
        }];
        for (format, call) in cases {
            for (choice, prefix) in [("required", ""), ("auto", "Let me look that up. ")] {
                let req = read(Some(&tools), Some(&json!(choice)), Some(&json!(false)))
                    .unwrap()
                    .unwrap();
                let spec = format.constraint(&req, &tok).unwrap();
                let mut g = compiler
                    .compile(&spec)
                    .unwrap_or_else(|e| panic!("{format:?}: {e}"));
                let text = format!("{prefix}{call}");
                for t in tok.encode(&text, false).unwrap() {
                    g.compute_mask().unwrap();
                    assert!(
                        !g.is_active() || g.allows(t),
                        "{format:?} {choice}: token {t} of {text:?} refused"
                    );
                    g.consume(t).unwrap();
                }
                assert!(
                    g.is_stopped(),
                    "{format:?} {choice}: the grammar should be complete"
                );
                assert_eq!(
                    parse_whole(&format.syntax(&req), &text),
                    (prefix.to_string(), want.clone())
                );
            }
        }
    }

    /// With `auto`, a call written without the family's markup (bare, opening the answer;
    /// fenced, anywhere) triggers the grammar from its opening on and is read as a call; JSON
    /// that does not call a declared function, or a bare object after prose, stays free text.
    #[test]
    fn loose_calls_trigger_the_grammar_and_are_read() {
        let tok = tokenizer();
        let eos = tok.special().stop_token_ids.clone();
        let compiler = GuideCompiler::new(&tok, &eos, tok.vocab_size()).unwrap();
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]);
        let req = read(Some(&tools), Some(&json!("auto")), None)
            .unwrap()
            .unwrap();
        let object = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}";
        let want = vec![ParsedCall {
            name: "get_weather".into(),
            arguments: "{\"city\": \"Oslo\"}".into(),
        }];
        // (text, the grammar takes over, calls read)
        let cases = [
            (object.to_string(), true, want.clone()),
            (format!("\n{object}"), true, want.clone()),
            (
                format!("Here it is:\n```json\n{object}\n```"),
                true,
                want.clone(),
            ),
            (format!("```\n{object}\n```"), true, want.clone()),
            (format!("I would call {object}"), false, vec![]),
            (
                "{\"name\": \"Oslo\", \"arguments\": {}}".into(),
                false,
                vec![],
            ),
            ("```json\n{\"city\": \"Oslo\"}\n```".into(), false, vec![]),
        ];
        for format in [ToolFormat::Hermes, ToolFormat::Mistral] {
            let spec = format.constraint(&req, &tok).unwrap();
            let g = compiler
                .compile(&spec)
                .unwrap_or_else(|e| panic!("{format:?}: {e}"));
            for (text, constrained, calls) in &cases {
                let mut g = g.fork();
                let mut was_active = false;
                for t in tok.encode(text, false).unwrap() {
                    g.compute_mask().unwrap();
                    assert!(
                        !g.is_active() || g.allows(t),
                        "{format:?}: token {t} of {text:?} refused"
                    );
                    g.consume(t).unwrap();
                    was_active |= g.is_active();
                }
                assert_eq!(was_active, *constrained, "{format:?}: {text:?}");
                if *constrained {
                    assert!(g.is_stopped(), "{format:?}: {text:?} should be complete");
                }
                let (_, read) = parse_whole(&format.syntax(&req), text);
                assert_eq!(&read, calls, "{format:?}: {text:?}");
            }
        }
        // The call is constrained from its opening: after `{"name": "now", ` only the
        // arguments key may follow.
        let spec = ToolFormat::Hermes.constraint(&req, &tok).unwrap();
        let mut g = compiler.compile(&spec).unwrap();
        for t in tok.encode("{\"name\": \"now\", ", false).unwrap() {
            g.compute_mask().unwrap();
            g.consume(t).unwrap();
        }
        assert!(g.is_active());
        let refused = tok
            .encode("\"city\": ", false)
            .unwrap()
            .into_iter()
            .any(|t| {
                g.compute_mask().unwrap();
                !g.allows(t) || g.consume(t).is_err()
            });
        assert!(refused, "only \"arguments\" may follow");
    }

    #[test]
    fn formats_from_templates() {
        assert_eq!(
            ToolFormat::detect("{% if tools %}<tool_call>{{ x }}</tool_call>{% endif %}"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect("{% if tools %}[AVAILABLE_TOOLS]{% endif %}"),
            Some(ToolFormat::Mistral)
        );
        assert_eq!(
            ToolFormat::detect("<|start_header_id|>{% if tools %}{% endif %}"),
            Some(ToolFormat::Llama3)
        );
        assert_eq!(ToolFormat::detect("<|im_start|>{{ m }}"), None);
        for n in ToolFormat::NAMES {
            assert_eq!(ToolFormat::from_name(n).map(ToolFormat::name), Some(*n));
        }
    }
}
