#!/usr/bin/env bash
# The CUDA backend's checks on a real GPU. Without one (no nvidia-smi, or it sees no GPU) it
# says "skipped: no GPU" and exits 0; with one, every check must pass:
#   1. the Rust device layer on CUDA device 0: every embedded kernel (the cubins CI checks
#      against the sources) loaded through the driver and launched with the backend's own
#      grids and arguments, against host references (crates/runtime/tests/cuda_kernels.rs,
#      with FERRUM_REQUIRE_GPU=1 so it cannot skip);
#   2. the kernel sources through Triton's JIT on the GPU against the numpy references
#      (kernels/tests, FERRUM_KERNEL_RUNNER=cuda; needs torch and triton in python3);
#   3. with --bench, kernels/bench_gpu.py: the kernels' times beside PyTorch's.
# Needs a Rust toolchain to build the test binary, or FERRUM_GPU_TEST_BIN naming a prebuilt
# one (`cargo test -p ferrum-runtime --test cuda_kernels --no-run` prints its path).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "skipped: no GPU (nvidia-smi finds none)"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
status=0

echo "== Rust device layer on CUDA (cuda_kernels)"
bin="${FERRUM_GPU_TEST_BIN:-}"
if [[ -z "$bin" ]]; then
    bin="$(cargo test -p ferrum-runtime --test cuda_kernels --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable") and m.get("target", {}).get("name") == "cuda_kernels": print(m["executable"])')"
fi
FERRUM_REQUIRE_GPU=1 "$bin" --test-threads=1 --nocapture || status=1

echo "== kernel sources through Triton's JIT on the GPU (kernels/tests)"
(cd kernels/tests && FERRUM_KERNEL_RUNNER=cuda python3 -m unittest -v test_kernels) || status=1

if [[ "${1:-}" == "--bench" ]]; then
    echo "== kernel times beside PyTorch (kernels/bench_gpu.py)"
    python3 kernels/bench_gpu.py || status=1
fi
if [[ $status -ne 0 ]]; then echo "GPU checks FAILED"; else echo "GPU checks passed"; fi
exit $status
