//! Fair shares between tenants through the engine, as clients load it: two tenants weighted
//! 3:1, each a closed loop of 8 clients (a client sends its next request when its last one
//! ended), against 4 running slots. The tokens the engine computes for each
//! (`Metrics::tenant_computed_tokens`) follow the weights within 10% while both flood; a
//! tenant alone gets every slot.
#![allow(clippy::unwrap_used)]

mod common;

use common::engine;
use ferrum_engine::{EngineConfig, EngineHandle, Event, GenerateRequest, SchedulingPolicy};
use ferrum_types::{SamplingParams, TokenId};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

fn client(e: &EngineHandle, tenant: &str, seed: usize, stop: &AtomicBool, done: &AtomicUsize) {
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let prompt: Vec<TokenId> = (0..100)
            .map(|j| (3 + (seed * 7919 + i * 104_729 + j * 31) % 190) as TokenId)
            .collect();
        let r = GenerateRequest {
            tenant: Some(tenant.to_string()),
            ..GenerateRequest::new(
                prompt,
                SamplingParams {
                    max_tokens: Some(48),
                    ignore_eos: true,
                    ..SamplingParams::greedy()
                },
            )
        };
        let mut s = e.generate(r).unwrap();
        loop {
            match s.blocking_next() {
                Some(Event::Done { .. }) | None => break,
                Some(Event::Error(e)) => panic!("{e}"),
                Some(_) => {}
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
}

#[test]
fn weighted_tenants_share_a_flooded_engine_by_their_weights() {
    let e = Arc::new(engine(
        "tiny-qwen2",
        EngineConfig {
            max_num_seqs: 4,
            scheduling: SchedulingPolicy::Fair(Vec::new()),
            tenant_weights: vec![("a".into(), 3), ("b".into(), 1)],
            ..EngineConfig::default()
        },
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|c| {
            let (e, stop, done) = (e.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || client(&e, ["a", "b"][c % 2], c, &stop, &done))
        })
        .collect();
    while done.load(Ordering::Relaxed) < 120 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // While both flood (the queued requests drain after the clients stop, without
    // contention).
    let m = e.metrics();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let got: Vec<u64> = m.tenant_computed_tokens.iter().map(|(_, n)| *n).collect();
    let ratio = got[0] as f64 / got[1] as f64;
    assert!(
        (2.7..=3.3).contains(&ratio),
        "computed {got:?}: {ratio:.2}, not 3:1"
    );
    // Tenant b alone: every slot is its own.
    stop.store(false, Ordering::Relaxed);
    let threads: Vec<_> = (0..8)
        .map(|c| {
            let (e, stop, done) = (e.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || client(&e, "b", 100 + c, &stop, &done))
        })
        .collect();
    let mut full = false;
    let t = std::time::Instant::now();
    while !full && t.elapsed() < std::time::Duration::from_secs(30) {
        full = e.metrics().num_running == 4;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(full, "tenant b alone never ran 4 sequences");
}
