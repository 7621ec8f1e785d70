//! [`GuideCompiler`]: the tokenizer's trie and llguidance's parser factory, and the
//! translation of each [`StructuredOutput`] form into an llguidance grammar.
//!
//! JSON under a constraint (a schema or any object) has bounded whitespace: between two
//! tokens of JSON (outside strings) at most one line break and 16 spaces or tabs
//! (`JSON_WHITESPACE`), so compact and pretty-printed JSON both pass but no run of whitespace
//! can go on. Free whitespace is a loop a small model falls into: after a line break it may
//! write spaces and line breaks until its token limit, and the answer is not JSON. A schema
//! that sets its own `x-guidance` options keeps them.

use super::gbnf;
use super::matcher::Watched;
use super::Guide;
use crate::{EngineError, Result};
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{StructuredOutput, TokenId};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use std::sync::Arc;

/// The tokenizer as llguidance sees it: the trie of token bytes. Text is tokenized greedily
/// over the trie, byte for byte (a SentencePiece tokenizer's own encoding would add its dummy
/// prefix space), and declared non-canonical, so llguidance never forces tokens by it.
struct TokenizerView {
    trie: TokTrie,
}

impl TokenizerEnv for TokenizerView {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Compiles constraints for one tokenizer. Building it walks the whole vocabulary (tens of
/// milliseconds for 150k tokens); build it once and share it.
pub struct GuideCompiler {
    factory: ParserFactory,
    /// The model's vocabulary (logits rows); may exceed the tokenizer's.
    model_vocab: usize,
    eos: Arc<[TokenId]>,
}

impl std::fmt::Debug for GuideCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuideCompiler")
            .field("model_vocab", &self.model_vocab)
            .finish_non_exhaustive()
    }
}

/// The error of a constraint that cannot be used.
fn constraint_err(spec: &StructuredOutput, msg: impl std::fmt::Display) -> EngineError {
    EngineError::Constraint {
        kind: spec.kind(),
        msg: msg.to_string(),
    }
}

/// The whitespace allowed between two tokens of constrained JSON (llguidance's lexer skips it
/// once, or not at all, between lexemes): 1 to 16 blanks, or one line break and up to 16
/// blanks of indentation (eight levels of two spaces, four of four).
const JSON_WHITESPACE: &str = r"(?:[\x20\x09]{1,16}|\x0D?\x0A[\x20\x09]{0,16})";

/// `schema` with llguidance's options: bounded whitespace (module docs) unless the schema sets
/// its own `x-guidance` options, and, not `strict`, keywords llguidance cannot enforce left
/// out (its `lenient` mode) unless those options say otherwise. `true` (anything) becomes
/// `{}`, which says the same and can carry the options.
fn json_options(schema: serde_json::Value, strict: bool) -> serde_json::Value {
    let mut schema = match schema {
        serde_json::Value::Bool(true) => serde_json::Value::Object(Default::default()),
        other => other,
    };
    if let Some(object) = schema.as_object_mut() {
        let options = match object.remove("x-guidance") {
            Some(serde_json::Value::Object(mut own)) => {
                if !strict {
                    own.entry("lenient").or_insert(true.into());
                }
                serde_json::Value::Object(own)
            }
            // Not options at all: llguidance says what is wrong with them.
            Some(other) => other,
            None => {
                let ours = JsonCompileOptions {
                    whitespace_pattern: Some(JSON_WHITESPACE.into()),
                    lenient: !strict,
                    ..JsonCompileOptions::default()
                };
                serde_json::to_value(ours).unwrap_or_default()
            }
        };
        object.insert("x-guidance".into(), options);
    }
    schema
}

/// `s` as a regex matching exactly `s`.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == ' ' || !c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\x{{{:x}}}", c as u32));
        }
    }
    out
}

impl GuideCompiler {
    /// `eos` are the ids that end a sequence (the model's stop ids); a complete constraint
    /// allows exactly these. `model_vocab` is the number of logits per row.
    pub fn new(tokenizer: &Tokenizer, eos: &[TokenId], model_vocab: usize) -> Result<Self> {
        let unusable = |msg: String| EngineError::Constraint {
            kind: "structured output",
            msg,
        };
        let &first_eos = eos
            .first()
            .ok_or_else(|| unusable("the model has no end-of-sequence token".into()))?;
        let mut words = tokenizer.token_bytes()?;
        for (id, w) in words.iter_mut().enumerate() {
            if tokenizer.is_special(id as TokenId) {
                w.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            }
        }
        let info = TokRxInfo::new(words.len() as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(TokenizerView { trie });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| unusable(format!("cannot build the token trie: {e}")))?;
        factory.quiet();
        Ok(GuideCompiler {
            factory,
            model_vocab,
            eos: eos.into(),
        })
    }

    /// The llguidance grammar of a constraint.
    fn grammar(spec: &StructuredOutput) -> Result<TopLevelGrammar> {
        Ok(match spec {
            StructuredOutput::JsonSchema {
                schema: text,
                strict,
            } => {
                let schema: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| constraint_err(spec, format!("the schema is not JSON: {e}")))?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(constraint_err(
                        spec,
                        "a schema must be a JSON object (or true/false)",
                    ));
                }
                TopLevelGrammar::from_json_schema(json_options(schema, *strict))
            }
            StructuredOutput::JsonObject => {
                let mut object = serde_json::Map::new();
                object.insert("type".into(), "object".into());
                TopLevelGrammar::from_json_schema(json_options(object.into(), true))
            }
            StructuredOutput::Regex(rx) => TopLevelGrammar::from_regex(rx),
            StructuredOutput::Choice(choices) => {
                let alts: Vec<String> = choices.iter().map(|c| regex_escape(c)).collect();
                TopLevelGrammar::from_regex(&format!("(?:{})", alts.join("|")))
            }
            StructuredOutput::Lark(src) | StructuredOutput::Triggered { grammar: src, .. } => {
                TopLevelGrammar::from_lark(src.clone())
            }
            StructuredOutput::Gbnf(src) => {
                let lark = gbnf::to_lark(src).map_err(|e| constraint_err(spec, e))?;
                TopLevelGrammar::from_lark(lark)
            }
        })
    }

    /// Compiles a constraint and computes its first mask; errors name what does not compile.
    pub fn compile(&self, spec: &StructuredOutput) -> Result<Guide> {
        let grammar = Self::grammar(spec)?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| constraint_err(spec, e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(constraint_err(spec, e));
        }
        let mut guide = Guide::new(matcher, spec.kind(), self.model_vocab, self.eos.clone());
        if let StructuredOutput::Triggered { triggers, .. } = spec {
            if triggers.is_empty() {
                return Err(constraint_err(spec, "it has no trigger"));
            }
            let trie = self.factory.tok_env().tok_trie();
            let mut watched = Vec::with_capacity(triggers.len());
            for trigger in triggers {
                let text = &trigger.text;
                if text.is_empty() {
                    return Err(constraint_err(spec, "a trigger is empty"));
                }
                // The trigger as one token of the vocabulary (a special one is marked in the
                // trie): a lookup, not a walk over every token.
                let marked = [&[TokTrie::SPECIAL_TOKEN_MARKER], text.as_bytes()].concat();
                let as_token = trie
                    .token_id(text.as_bytes())
                    .or_else(|| trie.token_id(&marked));
                // The grammar must accept the trigger as the model would produce it.
                let mut probe = guide.fork();
                let opens = match as_token {
                    Some(t) => probe.consume(t),
                    None => trie
                        .greedy_tokenize(text.as_bytes())
                        .iter()
                        .try_for_each(|&t| probe.consume(t)),
                };
                opens.map_err(|e| {
                    constraint_err(
                        spec,
                        format!("the grammar does not start with its trigger {text:?}: {e}"),
                    )
                })?;
                watched.push(Watched {
                    bytes: text.as_bytes().to_vec(),
                    token: as_token,
                    at_start: trigger.at_start,
                });
            }
            guide.set_triggers(watched, self.factory.tok_env().clone());
            return Ok(guide);
        }
        guide.compute_mask().map_err(|e| constraint_err(spec, e))?;
        Ok(guide)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_schemas_get_bounded_whitespace_unless_they_say_otherwise() {
        let opts = |v: &serde_json::Value| v["x-guidance"]["whitespace_pattern"].clone();
        let s = json_options(serde_json::json!({"type": "object"}), true);
        assert_eq!(opts(&s), JSON_WHITESPACE);
        assert_eq!(s["type"], "object");
        assert_eq!(s["x-guidance"]["lenient"], false);
        assert_eq!(
            opts(&json_options(serde_json::json!(true), true)),
            JSON_WHITESPACE
        );
        let no = serde_json::json!(false);
        assert_eq!(json_options(no.clone(), false), no);
        let own = serde_json::json!({"x-guidance": {"whitespace_flexible": true}});
        assert_eq!(json_options(own.clone(), true), own);
        // Not strict: lenient, unless the schema's own options say otherwise.
        let s = json_options(serde_json::json!({"type": "object"}), false);
        assert_eq!(
            (opts(&s), &s["x-guidance"]["lenient"]),
            (JSON_WHITESPACE.into(), &true.into())
        );
        let own = serde_json::json!({"x-guidance": {"lenient": false}});
        assert_eq!(json_options(own.clone(), false), own);
    }

    #[test]
    fn regex_escape_leaves_no_metacharacter() {
        assert_eq!(regex_escape("a.b"), "a\\x{2e}b");
        assert_eq!(regex_escape("(x|y)*"), "\\x{28}x\\x{7c}y\\x{29}\\x{2a}");
        assert_eq!(regex_escape("héllo wörld"), "héllo wörld");
    }
}
