//! The whole engine (scheduler, paged KV cache on the device, chunked prefill, batching, prefix
//! reuse, sampling) on the CUDA backend, run on the interpreted device: every commit runs the
//! GPU path end to end without a GPU. Skipped without the Triton venv
//! (`scripts/test-cuda-interpret.sh` makes it), a failure under CI.
#![allow(clippy::unwrap_used)]

mod common;

use common::{fixture, wait_for_idle};
use ferrum_engine::{EngineConfig, EngineHandle, Event, GenerateRequest, KvCacheSize};
use ferrum_models::{load_model_on, LoadOptions};
use ferrum_runtime::cuda::InterpreterConfig;
use ferrum_runtime::Device;
use ferrum_types::SamplingParams;
use serde_json::Value;

fn interpreted_available() -> bool {
    if InterpreterConfig::from_env().is_available() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI: the Triton venv is missing (scripts/test-cuda-interpret.sh)"
    );
    eprintln!("skipped: the interpreted device needs scripts/test-cuda-interpret.sh");
    false
}

fn collect(e: &EngineHandle, prompt: Vec<u32>, max_tokens: usize) -> Vec<u32> {
    let params = SamplingParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let mut s = e.generate(GenerateRequest::new(prompt, params)).unwrap();
    let mut out = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token { token, .. }) => out.push(token),
            Some(Event::Finished { .. }) => {}
            Some(Event::Done { .. }) | None => return out,
            Some(Event::Error(e)) => panic!("{e}"),
        }
    }
}

#[test]
fn fixtures_greedy_through_the_engine_on_the_interpreted_device() {
    if !interpreted_available() {
        return;
    }
    let dir = fixture("tiny-llama");
    let model = load_model_on(&dir, &LoadOptions::default(), Device::Interpreted).unwrap();
    assert!(model.device_name().starts_with("interpreted"));
    // Small steps: long prompts prefill in several chunks beside other sequences' decodes.
    let cfg = EngineConfig {
        max_num_batched_tokens: 24,
        kv_cache: KvCacheSize::Bytes(4 << 20),
        ..EngineConfig::default()
    };
    let e = EngineHandle::start(model, None, &cfg).unwrap();
    assert!(e.metrics().device.starts_with("interpreted"));
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let cases: Vec<(Vec<u32>, Vec<u32>)> = reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), ids(&c["greedy_ids"])))
        .collect();
    // All at once: one batch of mixed prefill chunks and decodes.
    std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(prompt, _)| s.spawn(|| collect(&e, prompt.clone(), 16)))
            .collect();
        for (h, (_, want)) in handles.into_iter().zip(&cases) {
            assert_eq!(&h.join().unwrap(), want, "batched greedy ids");
        }
    });
    wait_for_idle(&e);
    // Again, alone: the prompts' full blocks now come from the prefix cache.
    let (prompt, want) = &cases[cases.len() - 1];
    assert_eq!(&collect(&e, prompt.clone(), 16), want, "with prefix reuse");
    assert!(
        e.metrics().prefix_cache_hits > 0,
        "the prefix cache was used"
    );
    wait_for_idle(&e);
    e.shutdown();
}
