//! The single-sequence generator on the tiny fixtures: greedy ids match transformers', chunked
//! prefill and prefix reuse change nothing, seeds reproduce, early stop aborts.
#![allow(clippy::unwrap_used)]

use ferrum_engine::{Generator, GeneratorConfig};
use ferrum_models::{load_model, LoadOptions};
use ferrum_types::{FinishReason, SamplingParams};
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn generator(name: &str, cfg: GeneratorConfig) -> Generator {
    let model = load_model(
        &fixture(name),
        &LoadOptions {
            num_threads: Some(2),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    Generator::new(model, cfg).unwrap()
}

fn reference_case(name: &str, i: usize) -> (Vec<u32>, Vec<u32>) {
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(name).join("reference.json")).unwrap(),
    )
    .unwrap();
    let case = &v["cases"][i];
    let ids = |k: &str| serde_json::from_value::<Vec<u32>>(case[k].clone()).unwrap();
    (ids("prompt_ids"), ids("greedy_ids"))
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        max_tokens: Some(n),
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

#[test]
fn greedy_matches_the_reference_with_any_prefill_chunk() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-mistral-swa"] {
        let (prompt, want) = reference_case(name, 1);
        for chunk in [1, 3, 512] {
            let mut g = generator(
                name,
                GeneratorConfig {
                    prefill_chunk: chunk,
                    ..GeneratorConfig::default()
                },
            );
            let out = g
                .generate(&prompt, &greedy(want.len()), None, 0, |_| true)
                .unwrap();
            assert_eq!(out.token_ids, want, "{name} chunk {chunk}");
            assert_eq!(out.finish, FinishReason::MaxTokens);
        }
    }
}

#[test]
fn prefix_reuse_gives_the_same_tokens() {
    let (prompt, want) = reference_case("tiny-llama", 1);
    let mut g = generator("tiny-llama", GeneratorConfig::default());
    let first = g
        .generate(&prompt, &greedy(want.len()), None, 0, |_| true)
        .unwrap();
    assert_eq!(first.cached_prompt_tokens, 0);
    // The same prompt again: all but the last prompt token come from the cache.
    let again = g
        .generate(&prompt, &greedy(want.len()), None, 0, |_| true)
        .unwrap();
    assert_eq!(again.cached_prompt_tokens, prompt.len() - 1);
    assert_eq!(again.token_ids, want);
    // A prompt that extends the first output reuses prompt + output.
    let mut longer = prompt.clone();
    longer.extend_from_slice(&first.token_ids[..4]);
    let ext = g.generate(&longer, &greedy(4), None, 0, |_| true).unwrap();
    assert!(
        ext.cached_prompt_tokens >= prompt.len() + 3,
        "{}",
        ext.cached_prompt_tokens
    );
    let mut fresh = generator("tiny-llama", GeneratorConfig::default());
    let cold = fresh
        .generate(&longer, &greedy(4), None, 0, |_| true)
        .unwrap();
    assert_eq!(ext.token_ids, cold.token_ids);
    assert_eq!(&ext.token_ids[..], &want[4..8]);
}

#[test]
fn seeds_reproduce_and_callbacks_can_stop() {
    let (prompt, _) = reference_case("tiny-qwen3", 0);
    let mut g = generator("tiny-qwen3", GeneratorConfig::default());
    let p = SamplingParams {
        seed: Some(9),
        max_tokens: Some(12),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let a = g.generate(&prompt, &p, None, 1, |_| true).unwrap();
    let b = g.generate(&prompt, &p, None, 2, |_| true).unwrap();
    assert_eq!(a.token_ids, b.token_ids);
    let mut seen = 0;
    let c = g
        .generate(&prompt, &p, None, 0, |_| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!((c.token_ids.len(), c.finish), (3, FinishReason::Abort));
}

#[test]
fn bad_requests_are_refused() {
    let mut g = generator(
        "tiny-llama",
        GeneratorConfig {
            max_model_len: Some(8),
            ..GeneratorConfig::default()
        },
    );
    let p = greedy(4);
    let err = |r: Result<_, ferrum_engine::EngineError>| {
        r.map(|_: ferrum_engine::Generation| ())
            .unwrap_err()
            .to_string()
    };
    assert!(err(g.generate(&[], &p, None, 0, |_| true)).contains("empty"));
    assert!(
        err(g.generate(&[1, 999_999], &p, None, 0, |_| true)).contains("outside the vocabulary")
    );
    assert!(err(g.generate(&[1; 8], &p, None, 0, |_| true)).contains("context is 8 tokens"));
    let two = SamplingParams { n: 2, ..greedy(4) };
    assert!(err(g.generate(&[1], &two, None, 0, |_| true)).contains("n > 1"));
    let bad = SamplingParams {
        top_p: 2.0,
        ..SamplingParams::default()
    };
    assert!(err(g.generate(&[1], &bad, None, 0, |_| true)).contains("top_p"));
    // Filling the context ends with MaxModelLen.
    let out = g
        .generate(&[1, 2, 3], &greedy(100), None, 0, |_| true)
        .unwrap();
    assert_eq!(
        (out.token_ids.len(), out.finish),
        (5, FinishReason::MaxModelLen)
    );
}
