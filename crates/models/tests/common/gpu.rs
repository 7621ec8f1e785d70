//! The devices the CUDA backend's tests run on, and their KV caches.

use ferrum_models::backend::CudaBackend;
use ferrum_models::{FamilyModel, KvCache};
use ferrum_runtime::cuda::{Gpu, InterpreterConfig, SharedGpu};

/// The interpreted device (the Triton interpreter in a worker: every commit; its venv missing
/// is a failure under CI) and CUDA device 0 when there is one ("skipped: no GPU" otherwise; a
/// failure with `FERRUM_REQUIRE_GPU` set, as `scripts/test-gpu.sh` does).
pub fn devices() -> Vec<SharedGpu> {
    let mut out = Vec::new();
    let config = InterpreterConfig::from_env();
    if config.is_available() {
        out.push(SharedGpu::new(Gpu::interpreted(&config).unwrap()));
    } else if std::env::var_os("CI").is_some() {
        panic!(
            "CI: the Triton venv is missing ({})",
            config.python.display()
        );
    } else {
        eprintln!("interpreted device skipped: run scripts/test-cuda-interpret.sh");
    }
    match Gpu::cuda(0) {
        Ok(gpu) => out.push(SharedGpu::new(gpu)),
        Err(e) if std::env::var_os("FERRUM_REQUIRE_GPU").is_some() => {
            panic!("FERRUM_REQUIRE_GPU is set but CUDA is unusable: {e}")
        }
        Err(e) => eprintln!("skipped: no GPU ({e})"),
    }
    out
}

/// A cache of room for `tokens` tokens in blocks of `bs` (one block spare).
pub fn gpu_cache(model: &FamilyModel<CudaBackend>, tokens: usize, bs: usize) -> KvCache {
    model
        .backend()
        .kv_cache(model.config(), tokens.div_ceil(bs) + 1, bs)
        .unwrap()
}
