//! One request at a time through the engine (`EngineHandle::generate_one`, the command line's
//! path) on the tiny fixtures: greedy ids match transformers', chunked prefill and prefix reuse
//! change nothing, seeds reproduce, early stop aborts, bad requests are refused.
#![allow(clippy::unwrap_used)]

mod common;

use common::{engine, fixture};
use ferrum_engine::{EngineConfig, EngineHandle, GenerateRequest, Generation, KvCacheSize};
use ferrum_types::{FinishReason, SamplingParams, TokenId};
use serde_json::Value;

/// An engine for one request at a time, as the command line starts it.
fn single(name: &str, cfg: EngineConfig) -> EngineHandle {
    let cfg = EngineConfig {
        max_num_seqs: 1,
        max_waiting: 0,
        ..cfg
    };
    engine(name, cfg)
}

fn run(
    e: &EngineHandle,
    prompt: &[TokenId],
    p: &SamplingParams,
) -> Result<Generation, ferrum_engine::EngineError> {
    e.generate_one(GenerateRequest::new(prompt.to_vec(), p.clone()), |_| true)
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

/// Greedy tokens equal the reference's whatever the prefill chunk, through the whole engine:
/// the Llama family, Gemma 3's local and global layers, and Phi-3's 100-token prompt (case 3),
/// whose every chunk and decode step takes LongRoPE's long factors as the one-pass reference
/// does (the scheduler gives the forward the prompt's length).
#[test]
fn greedy_matches_the_reference_with_any_prefill_chunk() {
    let cases: [(&str, usize, &[usize]); 6] = [
        ("tiny-llama", 1, &[1, 3, 512]),
        ("tiny-qwen2", 1, &[1, 3, 512]),
        ("tiny-mistral-swa", 1, &[1, 3, 512]),
        ("tiny-gemma3", 2, &[7, 512]),
        ("tiny-phi3", 3, &[7, 512]),
        ("tiny-phi3", 2, &[7, 512]),
    ];
    for (name, case, chunks) in cases {
        let (prompt, want) = reference_case(name, case);
        for &chunk in chunks {
            let g = single(
                name,
                EngineConfig {
                    max_num_batched_tokens: chunk,
                    ..EngineConfig::default()
                },
            );
            let out = run(&g, &prompt, &greedy(want.len())).unwrap();
            assert_eq!(out.token_ids, want, "{name} case {case} chunk {chunk}");
            assert_eq!(out.finish, FinishReason::MaxTokens);
        }
    }
}

/// Phi-3's LongRoPE rotates a prompt by its length (long factors past 64 tokens): the blocks of
/// a short prompt must not serve a long one that starts the same, so prefix caching is off for
/// such a model and the long prompt still gives the reference's tokens.
#[test]
fn longrope_prompts_do_not_share_cached_blocks() {
    let (prompt, want) = reference_case("tiny-phi3", 3);
    let g = single("tiny-phi3", EngineConfig::default());
    // The first 40 tokens alone (short factors), then the whole 100-token prompt.
    run(&g, &prompt[..40], &greedy(4)).unwrap();
    let out = run(&g, &prompt, &greedy(want.len())).unwrap();
    assert_eq!(out.token_ids, want);
}

#[test]
fn prefix_reuse_gives_the_same_tokens() {
    let (prompt, want) = reference_case("tiny-llama", 1);
    // One-token blocks: the prefix cache reuses every token it can.
    let reusing = EngineConfig {
        block_size: 1,
        ..EngineConfig::default()
    };
    let g = single("tiny-llama", reusing.clone());
    let first = run(&g, &prompt, &greedy(want.len())).unwrap();
    assert_eq!(first.cached_prompt_tokens, 0);
    // The same prompt again: all but the last prompt token come from the cache.
    let again = run(&g, &prompt, &greedy(want.len())).unwrap();
    assert_eq!(again.cached_prompt_tokens, prompt.len() - 1);
    assert_eq!(again.token_ids, want);
    // A prompt that extends the first output reuses prompt + output.
    let mut longer = prompt.clone();
    longer.extend_from_slice(&first.token_ids[..4]);
    let ext = run(&g, &longer, &greedy(4)).unwrap();
    assert!(
        ext.cached_prompt_tokens >= prompt.len() + 3,
        "{}",
        ext.cached_prompt_tokens
    );
    let fresh = single("tiny-llama", reusing);
    let cold = run(&fresh, &longer, &greedy(4)).unwrap();
    assert_eq!(ext.token_ids, cold.token_ids);
    assert_eq!(&ext.token_ids[..], &want[4..8]);
}

#[test]
fn seeds_reproduce_and_callbacks_can_stop() {
    let (prompt, _) = reference_case("tiny-qwen3", 0);
    let g = single("tiny-qwen3", EngineConfig::default());
    let p = SamplingParams {
        seed: Some(9),
        max_tokens: Some(12),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let a = run(&g, &prompt, &p).unwrap();
    let b = run(&g, &prompt, &p).unwrap();
    assert_eq!(a.token_ids, b.token_ids);
    let mut seen = 0;
    let c = g
        .generate_one(GenerateRequest::new(prompt.clone(), p.clone()), |_| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!((c.token_ids.len(), c.finish), (3, FinishReason::Abort));
}

#[test]
fn bad_requests_are_refused() {
    let g = single(
        "tiny-llama",
        EngineConfig {
            max_model_len: Some(8),
            kv_cache: KvCacheSize::Blocks(4),
            ..EngineConfig::default()
        },
    );
    let p = greedy(4);
    let err = |r: Result<_, ferrum_engine::EngineError>| {
        r.map(|_: ferrum_engine::Generation| ())
            .unwrap_err()
            .to_string()
    };
    assert!(err(run(&g, &[], &p)).contains("empty"));
    assert!(err(run(&g, &[1, 999_999], &p)).contains("outside the vocabulary"));
    assert!(err(run(&g, &[1; 8], &p)).contains("context is 8 tokens"));
    let two = SamplingParams { n: 2, ..greedy(4) };
    assert!(err(run(&g, &[1], &two)).contains("n > 1"));
    let bad = SamplingParams {
        top_p: 2.0,
        ..SamplingParams::default()
    };
    assert!(err(run(&g, &[1], &bad)).contains("top_p"));
    // Filling the context ends with MaxModelLen.
    let out = run(&g, &[1, 2, 3], &greedy(100)).unwrap();
    assert_eq!(
        (out.token_ids.len(), out.finish),
        (5, FinishReason::MaxModelLen)
    );
}
