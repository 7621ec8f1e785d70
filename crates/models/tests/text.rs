//! Tokenizers and chat templates against Hugging Face references: SmolLM2's tokenizer.json and
//! GGUF metadata against transformers' ids and renders, and GGUF vocabularies of several
//! families (byte-level BPE with each pre-tokenizer, SentencePiece) against the ids HF
//! tokenizers gives for the same text (`.inp`/`.out` beside llama.cpp's vocabulary files, fetched by
//! `scripts/fetch-vocab.sh`: these tests skip without them outside CI), and whose token
//! bytes spell that text back.
#![allow(clippy::unwrap_used)]

mod common;

use common::fixtures;
use ferrum_models::load_text_assets;
use ferrum_tokenizer::{ChatMessage, TextAssets};
use serde_json::Value;
use std::path::Path;

fn smollm_reference() -> Value {
    let p = fixtures().join("smollm2-135m/reference.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Every text-side source of SmolLM2's tokenizer that is present here.
fn smollm_sources() -> Vec<(String, TextAssets)> {
    let mut out = vec![(
        "tokenizer.json".to_string(),
        TextAssets::from_folder(&fixtures().join("smollm2-135m")).unwrap(),
    )];
    let tiny = fixtures().join("tiny-smollm/model-q8_0.gguf");
    out.push(("tiny-smollm GGUF".into(), load_text_assets(&tiny).unwrap()));
    let real = ferrum_testdata::models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if real.is_file() {
        out.push(("SmolLM2 GGUF".into(), load_text_assets(&real).unwrap()));
    }
    out
}

#[test]
fn smollm2_tokenization_matches_transformers_from_json_and_gguf() {
    let reference = smollm_reference();
    let cases = reference["tokenization"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for (name, assets) in smollm_sources() {
        let tok = &assets.tokenizer;
        assert!(!tok.special().add_bos_token, "{name}");
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            let ids = tok.encode(text, true).unwrap();
            assert_eq!(ids, want, "{name}: {text:?}");
            let decoded = tok.decode(&ids, false).unwrap();
            assert_eq!(
                decoded,
                case["decoded"].as_str().unwrap(),
                "{name}: {text:?}"
            );
        }
    }
}

#[test]
fn smollm2_special_tokens() {
    for (name, assets) in smollm_sources() {
        let s = assets.tokenizer.special();
        assert_eq!(s.eos_token.as_deref(), Some("<|im_end|>"), "{name}");
        assert_eq!(s.eos_token_id, Some(2), "{name}");
        assert!(s.stop_token_ids.contains(&2), "{name}");
        assert!(assets.tokenizer.is_special(1) && !assets.tokenizer.is_special(100));
    }
}

#[test]
fn smollm2_chat_template_renders_byte_identical() {
    let reference = smollm_reference();
    let cases = reference["chat_template_cases"].as_array().unwrap();
    for (name, assets) in smollm_sources() {
        for case in cases {
            let msgs: Vec<ChatMessage> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
                })
                .collect();
            let add = case["add_generation_prompt"].as_bool().unwrap();
            let out = assets.template().unwrap().render(&msgs, add).unwrap();
            assert_eq!(out, case["rendered"].as_str().unwrap(), "{name}");
        }
    }
}

#[test]
fn a_model_without_a_template_says_so() {
    let Some(g) = ferrum_testdata::vocab("gpt-2") else {
        return;
    };
    let assets = load_text_assets(&g).unwrap();
    let err = assets
        .encode_chat(&[ChatMessage::new("user", "hi")])
        .unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
}

/// llama.cpp's vocabulary test files: `.inp` holds texts separated by a marker line, `.out`
/// the ids HF tokenizers gave for each (one line each, space separated).
fn vocab_cases(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(format!("{}.inp", gguf.display())).unwrap();
    let out = std::fs::read_to_string(format!("{}.out", gguf.display())).unwrap();
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len() + 1, "{}", gguf.display());
    texts
        .into_iter()
        .zip(ids)
        .map(|(t, i)| (t.to_string(), i))
        .collect()
}

/// The cases checked; `None` outside CI when the vocabulary has not been fetched.
fn check_vocab(name: &str) -> Option<usize> {
    let path = ferrum_testdata::vocab(name)?;
    let assets = load_text_assets(&path).unwrap();
    let tok = &assets.tokenizer;
    let mut failures = Vec::new();
    let cases = vocab_cases(&path);
    // The bytes each token stands for (what structured output's token trie is built from):
    // the reference ids' bytes spell the text (after SentencePiece's dummy prefix space).
    let bytes = tok.token_bytes().unwrap();
    for (text, want) in &cases {
        let ids = tok.encode(text, false).unwrap();
        if &ids != want {
            failures.push(format!("{text:?}: got {ids:?}, want {want:?}"));
        }
        let spelled: Vec<u8> = want
            .iter()
            .flat_map(|&id| bytes[id as usize].clone())
            .collect();
        let prefixed = [b" ", text.as_bytes()].concat();
        if spelled != text.as_bytes() && spelled != prefixed {
            failures.push(format!(
                "{text:?}: the token bytes of {want:?} spell {:?}",
                String::from_utf8_lossy(&spelled)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Some(cases.len())
}

#[test]
fn gguf_vocab_gpt2() {
    assert!(check_vocab("gpt-2").is_none_or(|n| n > 30));
}

#[test]
fn gguf_vocab_llama_spm() {
    assert!(check_vocab("llama-spm").is_none_or(|n| n > 30));
}

#[test]
fn gguf_vocab_llama_bpe() {
    assert!(check_vocab("llama-bpe").is_none_or(|n| n > 30));
}

#[test]
fn gguf_vocab_qwen2() {
    assert!(check_vocab("qwen2").is_none_or(|n| n > 30));
}

#[test]
fn gguf_vocab_starcoder() {
    assert!(check_vocab("starcoder").is_none_or(|n| n > 30));
}

#[test]
fn gguf_vocab_phi3() {
    assert!(check_vocab("phi-3").is_none_or(|n| n > 30));
}

/// Streams `ids` through the incremental detokenizer and returns the concatenated deltas.
fn stream(assets: &TextAssets, prompt: &[u32], ids: &[u32], skip: bool) -> String {
    let mut d = ferrum_tokenizer::IncrementalDetokenizer::new(prompt, skip);
    let mut out = String::new();
    for &id in ids {
        out.push_str(&d.push(&assets.tokenizer, id).unwrap());
    }
    out.push_str(&d.finish(&assets.tokenizer).unwrap());
    out
}

mod detokenizer {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    fn smollm() -> &'static TextAssets {
        static A: OnceLock<TextAssets> = OnceLock::new();
        A.get_or_init(|| TextAssets::from_folder(&fixtures().join("smollm2-135m")).unwrap())
    }

    /// llama.cpp's Llama 2 vocabulary; `None` outside CI when it has not been fetched.
    fn spm() -> Option<&'static TextAssets> {
        static A: OnceLock<Option<TextAssets>> = OnceLock::new();
        A.get_or_init(|| ferrum_testdata::vocab("llama-spm").map(|p| load_text_assets(&p).unwrap()))
            .as_ref()
    }

    /// Mostly ordinary tokens, with byte pieces and special tokens mixed in.
    fn tokens(vocab: u32, specials: u32) -> impl Strategy<Value = Vec<u32>> {
        prop::collection::vec(
            prop_oneof![
                6 => 0..vocab,
                2 => 0..300u32,
                1 => 0..specials,
            ],
            0..48,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn byte_level_deltas_concatenate_to_the_full_decode(ids in tokens(49152, 17), skip in any::<bool>()) {
            let a = smollm();
            prop_assert_eq!(stream(a, &[], &ids, skip), a.tokenizer.decode(&ids, skip).unwrap());
        }

        #[test]
        fn byte_level_deltas_after_a_prompt(prompt in tokens(49152, 17), ids in tokens(49152, 17)) {
            let a = smollm();
            let ctx = &prompt[prompt.len().saturating_sub(ferrum_tokenizer::CONTEXT_TOKENS)..];
            let all: Vec<u32> = ctx.iter().chain(&ids).copied().collect();
            let full = a.tokenizer.decode(&all, true).unwrap();
            let head = a.tokenizer.decode(ctx, true).unwrap();
            // The context's own text may end mid-character; compare the streamed part only.
            let streamed = stream(a, &prompt, &ids, true);
            prop_assert!(full.ends_with(&streamed), "{:?} vs {:?}", full, streamed);
            if !head.ends_with('\u{FFFD}') {
                prop_assert_eq!(format!("{head}{streamed}"), full);
            }
        }

        /// Byte-fallback pieces (ids 3..259) are left out of the random mix: HF's ByteFallback
        /// decoder turns a whole run of byte pieces into U+FFFDs when the run is not valid
        /// UTF-8 as a whole, so the full decode of garbage bytes is not a reference (valid
        /// byte runs are checked below).
        #[test]
        fn sentencepiece_deltas_concatenate_to_the_full_decode(
            ids in prop::collection::vec(prop_oneof![8 => 259..32000u32, 1 => 0..3u32], 0..48),
            skip in any::<bool>(),
        ) {
            let Some(a) = spm() else { return Ok(()) };
            prop_assert_eq!(stream(a, &[], &ids, skip), a.tokenizer.decode(&ids, skip).unwrap());
        }
    }

    #[test]
    fn split_characters_are_held_until_complete() {
        let a = smollm();
        // "🦀" is several byte-level tokens; no delta may end inside it.
        let ids = a.tokenizer.encode("crab 🦀!", false).unwrap();
        let mut d = ferrum_tokenizer::IncrementalDetokenizer::new(&[], true);
        let mut deltas = Vec::new();
        for &id in &ids {
            let delta = d.push(&a.tokenizer, id).unwrap();
            assert!(!delta.contains('\u{FFFD}'), "{delta:?}");
            deltas.push(delta);
        }
        assert_eq!(deltas.concat(), "crab 🦀!");
        assert!(
            deltas.iter().any(|d| d.is_empty()),
            "the crab spans tokens: {deltas:?}"
        );
    }

    #[test]
    fn sentencepiece_byte_pieces_stream_whole_characters() {
        let Some(a) = spm() else { return };
        let text = "a 🦀 and ẞ";
        let ids = a.tokenizer.encode(text, false).unwrap();
        assert!(
            ids.iter().any(|&t| (3..259).contains(&t)),
            "{ids:?} uses byte pieces"
        );
        let mut d = ferrum_tokenizer::IncrementalDetokenizer::new(&[], true);
        let mut out = String::new();
        for &id in &ids {
            let delta = d.push(&a.tokenizer, id).unwrap();
            assert!(!delta.contains('\u{FFFD}'), "{delta:?}");
            out.push_str(&delta);
        }
        assert_eq!(out, text);
    }

    #[test]
    fn spm_first_delta_keeps_its_space_after_a_prompt() {
        let Some(a) = spm() else { return };
        let prompt = a
            .tokenizer
            .encode("The capital of France is", true)
            .unwrap();
        let out = a.tokenizer.encode(" Paris", false).unwrap();
        // "▁Paris" may be preceded by nothing else; the streamed text starts with the space.
        let out: Vec<u32> = out.into_iter().filter(|&t| t != 29871).collect();
        assert_eq!(stream(a, &prompt, &out, true), " Paris");
    }
}
