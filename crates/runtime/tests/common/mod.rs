//! The devices the GPU tests run on: the interpreted device (the Triton interpreter in a
//! worker; `scripts/test-cuda-interpret.sh` makes its venv; skipped when absent, a failure
//! under CI) and CUDA device 0 ("skipped: no GPU" without one; a failure when
//! `FERRUM_REQUIRE_GPU` is set, as `scripts/test-gpu.sh` does).

#![allow(dead_code)]

use ferrum_runtime::cuda::{Gpu, InterpreterConfig};

pub mod host;

pub fn devices() -> Vec<Gpu> {
    let mut out = Vec::new();
    let config = InterpreterConfig::from_env();
    if config.is_available() {
        out.push(Gpu::interpreted(&config).expect("interpreted device"));
    } else if std::env::var_os("CI").is_some() {
        panic!(
            "CI: the Triton venv is missing ({})",
            config.python.display()
        );
    } else {
        eprintln!("interpreted device skipped: run scripts/test-cuda-interpret.sh");
    }
    match Gpu::cuda(0) {
        Ok(gpu) => {
            eprintln!(
                "{}: kernels loaded in {:?}",
                gpu.describe(),
                gpu.kernel_load_time()
            );
            out.push(gpu);
        }
        Err(e) if std::env::var_os("FERRUM_REQUIRE_GPU").is_some() => {
            panic!("FERRUM_REQUIRE_GPU is set but CUDA is unusable: {e}")
        }
        Err(e) => eprintln!("skipped: no GPU ({e})"),
    }
    out
}
