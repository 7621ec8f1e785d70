//! The batching engine on the tiny fixtures: batch invariance under chunked prefill and
//! preemption, prefix reuse, parallel sampling, abort on drop, overload and shutdown.
#![allow(clippy::unwrap_used)]

mod common;

use common::{engine, model, wait_for_idle};
use ferrum_engine::{EngineConfig, EngineHandle, Event, GenerateRequest, KvCacheSize, Usage};
use ferrum_types::{FinishReason, SamplingParams, TokenId};
use std::time::{Duration, Instant};

/// Collects a request's outputs: token ids per sample, finish reasons, usage.
fn collect(
    mut s: ferrum_engine::EventStream,
    n: usize,
) -> (Vec<Vec<TokenId>>, Vec<Option<FinishReason>>, Usage) {
    let mut ids = vec![Vec::new(); n];
    let mut fin = vec![None; n];
    loop {
        match s.blocking_next() {
            Some(Event::Token { index, token, .. }) => ids[index].push(token),
            Some(Event::Finished { index, reason, .. }) => fin[index] = Some(reason),
            Some(Event::Done { usage }) => return (ids, fin, usage),
            Some(Event::Error(e)) => panic!("engine error: {e}"),
            None => panic!("stream ended without Done"),
        }
    }
}

/// 32 prompts of mixed lengths (some sharing prefixes) over the fixture's vocabulary.
fn prompts() -> Vec<Vec<TokenId>> {
    (0..32u32)
        .map(|i| {
            let len = 3 + (i * 7) % 37;
            let shared = if i % 4 == 0 { 12 } else { 0 };
            (0..len)
                .map(|j| {
                    if j < shared {
                        5 + j
                    } else {
                        (i * 131 + j * 17) % 250 + 3
                    }
                })
                .collect()
        })
        .collect()
}

#[test]
fn batch_invariance_with_chunked_prefill_and_preemption() {
    let prompts = prompts();
    let greedy = |n| SamplingParams {
        max_tokens: Some(n),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let seeded = |n, seed| SamplingParams {
        max_tokens: Some(n),
        ignore_eos: true,
        seed: Some(seed),
        temperature: 0.9,
        top_k: Some(50),
        ..SamplingParams::default()
    };
    // Alone: one sequence at a time, nothing reused.
    let single = engine(
        "tiny-llama",
        EngineConfig {
            max_num_seqs: 1,
            enable_prefix_caching: false,
            ..EngineConfig::default()
        },
    );
    let one = |p: &[TokenId], params| {
        single
            .generate_one(GenerateRequest::new(p.to_vec(), params), |_| true)
            .unwrap()
            .token_ids
    };
    let alone: Vec<(Vec<TokenId>, Vec<TokenId>)> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                one(p, greedy(6 + i % 5)),
                one(p, seeded(6 + i % 5, i as u64)),
            )
        })
        .collect();
    // Together: a small token budget chunks prefills; 40 blocks of 4 tokens cannot hold all
    // 32 sequences at once, so some are preempted and recomputed.
    let cfg = EngineConfig {
        max_num_seqs: 32,
        max_num_batched_tokens: 24,
        block_size: 4,
        kv_cache: KvCacheSize::Blocks(40),
        ..EngineConfig::default()
    };
    let e = engine("tiny-llama", cfg);
    let streams: Vec<_> = prompts
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            [
                e.generate(GenerateRequest::new(p.clone(), greedy(6 + i % 5)))
                    .unwrap(),
                e.generate(GenerateRequest::new(p.clone(), seeded(6 + i % 5, i as u64)))
                    .unwrap(),
            ]
        })
        .collect();
    let mut results = streams.into_iter().map(|s| collect(s, 1).0.remove(0));
    for (i, (a, b)) in alone.iter().enumerate() {
        assert_eq!(&results.next().unwrap(), a, "greedy prompt {i}");
        assert_eq!(&results.next().unwrap(), b, "seeded prompt {i}");
    }
    let m = e.metrics();
    assert!(
        m.preemptions > 0,
        "the pool was meant to force preemptions: {m:?}"
    );
    assert_eq!(m.requests_finished, 64);
    assert_eq!(m.time_to_first_token.count, 64);
    wait_for_idle(&e);
    e.shutdown();
}

#[test]
fn prefix_reuse_reports_hits_and_gives_the_same_output() {
    let e = engine(
        "tiny-qwen2",
        EngineConfig {
            block_size: 4,
            ..EngineConfig::default()
        },
    );
    let long: Vec<TokenId> = (0..60).map(|j| (j * 13) % 200 + 3).collect();
    let p = SamplingParams {
        max_tokens: Some(8),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let (first, _, u1) = collect(
        e.generate(GenerateRequest::new(long.clone(), p.clone()))
            .unwrap(),
        1,
    );
    assert_eq!(u1.cached_tokens, 0);
    let (second, _, u2) = collect(
        e.generate(GenerateRequest::new(long.clone(), p.clone()))
            .unwrap(),
        1,
    );
    assert_eq!(first, second);
    // All full blocks before the last token: 59 tokens -> 14 blocks of 4.
    assert_eq!(u2.cached_tokens, 56);
    let m = e.metrics();
    assert_eq!(m.prefix_cache_hits, 56);
    assert!(m.prefix_cache_queries >= 112);
    e.shutdown();
}

#[test]
fn kv_prefault_while_idle_keeps_cached_prefixes_and_outputs() {
    // A server's engine makes its KV cache resident while idle, between requests too: the
    // blocks a finished request left in the prefix cache must read back the same, so tokens
    // and their logprobs (to the bit) equal an engine's without it.
    let cfg = |prefault| EngineConfig {
        block_size: 4,
        kv_cache: KvCacheSize::Bytes(64 << 20),
        prefault_kv_cache: prefault,
        ..EngineConfig::default()
    };
    let long: Vec<TokenId> = (0..60).map(|j| (j * 29) % 200 + 3).collect();
    let p = SamplingParams {
        max_tokens: Some(12),
        ignore_eos: true,
        logprobs: Some(0),
        ..SamplingParams::greedy()
    };
    let run = |e: &EngineHandle| {
        let mut s = e
            .generate(GenerateRequest::new(long.clone(), p.clone()))
            .unwrap();
        let mut out = Vec::new();
        loop {
            match s.blocking_next() {
                Some(Event::Token { token, logprob, .. }) => {
                    out.push((token, logprob.map(f32::to_bits)))
                }
                Some(Event::Done { usage }) => return (out, usage.cached_tokens),
                Some(Event::Error(e)) => panic!("engine error: {e}"),
                Some(_) => {}
                None => panic!("stream ended without Done"),
            }
        }
    };
    let plain = engine("tiny-qwen2", cfg(false));
    assert!(!plain.metrics().kv_cache_populating);
    let (want, _) = run(&plain);
    plain.shutdown();
    assert!(
        want.iter().all(|(_, lp)| lp.is_some()),
        "logprobs asked for"
    );
    let e = engine("tiny-qwen2", cfg(true));
    let (first, _) = run(&e);
    // Idle until the 64 MiB are resident, over the cached blocks too (the gauge says when).
    let t = Instant::now();
    while e.metrics().kv_cache_populating {
        assert!(t.elapsed() < Duration::from_secs(30), "never resident");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (second, cached) = run(&e);
    assert_eq!(first, want);
    assert_eq!(second, want);
    assert_eq!(cached, 56, "the prefix came from the cache");
    e.shutdown();
}

#[test]
fn parallel_samples_share_the_prompt_and_differ() {
    let e = engine(
        "tiny-llama",
        EngineConfig {
            block_size: 4,
            ..EngineConfig::default()
        },
    );
    let prompt: Vec<TokenId> = (0..30).map(|j| j * 3 + 1).collect();
    let p = SamplingParams {
        n: 3,
        max_tokens: Some(10),
        ignore_eos: true,
        seed: Some(7),
        ..SamplingParams::default()
    };
    let (ids, fin, usage) = collect(
        e.generate(GenerateRequest::new(prompt.clone(), p.clone()))
            .unwrap(),
        3,
    );
    assert!(ids.iter().all(|s| s.len() == 10));
    assert!(fin.iter().all(|f| f == &Some(FinishReason::MaxTokens)));
    assert_ne!(ids[0], ids[1]);
    assert_eq!(
        usage,
        Usage {
            prompt_tokens: 30,
            completion_tokens: 30,
            cached_tokens: 0,
            ..Usage::default()
        }
    );
    // Samples 1 and 2 reused sample 0's 7 full prompt blocks.
    assert_eq!(e.metrics().prefix_cache_hits, 2 * 28);
    // Same seed, same samples.
    let (again, _, _) = collect(e.generate(GenerateRequest::new(prompt, p)).unwrap(), 3);
    assert_eq!(ids, again);
    e.shutdown();
}

#[test]
fn dropping_a_stream_aborts_and_frees_its_blocks() {
    let e = engine("tiny-llama", EngineConfig::default());
    let p = SamplingParams {
        max_tokens: None,
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let mut s = e.generate(GenerateRequest::new(vec![1, 2, 3], p)).unwrap();
    // Metrics are published after a step's tokens are sent: the second token proves the
    // first step's figures (blocks in use) are out.
    assert!(matches!(s.blocking_next(), Some(Event::Token { .. })));
    assert!(matches!(s.blocking_next(), Some(Event::Token { .. })));
    let m = e.metrics();
    assert!(m.kv_blocks_free < m.kv_blocks_total, "{m:?}");
    drop(s);
    wait_for_idle(&e);
    // Explicit abort by id works too.
    let p = SamplingParams {
        max_tokens: None,
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let mut s = e.generate(GenerateRequest::new(vec![1, 2, 3], p)).unwrap();
    assert!(matches!(s.blocking_next(), Some(Event::Token { .. })));
    e.abort(s.id());
    let mut reason = None;
    while let Some(ev) = s.blocking_next() {
        if let Event::Finished { reason: r, .. } = ev {
            reason = Some(r);
        }
    }
    assert_eq!(reason, Some(FinishReason::Abort));
    wait_for_idle(&e);
    // Aborted requests count as finished, as the metric's help says.
    assert_eq!(e.metrics().requests_finished, 2);
    assert_eq!(e.metrics().e2e_latency.count, 2);
    e.shutdown();
}

#[test]
fn bad_requests_overload_and_shutdown() {
    let cfg = EngineConfig {
        max_num_seqs: 1,
        max_waiting: 1,
        ..EngineConfig::default()
    };
    let e = engine("tiny-llama", cfg);
    let long = SamplingParams {
        max_tokens: Some(200),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let bad = [
        GenerateRequest::new(vec![], SamplingParams::greedy()),
        GenerateRequest::new(vec![1, 999_999], SamplingParams::greedy()),
        GenerateRequest::new(
            vec![1],
            SamplingParams {
                top_k: Some(0),
                ..SamplingParams::default()
            },
        ),
        GenerateRequest::new(vec![1; 100_000], SamplingParams::greedy()),
    ];
    for r in bad {
        assert!(e.generate(r).is_err());
    }
    let a = e
        .generate(GenerateRequest::new(vec![1, 2], long.clone()))
        .unwrap();
    let b = e
        .generate(GenerateRequest::new(vec![3, 4], long.clone()))
        .unwrap();
    let err = e
        .generate(GenerateRequest::new(vec![5], long.clone()))
        .unwrap_err();
    assert!(
        matches!(err, ferrum_engine::EngineError::Overloaded(2)),
        "{err}"
    );
    // Shutdown lets in-flight requests finish, then refuses new ones.
    let e2 = e.clone();
    let t = std::thread::spawn(move || e2.shutdown());
    let (ids_a, _, _) = collect(a, 1);
    let (ids_b, _, _) = collect(b, 1);
    assert_eq!((ids_a[0].len(), ids_b[0].len()), (200, 200));
    t.join().unwrap();
    assert!(!e.is_healthy());
    assert!(e.generate(GenerateRequest::new(vec![1], long)).is_err());
}

/// A word-level tokenizer with only `n` ids, smaller than the model's vocabulary.
fn small_tokenizer(n: usize) -> ferrum_tokenizer::Tokenizer {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..n)
        .map(|i| (format!("t{i}"), serde_json::json!(i)))
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    let path = std::env::temp_dir().join(format!(
        "ferrum-small-tokenizer-{}.json",
        std::process::id()
    ));
    std::fs::write(&path, json.to_string()).unwrap();
    let tok = ferrum_tokenizer::Tokenizer::from_json_file(&path, Default::default()).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(tok.vocab_size(), n);
    tok
}

#[test]
fn an_output_failure_fails_only_its_request() {
    // The model (512 ids) samples id 400, which the tokenizer (300 ids) cannot decode: that
    // request fails; the one beside it in the batch finishes and the engine stays up.
    let e = EngineHandle::start(
        model("tiny-llama"),
        Some(std::sync::Arc::new(small_tokenizer(300))),
        &EngineConfig::default(),
    )
    .unwrap();
    let forced = SamplingParams {
        max_tokens: Some(8),
        logit_bias: vec![(400, 100.0)],
        ..SamplingParams::greedy()
    };
    let fine = SamplingParams {
        max_tokens: Some(8),
        ignore_eos: true,
        logit_bias: vec![(7, 100.0)],
        ..SamplingParams::greedy()
    };
    let mut bad = e
        .generate(GenerateRequest::new(vec![1, 2, 3], forced))
        .unwrap();
    let good = e
        .generate(GenerateRequest::new(vec![1, 2, 4], fine))
        .unwrap();
    let err = loop {
        match bad.blocking_next() {
            Some(Event::Error(msg)) => break msg,
            Some(Event::Token { .. }) => {}
            other => panic!("expected an error, got {other:?}"),
        }
    };
    assert!(err.contains("400"), "{err}");
    let (ids, fin, _) = collect(good, 1);
    assert_eq!(ids[0], vec![7; 8]);
    assert_eq!(fin[0], Some(FinishReason::MaxTokens));
    assert!(e.is_healthy());
    wait_for_idle(&e);
    e.shutdown();
}

/// Every scheduling policy serves the same requests to the same tokens (greedy); tenants'
/// weights are checked at start.
#[test]
fn scheduling_policies_and_tenants() {
    use ferrum_engine::SchedulingPolicy;
    let p = SamplingParams {
        max_tokens: Some(6),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let mut outputs = Vec::new();
    for policy in [
        SchedulingPolicy::Priority,
        SchedulingPolicy::Fifo,
        SchedulingPolicy::Fair(Vec::new()),
    ] {
        let e = engine(
            "tiny-qwen2",
            EngineConfig {
                max_num_seqs: 2,
                scheduling: policy.clone(),
                tenant_weights: if matches!(policy, SchedulingPolicy::Fair(_)) {
                    vec![("a".into(), 3), ("b".into(), 1)]
                } else {
                    Vec::new()
                },
                ..EngineConfig::default()
            },
        );
        let streams: Vec<_> = prompts()[..8]
            .iter()
            .enumerate()
            .map(|(i, prompt)| {
                let r = GenerateRequest {
                    priority: (i % 3) as i32,
                    tenant: Some(["a", "b", "c"][i % 3].to_string()),
                    ..GenerateRequest::new(prompt.clone(), p.clone())
                };
                e.generate(r).unwrap()
            })
            .collect();
        outputs.push(
            streams
                .into_iter()
                .map(|s| collect(s, 1).0)
                .collect::<Vec<_>>(),
        );
        wait_for_idle(&e);
        e.shutdown();
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]));
    let bad = EngineHandle::start(
        model("tiny-qwen2"),
        None,
        &EngineConfig {
            scheduling: SchedulingPolicy::Fair(Vec::new()),
            tenant_weights: vec![("a".into(), 0)],
            ..EngineConfig::default()
        },
    );
    assert!(bad.is_err_and(|e| e.to_string().contains("weight")));
}

/// Greedy sampling of exactly `n` tokens.
fn greedy_exactly(n: usize) -> SamplingParams {
    SamplingParams {
        max_tokens: Some(n),
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

/// The tokens a default engine (no targets, no limits) answers `prompt` with, greedy, `n` of
/// them.
fn plain_tokens(prompt: &[TokenId], n: usize) -> Vec<Vec<TokenId>> {
    let plain = engine("tiny-qwen2", EngineConfig::default());
    let got = collect(
        plain
            .generate(GenerateRequest::new(prompt.to_vec(), greedy_exactly(n)))
            .unwrap(),
        1,
    );
    plain.shutdown();
    got.0
}

/// Admission by prediction with a fake cost (a second per prefill token, which the tiny
/// model's own quick steps barely move: no step of theirs prefills much): behind waiting
/// prompts, a request whose first-token target cannot be met is refused when submitted, with
/// the excess as its retry time; a best-effort one is taken; a target its own prompt cannot
/// meet is the client's error.
#[test]
fn requests_that_would_miss_their_first_token_target_are_refused_up_front() {
    use ferrum_engine::{EngineError, Slo};
    let e = engine(
        "tiny-qwen2",
        EngineConfig {
            max_num_seqs: 1,
            cost_seed: [0.0, 1.0, 0.0, 0.0],
            ..EngineConfig::default()
        },
    );
    let p = greedy_exactly;
    // Steps for the model to be trusted, then one long decode that holds the only slot.
    collect(
        e.generate(GenerateRequest::new(vec![5, 6, 7], p(12)))
            .unwrap(),
        1,
    );
    let running = e
        .generate(GenerateRequest::new(vec![5, 6, 7], p(3000)))
        .unwrap();
    let waiting: Vec<_> = (0..3)
        .map(|i| {
            let prompt: Vec<TokenId> = (0..30).map(|j| 10 + i * 40 + j).collect();
            e.generate(GenerateRequest::new(prompt, p(2))).unwrap()
        })
        .collect();
    let t = Instant::now();
    while e.metrics().num_waiting < 3 || e.metrics().pending_prefill_tokens < 87 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{:?}",
            e.metrics().num_waiting
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(e.metrics().cost_ready);
    let with = |ms, best_effort| GenerateRequest {
        slo: Some(Slo {
            ttft: Some(Duration::from_millis(ms)),
            tpot: None,
            best_effort,
        }),
        ..GenerateRequest::new(vec![3, 4, 5], p(1))
    };
    // About 89 s of prefill ahead and its own, against 10 s.
    let asked = Instant::now();
    match e.generate(with(10_000, false)) {
        Err(EngineError::Unmeetable { retry_after, msg }) => {
            let r = retry_after.as_secs_f64();
            assert!((70.0..=90.0).contains(&r), "{r} {msg}");
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a request that must miss its target was taken"),
    }
    assert!(
        asked.elapsed() < Duration::from_millis(10),
        "{:?}",
        asked.elapsed()
    );
    let taken = e.generate(with(10_000, true)).unwrap();
    assert!(matches!(
        e.generate(GenerateRequest {
            prompt: (0..40).collect(),
            ..with(10_000, false)
        }),
        Err(EngineError::Request(m)) if m.contains("alone")
    ));
    drop(running);
    for s in waiting {
        collect(s, 1);
    }
    collect(taken, 1);
    wait_for_idle(&e);
    // The best-effort request was predicted: its first token went to admission's record (too
    // few yet to move its ratio); the requests without a target did not.
    let m = e.metrics();
    assert_eq!((m.ttft_observed, m.ttft_ratio), (1, 1.0));
    e.shutdown();
}

/// A time-per-output-token target with a fake cost (10 ms a prefill token): while a decode
/// with a 50 ms target runs, steps cap their prefill (published in the metrics) far below the
/// budget, and a long prompt beside it is prefilled in those chunks and answers as it does on
/// an engine without targets; without a target there is no cap.
#[test]
fn a_tpot_target_caps_the_prefill_beside_its_decode() {
    use ferrum_engine::Slo;
    let e = engine(
        "tiny-qwen2",
        EngineConfig {
            cost_seed: [0.0, 0.01, 0.0, 0.0],
            ..EngineConfig::default()
        },
    );
    let p = greedy_exactly;
    // Enough steps for the model to be trusted.
    collect(
        e.generate(GenerateRequest::new(vec![5, 6, 7], p(12)))
            .unwrap(),
        1,
    );
    assert!(e.metrics().cost_ready);
    assert_eq!(e.metrics().prefill_cap, None);
    let decode = e
        .generate(GenerateRequest {
            slo: Some(Slo {
                tpot: Some(Duration::from_millis(50)),
                ..Slo::default()
            }),
            ..GenerateRequest::new(vec![5, 6, 7], p(3000))
        })
        .unwrap();
    let t = Instant::now();
    while e.metrics().prefill_cap.is_none() {
        assert!(t.elapsed() < Duration::from_secs(20), "no cap came");
        std::thread::sleep(Duration::from_millis(1));
    }
    let budget = EngineConfig::default().max_num_batched_tokens;
    let cap = e.metrics().prefill_cap.unwrap();
    assert!(cap < 100 && cap < budget, "cap {cap} of {budget}");
    // A long prompt, against the tokens of an engine without any target.
    let other: Vec<TokenId> = (0..300).map(|j| 5 + j % 190).collect();
    let want = plain_tokens(&other, 4);
    let beside = collect(e.generate(GenerateRequest::new(other, p(4))).unwrap(), 1).0;
    assert_eq!(beside, want, "chunked or not, the same tokens");
    drop(decode);
    wait_for_idle(&e);
    assert_eq!(
        e.metrics().prefill_cap,
        None,
        "no cap without the decode that set it"
    );
    assert_eq!(e.metrics().max_num_batched_tokens, budget);
    e.shutdown();
}

/// The cost calibration at start: the engine's model is trusted before any request, the
/// metrics show nothing of the calibration's requests, and the first request's tokens are
/// those of an engine without it. A first-token target the prompt alone cannot meet is then
/// the client's error from the first request on (an uncalibrated engine has nothing to judge
/// it by, and takes it).
#[test]
fn a_calibrated_engine_judges_targets_from_the_first_request() {
    use ferrum_engine::{EngineError, Slo};
    let prompt: Vec<TokenId> = (0..40).map(|j| 3 + (j * 11) % 150).collect();
    let tight = GenerateRequest {
        slo: Some(Slo {
            ttft: Some(Duration::from_nanos(1)),
            ..Slo::default()
        }),
        ..GenerateRequest::new(prompt.clone(), greedy_exactly(2))
    };
    let plain = engine("tiny-qwen2", EngineConfig::default());
    let m = plain.metrics();
    assert!(!m.cost_ready && m.calibration_seconds.is_none());
    let want = collect(
        plain
            .generate(GenerateRequest::new(prompt.clone(), greedy_exactly(6)))
            .unwrap(),
        1,
    );
    collect(plain.generate(tight.clone()).unwrap(), 1);
    plain.shutdown();
    let e = engine(
        "tiny-qwen2",
        EngineConfig {
            calibrate: true,
            ..EngineConfig::default()
        },
    );
    let m = e.metrics();
    assert!(m.cost_ready, "{:?}", m.cost);
    assert!(m.calibration_seconds.is_some_and(|s| s > 0.0));
    assert!(m.cost[1] > 0.0 || m.cost[0] > 0.0, "{:?}", m.cost);
    assert_eq!((m.steps, m.prompt_tokens, m.generation_tokens), (0, 0, 0));
    assert_eq!(
        (m.prefix_cache_queries, m.num_running, m.num_waiting),
        (0, 0, 0)
    );
    assert_eq!(m.time_to_first_token.count, 0);
    match e.generate(tight) {
        Err(EngineError::Request(msg)) => assert!(msg.contains("alone"), "{msg}"),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a target the prompt alone cannot meet was taken"),
    }
    let got = collect(
        e.generate(GenerateRequest::new(prompt, greedy_exactly(6)))
            .unwrap(),
        1,
    );
    assert_eq!(got.0, want.0);
    e.shutdown();
}

/// Under `slo` scheduling a first-token target in play limits every step to a quarter of it
/// (published): with a fake cost of 10 ms a prefill token, a 2 s target limits steps to
/// 0.5 s, so a long prompt without a target is prefilled in chunks shorter than it (about 45
/// tokens; the fit may move the cost a little) and answers
/// as on an engine without targets; under `fifo` a target sets no limit.
#[test]
fn a_first_token_target_limits_the_steps_under_slo() {
    use ferrum_engine::Slo;
    use ferrum_scheduler::SchedulingPolicy;
    let p = greedy_exactly;
    let other: Vec<TokenId> = (0..300).map(|j| 5 + j % 190).collect();
    let want = plain_tokens(&other, 4);
    let mut steps = Vec::new();
    for scheduling in [SchedulingPolicy::Slo, SchedulingPolicy::Fifo] {
        let e = engine(
            "tiny-qwen2",
            EngineConfig {
                cost_seed: [0.0, 0.01, 0.0, 0.0],
                scheduling: scheduling.clone(),
                ..EngineConfig::default()
            },
        );
        collect(
            e.generate(GenerateRequest::new(vec![5, 6, 7], p(12)))
                .unwrap(),
            1,
        );
        assert!(e.metrics().cost_ready);
        assert_eq!(e.metrics().step_limit, None);
        let targeted = GenerateRequest {
            slo: Some(Slo {
                ttft: Some(Duration::from_secs(2)),
                ..Slo::default()
            }),
            ..GenerateRequest::new(vec![5, 6, 7], p(2))
        };
        collect(e.generate(targeted).unwrap(), 1);
        wait_for_idle(&e);
        let before = e.metrics().steps;
        let got = collect(
            e.generate(GenerateRequest::new(other.clone(), p(4)))
                .unwrap(),
            1,
        );
        assert_eq!(
            got.0, want,
            "{scheduling:?}: chunked or not, the same tokens"
        );
        wait_for_idle(&e);
        let m = e.metrics();
        steps.push(m.steps - before);
        if scheduling == SchedulingPolicy::Slo {
            assert!(
                m.step_limit.is_some_and(|l| (l - 0.5).abs() < 1e-9),
                "{:?}",
                m.step_limit
            );
            // What the limit lets the next (idle) step prefill.
            assert!(
                m.prefill_cap.is_some_and(|c| c < 300),
                "{:?}",
                m.prefill_cap
            );
        } else {
            assert_eq!((m.step_limit, m.prefill_cap), (None, None));
        }
        e.shutdown();
    }
    // The prompt went in one step under fifo, in several under the limit.
    assert!(steps[0] > steps[1] + 1, "steps under slo, fifo: {steps:?}");
}
