//! Helpers shared by the engine's end-to-end tests on the tiny fixtures.
#![allow(dead_code, clippy::unwrap_used)]

use ferrum_engine::{EngineConfig, EngineHandle};
use ferrum_models::{load_model, LoadOptions, Model};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// A fixture model on two threads of its own.
pub fn model(name: &str) -> Model {
    load_model(
        &fixture(name),
        &LoadOptions {
            num_threads: Some(2),
            ..LoadOptions::default()
        },
    )
    .unwrap()
}

pub fn engine(name: &str, cfg: EngineConfig) -> EngineHandle {
    EngineHandle::start(model(name), None, &cfg).unwrap()
}

/// Waits until no sequence runs or waits and every KV block is free (nothing leaked).
pub fn wait_for_idle(e: &EngineHandle) {
    let t = Instant::now();
    loop {
        let m = e.metrics();
        if m.kv_blocks_free == m.kv_blocks_total && m.num_running == 0 && m.num_waiting == 0 {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "engine never went idle: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
