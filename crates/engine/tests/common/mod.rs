//! Helpers shared by the engine's end-to-end tests on the tiny fixtures.
#![allow(dead_code, clippy::unwrap_used)]

use ferrum_engine::{EngineConfig, EngineHandle};
use ferrum_models::{load_model, LoadOptions, Model};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `tests/fixtures/<name>`, the packed files unpacked (`ferrum_testdata`).
pub fn fixture(name: &str) -> PathBuf {
    ferrum_testdata::fixture(name)
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

/// `models/SmolLM2-135M-Instruct.Q4_1.gguf` (scripts/fetch-smollm2.sh), or `None` with a
/// skip message when it is absent; under CI (`CI` set) a missing model is a failure.
pub fn smollm2_path() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing under CI",
        p.display()
    );
    eprintln!(
        "skipping: {} is missing (run scripts/fetch-smollm2.sh)",
        p.display()
    );
    None
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
