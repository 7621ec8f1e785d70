//! Stop conditions and text deltas of the output processor, on SmolLM2's tokenizer.
#![allow(clippy::unwrap_used)]

use ferrum_engine::OutputProcessor;
use ferrum_tokenizer::{TextAssets, Tokenizer};
use ferrum_types::{FinishReason, SamplingParams};
use std::sync::OnceLock;

fn tok() -> &'static Tokenizer {
    static T: OnceLock<TextAssets> = OnceLock::new();
    &T.get_or_init(|| {
        let dir = ferrum_testdata::fixture("smollm2-135m");
        TextAssets::from_folder(&dir).unwrap()
    })
    .tokenizer
}

/// Feeds the tokens of `text` (then `extra` ids) and returns the shown text, the finish reason
/// and how many tokens were consumed.
fn feed(
    params: &SamplingParams,
    text: &str,
    extra: &[u32],
    max_len: usize,
) -> (String, Option<FinishReason>, usize) {
    let t = tok();
    let prompt = t.encode("Q:", false).unwrap();
    let eos = t.special().stop_token_ids.clone();
    let mut p = OutputProcessor::new(params, &prompt, Some(t), &eos, max_len).unwrap();
    let mut ids = t.encode(text, false).unwrap();
    ids.extend_from_slice(extra);
    let mut out = String::new();
    for (i, &id) in ids.iter().enumerate() {
        let step = p.push(Some(t), id).unwrap();
        out.push_str(&step.text);
        if step.finish.is_some() {
            assert!(
                p.push(Some(t), id).is_err(),
                "a finished sequence takes no more tokens"
            );
            return (out, step.finish, i + 1);
        }
    }
    (out, None, ids.len())
}

#[test]
fn eos_ends_the_sequence_without_its_text() {
    let p = SamplingParams::greedy();
    let (text, finish, n) = feed(&p, "Paris is nice", &[2, 100], 1000);
    assert_eq!(text, "Paris is nice");
    assert_eq!(finish, Some(FinishReason::Eos(2)));
    assert_eq!(finish.unwrap().as_openai(), "stop");
    assert_eq!(n, tok().encode("Paris is nice", false).unwrap().len() + 1);
}

#[test]
fn ignore_eos_keeps_going_and_request_stop_ids_stop() {
    let p = SamplingParams {
        ignore_eos: true,
        stop_token_ids: vec![100],
        ..SamplingParams::greedy()
    };
    let (text, finish, _) = feed(&p, "Paris", &[2, 100], 1000);
    assert_eq!(finish, Some(FinishReason::StopToken(100)));
    assert!(text.starts_with("Paris"), "{text:?}");
}

#[test]
fn stop_strings_cut_the_text_even_across_tokens() {
    let p = SamplingParams {
        stop: vec!["is n".into()],
        ..SamplingParams::greedy()
    };
    let (text, finish, _) = feed(&p, "Paris is nice and big", &[], 1000);
    assert_eq!(text, "Paris ");
    assert_eq!(finish, Some(FinishReason::StopString("is n".into())));
}

#[test]
fn max_tokens_and_max_model_len_say_which() {
    let p = SamplingParams {
        max_tokens: Some(3),
        ..SamplingParams::greedy()
    };
    let (text, finish, n) = feed(&p, "one two three four five", &[], 1000);
    assert_eq!(
        (text.as_str(), finish.clone(), n),
        ("one two three", Some(FinishReason::MaxTokens), 3)
    );
    assert_eq!(finish.unwrap().as_openai(), "length");
    // The prompt "Q:" is 2 tokens; a context of 4 leaves room for 2.
    let p = SamplingParams {
        max_tokens: Some(50),
        ..SamplingParams::greedy()
    };
    let (_, finish, n) = feed(&p, "one two three four five", &[], 4);
    assert_eq!((finish, n), (Some(FinishReason::MaxModelLen), 2));
}

#[test]
fn held_back_text_is_released_at_the_end() {
    // "and b" could still become the stop string "and big!" when max_tokens ends the sequence.
    let p = SamplingParams {
        stop: vec!["and big!".into()],
        max_tokens: Some(5),
        ..SamplingParams::greedy()
    };
    let (text, finish, _) = feed(&p, "Paris is nice and big", &[], 1000);
    assert_eq!(text, "Paris is nice and big");
    assert_eq!(finish, Some(FinishReason::MaxTokens));
}

#[test]
fn a_prompt_that_fills_the_context_is_refused() {
    let t = tok();
    let err =
        OutputProcessor::new(&SamplingParams::greedy(), &[1, 2, 3], Some(t), &[2], 3).unwrap_err();
    assert!(err.to_string().contains("context is 3 tokens"), "{err}");
}
