#!/usr/bin/env bash
# The CUDA backend's checks on a real GPU. Without one (no nvidia-smi, or it sees no GPU) it
# says "skipped: no GPU" and exits 0; with one, every check must pass:
#   1. the device layer on CUDA device 0: every embedded kernel (the cubins CI checks against
#      the sources) loaded through the driver and launched with the backend's own grids and
#      arguments, against host references (crates/runtime/tests/cuda_kernels.rs and
#      cuda_attention.rs), and the
#      choice between each kernel's generic and aligned binary (cuda_variants.rs), and the
#      streams, events, copies, host buffers and cuBLASLt products (cuda_streams.rs);
#   2. the Llama-family fixtures through the CUDA backend against transformers' logits and
#      greedy ids (crates/models/tests/cuda_fixtures.rs), the paged cache's device blocks and
#      host tier (cuda_kv.rs) and the fp8 KV cache (cuda_fp8.rs); all with FERRUM_REQUIRE_GPU=1,
#      so they cannot skip;
#   3. the kernel sources through Triton's JIT on the GPU against the numpy references
#      (kernels/tests, FERRUM_KERNEL_RUNNER=cuda; needs torch and triton in python3);
#   4. the OpenAI client tests (tests/openai) against `ferrum serve --device cuda` on the tiny
#      fixture, and on SmolLM2 when models/ has it (needs the openai package, 3.54.0, in
#      python3);
#   5. with --llama8b DIR: a Llama-3.1-8B-shaped model with random bf16 weights made in DIR by
#      transformers on the GPU (scripts/gpu/llama8b_reference.py), Ferrum's logits against
#      transformers' on the same GPU (~50 GB of GPU memory, ~35 GB of disk);
# Kernel timings are not taken here: benchmarks/gpu/run.sh profiles the shipped binaries inside
# the engine's own steps (`ferrum bench latency --profile-kernels`). The JIT timings of
# kernels/bench_gpu.py and tune_gpu.py timed other binaries than the ones that ship, and are
# retired.
# Takes the binaries scripts/gpu/pack.sh packed (.gpu-pack, carried by the call; the GPU machine
# has no cargo), else prebuilt ones from FERRUM_GPU_TEST_BINS (a folder holding cuda_kernels,
# cuda_attention, cuda_variants, cuda_streams, cuda_fixtures, cuda_kv and cuda_fp8, from
# `cargo test --no-run`) and FERRUM_BIN (a ferrum binary), else builds them
# with cargo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

llama8b=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --llama8b) llama8b="$2"; shift 2 ;;
        --bench)
            echo "--bench is retired: kernel timings come from benchmarks/gpu/run.sh, which" \
                "profiles the shipped binaries in the engine's steps" >&2
            exit 2 ;;
        *) echo "usage: $0 [--llama8b DIR]" >&2; exit 2 ;;
    esac
done

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "skipped: no GPU (nvidia-smi finds none)"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
source scripts/gpu/use-pack.sh
bash scripts/unpack-fixtures.sh
status=0

test_bin() {
    if [[ -n "${FERRUM_GPU_TEST_BINS:-}" ]]; then
        echo "$FERRUM_GPU_TEST_BINS/$2"
        return
    fi
    cargo test -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") == sys.argv[1]:
        print(m["executable"])' "$2"
}

echo "== device layer on CUDA (cuda_kernels)"
FERRUM_REQUIRE_GPU=1 "$(test_bin ferrum-runtime cuda_kernels)" --test-threads=1 --nocapture \
    || status=1
echo "== KV writes and paged attention (cuda_attention)"
FERRUM_REQUIRE_GPU=1 "$(test_bin ferrum-runtime cuda_attention)" --test-threads=1 --nocapture \
    || status=1
echo "== which binary each launch takes, aligned or generic (cuda_variants)"
FERRUM_REQUIRE_GPU=1 "$(test_bin ferrum-runtime cuda_variants)" --test-threads=1 --nocapture \
    || status=1
echo "== streams, events, copies and cuBLASLt products (cuda_streams)"
FERRUM_REQUIRE_GPU=1 "$(test_bin ferrum-runtime cuda_streams)" --test-threads=1 --nocapture \
    || status=1
echo "== fixtures through the CUDA backend (cuda_fixtures)"
FERRUM_REQUIRE_GPU=1 "$(test_bin ferrum-models cuda_fixtures)" --test-threads=1 --nocapture \
    --skip llama31_8b || status=1
echo "== the paged cache's device blocks and host tier (cuda_kv)"
FERRUM_REQUIRE_GPU=1 "$(test_bin ferrum-models cuda_kv)" --test-threads=1 --nocapture \
    || status=1
echo "== the fp8 KV cache against the reference (cuda_fp8)"
FERRUM_REQUIRE_GPU=1 "$(test_bin ferrum-models cuda_fp8)" --test-threads=1 --nocapture \
    || status=1

echo "== kernel sources through Triton's JIT on the GPU (kernels/tests)"
(cd kernels/tests && FERRUM_KERNEL_RUNNER=cuda python3 -m unittest -v test_kernels test_attention test_fp8 \
  test_sampling) || status=1

echo "== OpenAI client tests against ferrum serve --device cuda (tests/openai)"
if python3 -c 'import openai' 2>/dev/null; then
    if [[ -z "${FERRUM_BIN:-}" ]]; then
        cargo build --quiet --release --bin ferrum
        FERRUM_BIN="$PWD/target/release/ferrum"
    fi
    FERRUM_BIN="$FERRUM_BIN" FERRUM_FIXTURES="$PWD/tests/fixtures" \
        FERRUM_SMOLLM2="${FERRUM_SMOLLM2:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}" \
        FERRUM_SERVE_ARGS="--device cuda" python3 -m unittest discover -s tests/openai \
        -t tests/openai -v || status=1
else
    echo "NOT RUN: python3 has no openai package (pip install openai==3.54.0)"
    status=1
fi

if [[ -n "$llama8b" ]]; then
    echo "== Llama-3.1-8B-shaped model against transformers on the GPU"
    if [[ ! -f "$llama8b/reference.json" ]]; then
        python3 scripts/gpu/llama8b_reference.py "$llama8b" || status=1
    fi
    FERRUM_GPU_LLAMA8B="$llama8b" "$(test_bin ferrum-models cuda_fixtures)" --nocapture \
        llama31_8b || status=1
fi
if [[ $status -ne 0 ]]; then echo "GPU checks FAILED"; else echo "GPU checks passed"; fi
exit $status
