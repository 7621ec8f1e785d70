//! The batching engine on the real SmolLM2-135M-Instruct GGUF: a second request that shares a
//! long prefix hits the prefix cache and gives identical output; n-gram speculative decoding
//! and draft-model speculative decoding (the model as its own draft) give the same greedy
//! tokens as decoding without them. Needs `models/SmolLM2-135M-Instruct.Q4_1.gguf`
//! (scripts/fetch-smollm2.sh); skips without it, except under CI (`CI` set).
#![allow(clippy::unwrap_used)]

mod common;

use ferrum_engine::{
    EngineConfig, EngineHandle, Event, GenerateRequest, NgramProposer, Proposer, SpeculativeConfig,
    Usage,
};
use ferrum_models::{load_model, load_text_assets, LoadOptions};
use ferrum_types::{SamplingParams, TokenId};
use std::time::{Duration, Instant};

/// Token ids, time to first token and usage of one request.
fn run(e: &EngineHandle, prompt: &[TokenId]) -> (Vec<TokenId>, Duration, Usage) {
    let p = SamplingParams {
        max_tokens: Some(8),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let start = Instant::now();
    let mut s = e
        .generate(GenerateRequest::new(prompt.to_vec(), p))
        .unwrap();
    let (mut ids, mut ttft) = (Vec::new(), None);
    loop {
        match s.blocking_next().unwrap() {
            Event::Token { token, .. } => {
                ttft.get_or_insert_with(|| start.elapsed());
                ids.push(token);
            }
            Event::Done { usage } => return (ids, ttft.unwrap(), usage),
            Event::Error(e) => panic!("{e}"),
            Event::Finished { .. } => {}
        }
    }
}

#[test]
fn shared_prefix_hits_the_cache_and_gives_the_same_tokens() {
    let Some(path) = common::smollm2_path() else {
        return;
    };
    let model = load_model(&path, &LoadOptions::default()).unwrap();
    let text = load_text_assets(&path).unwrap();
    let tok = text.tokenizer;
    let doc = "The Rhine flows from the Swiss Alps through Germany and the Netherlands to the North Sea. "
        .repeat(20);
    let prefix = tok.encode(&doc, true).unwrap();
    assert!(prefix.len() > 300, "{}", prefix.len());
    let q1 = [
        prefix.clone(),
        tok.encode(" Where does the Rhine start?", false).unwrap(),
    ]
    .concat();
    let q2 = [
        prefix.clone(),
        tok.encode(" Where does it end?", false).unwrap(),
    ]
    .concat();
    let e = EngineHandle::start(model, Some(tok), &EngineConfig::default()).unwrap();
    let (ids1, cold, u1) = run(&e, &q1);
    assert_eq!(u1.cached_tokens, 0);
    let (_, warm, u2) = run(&e, &q2);
    // Every full 16-token block of the shared prefix is reused.
    assert!(u2.cached_tokens >= prefix.len() / 16 * 16 - 16, "{u2:?}");
    let (again, _, u3) = run(&e, &q1);
    assert_eq!(ids1, again, "reused K/V must give the same tokens");
    assert!(u3.cached_tokens >= q1.len() - 16);
    eprintln!("time to first token: cold {cold:?}, shared prefix {warm:?}");
    // What was reused was not computed: the engine's counters agree with the usage reports.
    let m = e.metrics();
    assert_eq!(
        m.prefix_cache_hits as usize,
        u2.cached_tokens + u3.cached_tokens
    );
    e.shutdown();
}

#[test]
fn ngram_speculation_keeps_greedy_output() {
    let Some(path) = common::smollm2_path() else {
        return;
    };
    let text = load_text_assets(&path).unwrap();
    let msgs = [ferrum_tokenizer::ChatMessage::new(
        "user",
        "Repeat this sentence exactly, twice: The Rhine flows from the Swiss Alps through \
         Germany and the Netherlands to the North Sea.",
    )];
    let prompt = text.encode_chat(&msgs).unwrap();
    let p = SamplingParams {
        max_tokens: Some(48),
        ..SamplingParams::greedy()
    };
    let generate = |spec: Option<SpeculativeConfig>| {
        let model = load_model(&path, &LoadOptions::default()).unwrap();
        let cfg = EngineConfig {
            speculative: spec,
            ..EngineConfig::default()
        };
        let tok = Some(text.tokenizer.clone());
        let e = match spec.map(|s| s.proposer) {
            Some(Proposer::Draft) => {
                // The model as its own draft, on its threads: every proposal is right.
                let opts = LoadOptions {
                    pool: Some(model.compute_pool().unwrap().clone()),
                    ..LoadOptions::default()
                };
                let draft = load_model(&path, &opts).unwrap();
                EngineHandle::start_with_draft(model, draft, tok, &cfg).unwrap()
            }
            _ => EngineHandle::start(model, tok, &cfg).unwrap(),
        };
        let mut s = e
            .generate(GenerateRequest::new(prompt.clone(), p.clone()))
            .unwrap();
        let mut ids = Vec::new();
        let usage = loop {
            match s.blocking_next().unwrap() {
                Event::Token { token, .. } => ids.push(token),
                Event::Done { usage } => break usage,
                Event::Error(e) => panic!("{e}"),
                Event::Finished { .. } => {}
            }
        };
        e.shutdown();
        (ids, usage)
    };
    let (want, _) = generate(None);
    let (got, usage) = generate(Some(SpeculativeConfig {
        proposer: Proposer::Ngram(NgramProposer { min: 2, max: 4 }),
        num_speculative_tokens: 4,
        disable_by_batch_size: 4,
    }));
    assert_eq!(got, want);
    eprintln!(
        "{} of {} proposed tokens accepted, {:.2} tokens per verifying step",
        usage.spec_accepted_tokens,
        usage.spec_draft_tokens,
        usage.mean_acceptance_length()
    );
    assert!(
        usage.spec_accepted_tokens * 2 > usage.spec_draft_tokens,
        "a repeated sentence is mostly guessed: {usage:?}"
    );
    let (got, usage) = generate(Some(SpeculativeConfig {
        proposer: Proposer::Draft,
        num_speculative_tokens: 4,
        disable_by_batch_size: 4,
    }));
    assert_eq!(got, want);
    assert!(usage.spec_draft_tokens > 0);
    assert_eq!(
        usage.spec_accepted_tokens, usage.spec_draft_tokens,
        "{usage:?}"
    );
}
