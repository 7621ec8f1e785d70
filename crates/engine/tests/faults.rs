//! Fault containment with faults injected on purpose (feature `fault-injection`): a panic in
//! the engine loop ends every request with an error, marks the engine unhealthy and makes new
//! requests fail at once instead of waiting on a loop that is gone.
#![allow(clippy::unwrap_used)]

use ferrum_engine::{
    EngineConfig, EngineError, EngineHandle, Event, FaultInjection, GenerateRequest,
};
use ferrum_models::{load_model, LoadOptions};
use ferrum_types::SamplingParams;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn model() -> ferrum_models::Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-llama");
    load_model(
        &dir,
        &LoadOptions {
            num_threads: Some(1),
            ..LoadOptions::default()
        },
    )
    .unwrap()
}

fn long() -> SamplingParams {
    SamplingParams {
        max_tokens: Some(100),
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

#[test]
fn a_panicking_loop_fails_every_request_and_then_fails_fast() {
    let faults = FaultInjection {
        panic_at_step: Some(4),
    };
    let e =
        EngineHandle::start_with_faults(model(), None, &EngineConfig::default(), faults).unwrap();
    assert!(e.is_healthy());
    let mut streams: Vec<_> = (0..3)
        .map(|i| {
            e.generate(GenerateRequest::new(vec![1, 2, 3 + i], long()))
                .unwrap()
        })
        .collect();
    for s in &mut streams {
        let mut tokens = 0;
        let error = loop {
            match s.blocking_next() {
                Some(Event::Token { .. }) => tokens += 1,
                Some(Event::Error(msg)) => break msg,
                other => panic!("expected tokens then an error, got {other:?}"),
            }
        };
        assert!(tokens < 100, "the request ran to the end");
        assert!(error.contains("injected fault"), "{error}");
        // Nothing after the error: the stream is closed.
        assert!(s.blocking_next().is_none());
    }
    assert!(!e.is_healthy());
    assert!(!e.metrics().healthy);
    let t = Instant::now();
    match e.generate(GenerateRequest::new(vec![1, 2, 3], long())) {
        Err(EngineError::Unavailable(msg)) => assert!(msg.contains("not running"), "{msg}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Refused at once, without waiting on the dead loop (the bound is a safety net for a
    // loaded machine; a wait would be for the 30 s a request may take).
    assert!(t.elapsed() < Duration::from_secs(10));
    e.shutdown();
}
