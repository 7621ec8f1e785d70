//! Models loaded onto one compute pool (a draft model beside its target) share its threads and
//! compute exactly what each computes on a pool of its own, also when both run at once.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ferrum_models::{load_model, LoadOptions};
use ferrum_runtime::ThreadPool;
use std::sync::Arc;

#[test]
fn models_share_the_pool_they_are_given() {
    let llama = fixtures().join("tiny-llama");
    let qwen = fixtures().join("tiny-qwen2");
    let prompt = ids(&reference_json(&llama)["cases"][0]["prompt_ids"]);
    let alone_llama = prompt_logits(&mut load(&llama), &prompt);
    let alone_qwen = prompt_logits(&mut load(&qwen), &prompt);

    let pool = Arc::new(ThreadPool::new(2).unwrap());
    let shared = |path| {
        load_model(
            path,
            &LoadOptions {
                pool: Some(Arc::clone(&pool)),
                precision: ferrum_runtime::cpu::MatmulPrecision::Float,
                ..LoadOptions::default()
            },
        )
        .unwrap()
    };
    let mut target = shared(&llama);
    let mut draft = shared(&qwen);
    assert!(Arc::ptr_eq(
        target.compute_pool().unwrap(),
        draft.compute_pool().unwrap()
    ));
    assert!(Arc::ptr_eq(target.compute_pool().unwrap(), &pool));
    // Both at once from two threads: the pool takes one job at a time.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| prompt_logits(&mut target, &prompt));
        let b = s.spawn(|| prompt_logits(&mut draft, &prompt));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a, alone_llama);
    assert_eq!(b, alone_qwen);

    let both = LoadOptions {
        pool: Some(pool),
        num_threads: Some(4),
        ..LoadOptions::default()
    };
    let err = load_model(&llama, &both).unwrap_err().to_string();
    assert!(err.contains("shared compute pool"), "{err}");
}
