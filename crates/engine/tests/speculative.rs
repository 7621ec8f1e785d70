//! Speculative decoding (n-gram proposals verified in the batch) on the tiny fixtures: greedy
//! output equals the output without speculation token for token, alone and in a batch with
//! chunked prefill and preemption; seeded sampling gives the same tokens with speculation as
//! without; proposals are made and accepted; no block leaks.
#![allow(clippy::unwrap_used)]

mod common;

use common::{engine, fixture, model, wait_for_idle};
use ferrum_engine::{
    EngineConfig, EngineHandle, Event, GenerateRequest, KvCacheSize, NgramProposer, Proposer,
    SpeculativeConfig, Usage,
};
use ferrum_models::{load_model, LoadOptions};
use ferrum_types::{SamplingParams, TokenId};

/// An engine whose draft model is the target itself, on the target's threads: every
/// proposal of a greedy request must then be accepted, which checks that the draft's KV
/// cache follows the target's through chunking, preemption and rollbacks.
fn self_drafted(name: &str, cfg: EngineConfig) -> EngineHandle {
    self_drafted_vocab(name, cfg, None)
}

/// [`self_drafted`], the draft proposing among the first `output_vocab` tokens only.
fn self_drafted_vocab(name: &str, cfg: EngineConfig, output_vocab: Option<usize>) -> EngineHandle {
    let model = model(name);
    let draft = load_model(
        &fixture(name),
        &LoadOptions {
            pool: Some(model.compute_pool().unwrap().clone()),
            output_vocab,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    EngineHandle::start_with_draft(model, draft, None, &cfg).unwrap()
}

fn drafted(k: usize, disable_by_batch_size: usize) -> SpeculativeConfig {
    SpeculativeConfig {
        proposer: Proposer::Draft,
        num_speculative_tokens: k,
        disable_by_batch_size,
    }
}

fn ngram(k: usize, disable_by_batch_size: usize) -> SpeculativeConfig {
    SpeculativeConfig {
        proposer: Proposer::Ngram(NgramProposer { min: 1, max: 3 }),
        num_speculative_tokens: k,
        disable_by_batch_size,
    }
}

fn collect(mut s: ferrum_engine::EventStream) -> (Vec<TokenId>, Usage) {
    let mut ids = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token { token, .. }) => ids.push(token),
            Some(Event::Done { usage }) => return (ids, usage),
            Some(Event::Error(e)) => panic!("engine error: {e}"),
            Some(_) => {}
            None => panic!("stream ended without Done"),
        }
    }
}

/// Prompts that repeat themselves, so the n-gram lookup finds matches.
fn prompts() -> Vec<Vec<TokenId>> {
    (0..12u32)
        .map(|i| {
            let motif: Vec<TokenId> = (0..3 + i % 4)
                .map(|j| (i * 37 + j * 11) % 200 + 3)
                .collect();
            motif
                .iter()
                .cycle()
                .take(8 + (i as usize * 5) % 23)
                .copied()
                .collect()
        })
        .collect()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        max_tokens: Some(n),
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

/// Each prompt's greedy output (`20 + i` tokens for prompt `i`) without speculation.
fn plain_outputs(name: &str) -> Vec<Vec<TokenId>> {
    let plain = engine(name, EngineConfig::default());
    let want = prompts()
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            collect(
                plain
                    .generate(GenerateRequest::new(p, greedy(20 + i)))
                    .unwrap(),
            )
            .0
        })
        .collect();
    plain.shutdown();
    want
}

#[test]
fn greedy_output_is_unchanged_alone_and_batched() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-mistral-swa"] {
        let want = plain_outputs(name);
        // Alone: one request at a time.
        let alone = engine(
            name,
            EngineConfig {
                speculative: Some(ngram(4, 64)),
                ..EngineConfig::default()
            },
        );
        for (i, p) in prompts().into_iter().enumerate() {
            let (got, _) = collect(
                alone
                    .generate(GenerateRequest::new(p, greedy(20 + i)))
                    .unwrap(),
            );
            assert_eq!(got, want[i], "{name} prompt {i} alone");
        }
        let m = alone.metrics().spec;
        assert!(m.num_draft_tokens > 0, "{name}: nothing was proposed");
        assert!(m.num_accepted_tokens > 0, "{name}: nothing was accepted");
        assert!(m.num_accepted_tokens <= m.num_draft_tokens);
        assert!(m.accepted_per_pos.first().is_some_and(|&c| c > 0));
        alone.shutdown();
        // Together: a small token budget chunks prefills and cuts proposals short; 40 blocks
        // of 4 tokens cannot hold all twelve, so some are preempted and recomputed.
        let batched = engine(
            name,
            EngineConfig {
                max_num_seqs: 12,
                max_num_batched_tokens: 24,
                block_size: 4,
                kv_cache: KvCacheSize::Blocks(40),
                speculative: Some(ngram(5, 64)),
                ..EngineConfig::default()
            },
        );
        let streams: Vec<_> = prompts()
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                batched
                    .generate(GenerateRequest::new(p, greedy(20 + i)))
                    .unwrap()
            })
            .collect();
        for (i, s) in streams.into_iter().enumerate() {
            let (got, usage) = collect(s);
            assert_eq!(got, want[i], "{name} prompt {i} batched");
            assert_eq!(usage.completion_tokens, 20 + i);
        }
        let m = batched.metrics();
        assert!(m.preemptions > 0, "{name}: meant to preempt: {m:?}");
        assert!(m.spec.num_accepted_tokens > 0);
        wait_for_idle(&batched);
        batched.shutdown();
    }
}

#[test]
fn a_draft_model_proposes_and_greedy_output_is_unchanged() {
    let name = "tiny-qwen2";
    let want = plain_outputs(name);
    for cfg in [
        EngineConfig {
            speculative: Some(drafted(4, 64)),
            ..EngineConfig::default()
        },
        // Chunked prefill, proposals cut by the budget, preemption.
        EngineConfig {
            max_num_seqs: 12,
            max_num_batched_tokens: 24,
            block_size: 4,
            kv_cache: KvCacheSize::Blocks(24),
            speculative: Some(drafted(5, 64)),
            ..EngineConfig::default()
        },
    ] {
        let e = self_drafted(name, cfg.clone());
        let streams: Vec<_> = prompts()
            .into_iter()
            .enumerate()
            .map(|(i, p)| e.generate(GenerateRequest::new(p, greedy(20 + i))).unwrap())
            .collect();
        for (i, s) in streams.into_iter().enumerate() {
            assert_eq!(collect(s).0, want[i], "prompt {i}");
        }
        let m = e.metrics();
        assert!(m.spec.num_draft_tokens > 0, "{m:?}");
        if cfg.block_size == 4 {
            assert!(m.preemptions > 0, "meant to preempt: {m:?}");
        }
        assert_eq!(
            m.spec.num_accepted_tokens, m.spec.num_draft_tokens,
            "a draft equal to the target is always right: {m:?}"
        );
        wait_for_idle(&e);
        e.shutdown();
    }
    // One sequence, every proposal accepted: the draft never runs a position twice, so a
    // verifying step costs it k forwards (its proposal steps), not k + 1.
    let k = 4;
    let e = self_drafted(
        name,
        EngineConfig {
            speculative: Some(drafted(k, 64)),
            ..EngineConfig::default()
        },
    );
    let p = prompts().swap_remove(0);
    let plain = engine(name, EngineConfig::default());
    let (want60, _) = collect(
        plain
            .generate(GenerateRequest::new(p.clone(), greedy(60)))
            .unwrap(),
    );
    plain.shutdown();
    let (tokens, _) = collect(e.generate(GenerateRequest::new(p, greedy(60))).unwrap());
    assert_eq!(tokens, want60);
    wait_for_idle(&e);
    let m = e.metrics();
    let runs = m.spec.num_drafts;
    assert!(runs >= 3, "{m:?}");
    // The prompt's prefill, k per proposal round before each run (the held-back position of
    // an all-accepted run rides in the next round's first step), and the last run's held-back
    // position.
    assert!(
        m.spec.draft_forwards <= 2 + runs * k as u64,
        "{} draft forwards for {runs} verifying runs of {k}: {m:?}",
        m.spec.draft_forwards
    );
    e.shutdown();
    // A draft that proposes among the first half of the vocabulary only: proposals past it
    // are never made, so fewer are accepted, and the output is the same.
    let model_vocab = model(name).config().vocab_size;
    let e = self_drafted_vocab(
        name,
        EngineConfig {
            speculative: Some(drafted(4, 64)),
            ..EngineConfig::default()
        },
        Some(model_vocab / 2),
    );
    for (i, p) in prompts().into_iter().enumerate() {
        let (got, _) = collect(e.generate(GenerateRequest::new(p, greedy(20 + i))).unwrap());
        assert_eq!(got, want[i], "prompt {i}, half-vocabulary draft");
    }
    let m = e.metrics();
    assert!(m.spec.num_draft_tokens > 0, "{m:?}");
    e.shutdown();
    // A draft with another vocabulary is refused.
    let model = load_model(&fixture("tiny-llama"), &LoadOptions::default()).unwrap();
    let other = load_model(&fixture("tiny-smollm"), &LoadOptions::default()).unwrap();
    assert_ne!(model.config().vocab_size, other.config().vocab_size);
    let cfg = EngineConfig {
        speculative: Some(drafted(4, 4)),
        ..EngineConfig::default()
    };
    let err = EngineHandle::start_with_draft(model, other, None, &cfg)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("vocabulary"), "{err}");
    // The draft method needs a draft; a draft needs the draft method.
    let model = load_model(&fixture("tiny-llama"), &LoadOptions::default()).unwrap();
    let err = EngineHandle::start(model, None, &cfg)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("--speculative-model"), "{err}");
    let model = load_model(&fixture("tiny-llama"), &LoadOptions::default()).unwrap();
    let draft = load_model(&fixture("tiny-llama"), &LoadOptions::default()).unwrap();
    let cfg = EngineConfig {
        speculative: Some(ngram(4, 4)),
        ..EngineConfig::default()
    };
    assert!(EngineHandle::start_with_draft(model, draft, None, &cfg).is_err());
}

#[test]
fn seeded_sampling_is_reproducible_and_aborts_free_everything() {
    let e = engine(
        "tiny-llama",
        EngineConfig {
            block_size: 4,
            speculative: Some(ngram(4, 64)),
            ..EngineConfig::default()
        },
    );
    let p = SamplingParams {
        max_tokens: Some(24),
        ignore_eos: true,
        seed: Some(7),
        temperature: 0.7,
        top_k: Some(20),
        ..SamplingParams::default()
    };
    let prompt = prompts().swap_remove(5);
    let (a, ua) = collect(
        e.generate(GenerateRequest::new(prompt.clone(), p.clone()))
            .unwrap(),
    );
    let (b, _) = collect(
        e.generate(GenerateRequest::new(prompt.clone(), p.clone()))
            .unwrap(),
    );
    assert_eq!(a, b, "same seed, same tokens");
    assert_eq!(a.len(), 24);
    assert!(ua.spec_draft_tokens > 0, "proposals were verified: {ua:?}");
    // The same draws as without speculation: a seeded request's tokens do not depend on it.
    let plain = engine("tiny-llama", EngineConfig::default());
    let (c, _) = collect(
        plain
            .generate(GenerateRequest::new(prompt.clone(), p.clone()))
            .unwrap(),
    );
    plain.shutdown();
    assert_eq!(a, c, "speculation changed a seeded request's tokens");
    // Dropped mid-generation: aborted, blocks back.
    for _ in 0..4 {
        let mut s = e
            .generate(GenerateRequest::new(prompt.clone(), greedy(200)))
            .unwrap();
        while !matches!(s.blocking_next(), Some(Event::Token { .. })) {}
        drop(s);
    }
    wait_for_idle(&e);
    e.shutdown();
}

#[test]
fn large_batches_step_aside() {
    // Twelve sequences of one request (`n = 12`) enter the engine together and decode in
    // lockstep (same output length): with a limit of two no step proposes; with a limit of 64
    // they do. One request, not twelve, so the engine cannot step between their arrivals.
    let drafts = |limit| {
        let e = engine(
            "tiny-qwen2",
            EngineConfig {
                speculative: Some(ngram(4, limit)),
                ..EngineConfig::default()
            },
        );
        let p = SamplingParams {
            n: 12,
            seed: Some(3),
            temperature: 0.8,
            ..greedy(12)
        };
        let prompt = prompts().swap_remove(2);
        let (ids, usage) = collect(e.generate(GenerateRequest::new(prompt, p)).unwrap());
        assert_eq!(ids.len(), 12 * 12);
        let m = e.metrics().spec;
        assert_eq!(usage.spec_draft_tokens as u64, m.num_draft_tokens);
        e.shutdown();
        m.num_drafts
    };
    assert_eq!(drafts(2), 0);
    assert!(drafts(64) > 0);
}

#[test]
fn bad_settings_are_refused() {
    let path = fixture("tiny-llama");
    let start = |spec| {
        let model = load_model(&path, &LoadOptions::default()).unwrap();
        let cfg = EngineConfig {
            speculative: Some(spec),
            ..EngineConfig::default()
        };
        EngineHandle::start(model, None, &cfg)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    assert!(start(ngram(0, 4)).contains("--num-speculative-tokens 0"));
    assert!(start(ngram(17, 4)).contains("outside 1..=16"));
    let bad = SpeculativeConfig {
        proposer: Proposer::Ngram(NgramProposer { min: 3, max: 2 }),
        ..ngram(4, 4)
    };
    assert!(start(bad).contains("--prompt-lookup-min 3"));
}
