//! Structured-output masks against hand-checked cases, on two small hand-built tokenizers: a
//! byte-level BPE one (every byte a token, plus merged tokens) and a SentencePiece-style one
//! with byte fallback. Covers multi-byte UTF-8 split across tokens, tokens that span a grammar
//! boundary, special tokens, EOS only when the constraint is complete, and the GBNF
//! translation of every GBNF construct (strings accepted and refused byte by byte).
#![allow(clippy::unwrap_used)]

use ferrum_engine::{Guide, GuideCompiler};
use ferrum_tokenizer::{SpecialTokens, Tokenizer};
use ferrum_types::{StructuredOutput, TokenId, Trigger};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// GPT-2's byte -> character map.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let skipped = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + skipped).unwrap()
}

fn byte_level_name(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_char(b)).collect()
}

fn write_tokenizer(name: &str, json: &Value) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ferrum-guide-{}-{name}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, serde_json::to_vec(json).unwrap()).unwrap();
    path
}

const EOS: TokenId = 262;
const OTHER_SPECIAL: TokenId = 263;

/// Ids 0..256: the bytes in order; then merged tokens; 262 `<|end|>` (EOS), 263 `<|tool|>`
/// (special, never allowed).
const MERGED: &[&[u8]] = &[b"ab", "é".as_bytes(), b"\"}", b"{\"", b"x\"", b"bc"];

fn byte_level() -> Arc<Tokenizer> {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_level_name(&[b]), json!(b));
    }
    let mut merges = Vec::new();
    for (i, m) in MERGED.iter().enumerate() {
        vocab.insert(byte_level_name(m), json!(256 + i));
        // Merging the first byte's name with the rest's.
        merges.push(json!([byte_level_name(&m[..1]), byte_level_name(&m[1..])]));
    }
    // "é" is two bytes: its merge is of those two single-byte tokens, already listed.
    let added = json!([
        {"id": EOS, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": OTHER_SPECIAL, "content": "<|tool|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
    ]);
    let tj = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    });
    let path = write_tokenizer("byte-level", &tj);
    let special = SpecialTokens {
        eos_token_id: Some(EOS),
        ..SpecialTokens::default()
    };
    Arc::new(Tokenizer::from_json_file(&path, special).unwrap())
}

fn compile(tok: &Arc<Tokenizer>, spec: StructuredOutput) -> Guide {
    GuideCompiler::new(tok, &[EOS], tok.vocab_size())
        .unwrap()
        .compile(&spec)
        .unwrap()
}

fn compile_err(tok: &Arc<Tokenizer>, spec: StructuredOutput) -> String {
    GuideCompiler::new(tok, &[EOS], tok.vocab_size())
        .unwrap()
        .compile(&spec)
        .unwrap_err()
        .to_string()
}

fn allowed(g: &mut Guide, vocab: usize) -> Vec<TokenId> {
    g.compute_mask().unwrap();
    (0..vocab as TokenId).filter(|&t| g.allows(t)).collect()
}

fn merged(bytes: &[u8]) -> TokenId {
    256 + MERGED.iter().position(|m| *m == bytes).unwrap() as TokenId
}

/// Feeds `text` one byte token at a time; whether every byte was allowed and EOS is allowed
/// at the end.
fn accepts(g: &Guide, text: &str) -> bool {
    let mut g = g.fork();
    for &b in text.as_bytes() {
        g.compute_mask().unwrap();
        if !g.allows(b as TokenId) {
            return false;
        }
        g.consume(b as TokenId).unwrap();
    }
    g.compute_mask().unwrap();
    g.allows(EOS)
}

#[test]
fn regex_mask_with_multibyte_utf8_split_across_tokens() {
    let tok = byte_level();
    let v = tok.vocab_size();
    let mut g = compile(&tok, StructuredOutput::Regex("ab|é".into()));
    // 'a', 0xC3 (the first byte of é), "ab" and "é"; not 'b', not 0xA9, not EOS.
    let mut want = vec![b'a' as TokenId, 0xC3, merged(b"ab"), merged("é".as_bytes())];
    want.sort();
    assert_eq!(allowed(&mut g, v), want);
    let mut half = g.fork();
    half.consume(0xC3).unwrap();
    // Only é's second byte completes the character.
    assert_eq!(allowed(&mut half, v), vec![0xA9]);
    half.consume(0xA9).unwrap();
    assert_eq!(allowed(&mut half, v), vec![EOS]);
    g.consume(b'a' as TokenId).unwrap();
    assert_eq!(allowed(&mut g, v), vec![b'b' as TokenId]);
    g.consume(b'b' as TokenId).unwrap();
    assert_eq!(allowed(&mut g, v), vec![EOS]);
    g.consume(EOS).unwrap();
    assert!(g.is_stopped());
}

#[test]
fn tokens_may_span_a_grammar_boundary() {
    let tok = byte_level();
    let v = tok.vocab_size();
    let mut g = compile(
        &tok,
        StructuredOutput::Lark("start: \"a\" (\"b\" | \"c\")".into()),
    );
    assert_eq!(allowed(&mut g, v), vec![b'a' as TokenId, merged(b"ab")]);
    // "bc" spans the end of the grammar: refused.
    g.consume(b'a' as TokenId).unwrap();
    assert_eq!(allowed(&mut g, v), vec![b'b' as TokenId, b'c' as TokenId]);
    // A JSON object's closing `"}` spans the end of a string and of the object.
    let schema = json!({"type": "object", "properties": {"x": {"type": "string"}},
                        "required": ["x"], "additionalProperties": false});
    let mut g = compile(
        &tok,
        StructuredOutput::JsonSchema {
            schema: schema.to_string(),
            strict: true,
        },
    );
    for t in [
        merged(b"{\""),
        merged(b"x\""),
        b':' as TokenId,
        b'"' as TokenId,
        b'v' as TokenId,
    ] {
        g.compute_mask().unwrap();
        assert!(g.allows(t), "token {t} refused");
        g.consume(t).unwrap();
    }
    g.compute_mask().unwrap();
    assert!(g.allows(merged(b"\"}")));
    assert!(!g.allows(EOS));
    g.consume(merged(b"\"}")).unwrap();
    assert_eq!(allowed(&mut g, v), vec![EOS]);
}

#[test]
fn special_tokens_are_never_allowed_and_eos_only_at_the_end() {
    let tok = byte_level();
    let v = tok.vocab_size();
    let mut g = compile(&tok, StructuredOutput::Regex("(?s:.*)".into()));
    let a = allowed(&mut g, v);
    assert!(!a.contains(&OTHER_SPECIAL));
    assert!(a.contains(&EOS), "an empty output is complete here");
    let mut g = compile(&tok, StructuredOutput::Regex("a+".into()));
    assert!(!allowed(&mut g, v).contains(&EOS));
    // Bytes that cannot start any UTF-8 character are never text.
    let mut g = compile(&tok, StructuredOutput::Regex("(?s:.+)".into()));
    let a = allowed(&mut g, v);
    assert!(!a.contains(&0xFF) && !a.contains(&0x80) && a.contains(&0xC3));
}

#[test]
fn choice_json_object_and_a_sampler_under_the_mask() {
    let tok = byte_level();
    let v = tok.vocab_size();
    let g = compile(
        &tok,
        StructuredOutput::Choice(vec!["a.b".into(), "x|y".into()]),
    );
    assert!(accepts(&g, "a.b") && accepts(&g, "x|y"));
    assert!(!accepts(&g, "axb") && !accepts(&g, "x") && !accepts(&g, "a.bx"));
    let g = compile(&tok, StructuredOutput::JsonObject);
    assert!(accepts(&g, "{\"k\":[1,2,{\"z\":null}]}"));
    assert!(!accepts(&g, "[1]") && !accepts(&g, "{\"k\":}"));
    // Whitespace between JSON tokens is bounded: compact and pretty-printed JSON pass, a run of
    // line breaks or of more than 16 blanks (where a small model loops) does not.
    assert!(accepts(&g, "{\"k\": [1, 2]}"));
    assert!(accepts(&g, "{\n  \"k\": {\n    \"z\": null\n  }\n}"));
    assert!(accepts(&g, "{\r\n\t\"k\": 1}"));
    assert!(!accepts(&g, "{\"k\": 1\n \n}"));
    assert!(!accepts(&g, "{\n\n\"k\": 1}"));
    assert!(!accepts(&g, &format!("{{\"k\":{}1}}", " ".repeat(17))));
    assert!(accepts(&g, &format!("{{\"k\":{}1}}", " ".repeat(16))));
    let schema = json!({"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                        "required": ["city"]});
    let g = compile(
        &tok,
        StructuredOutput::JsonSchema {
            schema: schema.to_string(),
            strict: true,
        },
    );
    assert!(accepts(&g, "{\n  \"city\": \"Paris\"\n}"));
    assert!(!accepts(&g, "{\n  \"city\": \"Paris\"\n \n  \n}"));
    // The sampler picks only allowed tokens, greedy and sampled, whatever the logits say.
    let mut g = compile(&tok, StructuredOutput::Regex("ab|é".into()));
    g.compute_mask().unwrap();
    let mut logits = vec![0.0f32; v];
    logits[b'z' as usize] = 50.0;
    logits[EOS as usize] = 40.0;
    logits[0xC3] = 1.0;
    let greedy = ferrum_types::SamplingParams::greedy();
    let mut s = ferrum_engine::Sampler::new(&greedy, &[], v, 1);
    assert_eq!(s.sample(&logits, Some(&g)).token, 0xC3);
    let sampled = ferrum_types::SamplingParams {
        temperature: 1.0,
        seed: Some(3),
        ..Default::default()
    };
    let mut s = ferrum_engine::Sampler::new(&sampled, &[], v, 1);
    for _ in 0..200 {
        let t = s.sample(&logits, Some(&g)).token;
        assert!(g.allows(t), "{t}");
    }
}

#[test]
fn strict_schemas_refuse_what_cannot_be_enforced_and_others_leave_it_out() {
    let tok = byte_level();
    let schema = json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true});
    let spec = |strict| StructuredOutput::JsonSchema {
        schema: schema.to_string(),
        strict,
    };
    let err = compile_err(&tok, spec(true));
    assert!(err.contains("uniqueItems"), "{err}");
    // Not strict: the keyword is left out, the rest is enforced.
    let g = compile(&tok, spec(false));
    assert!(accepts(&g, "[1, 1, 2]"));
    assert!(!accepts(&g, "[1, \"a\"]") && !accepts(&g, "{}"));
}

#[test]
fn constraints_that_do_not_compile_name_the_problem() {
    let tok = byte_level();
    let cases = [
        (
            StructuredOutput::JsonSchema {
                schema: "{not json".into(),
                strict: true,
            },
            "not JSON",
        ),
        (
            StructuredOutput::JsonSchema {
                schema: "[1, 2]".into(),
                strict: true,
            },
            "must be a JSON object",
        ),
        (
            StructuredOutput::JsonSchema {
                schema: json!({"type": "strin"}).to_string(),
                strict: true,
            },
            "strin",
        ),
        (StructuredOutput::Regex("(ab".into()), "regex"),
        (
            StructuredOutput::Lark("start: undefined_rule".into()),
            "undefined_rule",
        ),
        (
            StructuredOutput::Gbnf("root ::= missing".into()),
            "GBNF line 1",
        ),
    ];
    for (spec, what) in cases {
        let e = compile_err(&tok, spec.clone());
        assert!(e.contains(what), "{spec:?}: {e}");
        assert!(e.contains(spec.kind()), "{spec:?}: {e}");
    }
}

#[test]
fn gbnf_translation_of_every_construct() {
    let tok = byte_level();
    let grammar = r#"
# every GBNF construct: literals with escapes, classes, negated classes, ranges, any char,
# groups, alternatives over lines, * + ? and counted repetitions, rule references
root   ::= greet ws Name-list tail
greet  ::= "hi" | "h\x65y"
  | "\u00e9\"\\"
ws     ::= [ \t]+
Name-list ::= name ("," name){0,2}
name   ::= [A-Z] [a-z]* digit?
digit  ::= [0-9]{1,3}
tail   ::= ( "!" | [^a-z!\n] . )?
"#;
    let g = compile(&tok, StructuredOutput::Gbnf(grammar.into()));
    for ok in [
        "hi Ann",
        "hey\tBob7,Cy,Dee123",
        "é\"\\ Al!",
        "hi  Z#x",
        "hi Z#é",
        "hi Ab12,Cd3",
    ] {
        assert!(accepts(&g, ok), "refused {ok:?}");
    }
    for bad in [
        "hi",           // no name
        "hiAnn",        // no space
        "hi ann",       // lower-case initial
        "hi A,B,C,D,E", // three names, a two-character tail, then more
        "hi A1234xy",   // at most three digits, and a tail of two characters
        "hi Ann!!",     // one tail only
        "hi Ann?",      // a tail of one character that is not "!"
        "ho Ann",
    ] {
        assert!(!accepts(&g, bad), "accepted {bad:?}");
    }
    // Character by character, as GBNF matches: a literal never shuts out a class or `.` that
    // matches the same characters.
    let g = compile(
        &tok,
        StructuredOutput::Gbnf("root ::= [a-z]+ | \"none\"".into()),
    );
    assert!(accepts(&g, "nope") && accepts(&g, "none") && accepts(&g, "no"));
    let g = compile(&tok, StructuredOutput::Gbnf("root ::= .* \"END\"".into()));
    assert!(accepts(&g, "ENTEREND") && accepts(&g, "END") && !accepts(&g, "ENTER"));
}

/// A SentencePiece-style vocabulary: byte fallback tokens `<0x00>`..`<0xFF>` (ids 3..259),
/// `▁` for spaces.
#[test]
fn sentencepiece_byte_fallback_tokens() {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), json!(0));
    vocab.insert("<s>".into(), json!(1));
    vocab.insert("</s>".into(), json!(2));
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), json!(3 + b));
    }
    let pieces = ["▁", "a", "b", "▁a", "ab"];
    for (i, p) in pieces.iter().enumerate() {
        vocab.insert((*p).into(), json!(259 + i));
    }
    let merges = json!([["▁", "a"], ["a", "b"]]);
    let tj = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [
            {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    });
    let path = write_tokenizer("spm", &tj);
    let special = SpecialTokens {
        eos_token_id: Some(2),
        ..SpecialTokens::default()
    };
    let tok = Arc::new(Tokenizer::from_json_file(&path, special).unwrap());
    let bytes = tok.token_bytes().unwrap();
    assert_eq!(bytes[3 + 0x0A], b"\n");
    assert_eq!(bytes[259], b" ");
    assert_eq!(bytes[262], b" a");
    let v = tok.vocab_size();
    let mut g = GuideCompiler::new(&tok, &[2], v)
        .unwrap()
        .compile(&StructuredOutput::Regex(" aé".into()))
        .unwrap();
    let a = allowed(&mut g, v);
    // " ", " a" and the byte token for a space; never <unk>/<s>, never "a".
    assert_eq!(a, vec![3 + 0x20, 259, 262]);
    g.consume(262).unwrap();
    // é only through its two byte-fallback tokens, in order.
    assert_eq!(allowed(&mut g, v), vec![3 + 0xC3]);
    g.consume(3 + 0xC3).unwrap();
    assert_eq!(allowed(&mut g, v), vec![3 + 0xA9]);
    g.consume(3 + 0xA9).unwrap();
    assert_eq!(allowed(&mut g, v), vec![2]);
}

#[test]
fn a_triggered_constraint_is_free_until_its_trigger() {
    let tok = byte_level();
    let v = tok.vocab_size();
    let spec = StructuredOutput::Triggered {
        triggers: vec![Trigger::anywhere("a{")],
        grammar: "start: \"a{\" /[a-z]/ \"}\"".into(),
    };
    let mut g = compile(&tok, spec);
    assert!(!g.is_active());
    // Free text: anything goes, EOS included, and no mask is computed.
    for &t in b"say " {
        g.compute_mask().unwrap();
        assert!(!g.is_active() && !g.has_mask());
        g.consume(t as TokenId).unwrap();
    }
    assert!(!g.is_stopped());
    // A token that completes the trigger but carries text the grammar refuses there: that was
    // free text after all, and the guide goes on watching.
    g.consume(b'a' as TokenId).unwrap();
    g.consume(merged(b"{\"")).unwrap();
    assert!(!g.is_active());
    // A padding id past the tokenizer's vocabulary is no text.
    g.consume(v as TokenId + 5).unwrap();
    assert!(!g.is_active());
    // The trigger spans two tokens ('a' then '{'): the grammar starts with it.
    g.consume(b'a' as TokenId).unwrap();
    assert!(!g.is_active());
    g.consume(b'{' as TokenId).unwrap();
    assert!(g.is_active());
    let a = allowed(&mut g, v);
    assert_eq!(a.len(), 26, "{a:?}");
    g.consume(b'q' as TokenId).unwrap();
    assert_eq!(allowed(&mut g, v), vec![b'}' as TokenId]);
    g.consume(b'}' as TokenId).unwrap();
    assert!(g.is_stopped());
    // A trigger that is one token opens the grammar only as that token.
    let spec = StructuredOutput::Triggered {
        triggers: vec![Trigger::anywhere("{\"")],
        grammar: "start: <[259]> /[0-9]/".into(),
    };
    let mut g = compile(&tok, spec);
    g.consume(b'{' as TokenId).unwrap();
    g.consume(b'"' as TokenId).unwrap();
    assert!(!g.is_active(), "spelled out in pieces, the trigger is text");
    g.consume(merged(b"{\"")).unwrap();
    assert!(g.is_active());
    assert_eq!(
        allowed(&mut g, v),
        (b'0' as TokenId..=b'9' as TokenId).collect::<Vec<_>>()
    );
    // A grammar that does not start with its trigger is refused.
    let e = compile_err(
        &tok,
        StructuredOutput::Triggered {
            triggers: vec![Trigger::anywhere("<x>")],
            grammar: "start: \"y\"".into(),
        },
    );
    assert!(e.contains("does not start with its trigger"), "{e}");
}

/// Feeds `text` one byte token at a time to a triggered guide; whether the grammar is active
/// at the end.
fn opens(g: &Guide, text: &str) -> bool {
    let mut g = g.fork();
    for &b in text.as_bytes() {
        g.compute_mask().unwrap();
        assert!(!g.is_active() || g.allows(b as TokenId), "{text:?}");
        g.consume(b as TokenId).unwrap();
    }
    g.is_active()
}

#[test]
fn several_triggers_and_triggers_that_count_only_where_the_output_opens() {
    let tok = byte_level();
    let spec = StructuredOutput::Triggered {
        triggers: vec![
            Trigger::anywhere("<c>"),
            Trigger::anywhere("```\n{"),
            Trigger::at_start("{n"),
        ],
        grammar: "start: \"<c>\" /[a-z]/ | \"```\\n{\" /[a-z]/ \"}\" | \"{n\" /[a-z]/ \"}\"".into(),
    };
    let g = compile(&tok, spec);
    // Any trigger anywhere; the at-start one where the output opens, after whitespace only.
    assert!(opens(&g, "say <c>"));
    assert!(opens(&g, "say ```\n{"));
    assert!(opens(&g, "{n"));
    assert!(opens(&g, " \n {n"));
    assert!(!opens(&g, "say {n"));
    assert!(!opens(&g, "x {n"));
    assert!(!opens(&g, "{ n"));
    // The earliest trigger in a token wins.
    let mut h = g.fork();
    for &b in b"ok ```\n" {
        h.consume(b as TokenId).unwrap();
    }
    h.consume(merged(b"{\"")).unwrap();
    assert!(
        !h.is_active(),
        "'{{\"' is not what the grammar takes after the fence"
    );
    for &b in b"<c>" {
        h.consume(b as TokenId).unwrap();
    }
    assert!(h.is_active());
    assert_eq!(
        allowed(&mut h, tok.vocab_size()),
        (b'a' as TokenId..=b'z' as TokenId).collect::<Vec<_>>()
    );
    // Each trigger must open the grammar.
    let e = compile_err(
        &tok,
        StructuredOutput::Triggered {
            triggers: vec![Trigger::anywhere("<c>"), Trigger::at_start("{m")],
            grammar: "start: \"<c>\" /[a-z]/".into(),
        },
    );
    assert!(e.contains("does not start with its trigger \"{m\""), "{e}");
    let e = compile_err(
        &tok,
        StructuredOutput::Triggered {
            triggers: vec![],
            grammar: "start: \"<c>\"".into(),
        },
    );
    assert!(e.contains("no trigger"), "{e}");
}
