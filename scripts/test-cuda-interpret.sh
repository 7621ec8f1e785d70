#!/usr/bin/env bash
# The CUDA backend without a GPU: installs the pinned Triton (kernels/requirements.txt) into
# target/triton-venv (scripts/triton-venv.sh), checks that the embedded kernel binaries are what the sources give
# (kernels/build.py --check: the sources' digest, every binary's checksum, one specialization
# of each kernel function compiled again; `--check --full` compiles all 724), reads their resources and disassembly against the record
# (kernels/inspect_binaries.py: spills, load widths, pipelining, occupancy), runs every
# kernel in the Triton interpreter against its numpy reference (kernels/tests), then the backend's device layer on the interpreted device
# (crates/runtime/tests/cuda_kernels.rs: the Rust launches of every embedded kernel, executed
# by the interpreter in a worker process). scripts/test.sh runs this first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=target/triton-venv
bash scripts/triton-venv.sh >/dev/null
echo "== embedded kernels against their sources (kernels/build.py --check)"
TRITON_CACHE_DIR="$(mktemp -d)" "$venv/bin/python" kernels/build.py --check
echo "== the shipped binaries, read statically (kernels/inspect_binaries.py)"
"$venv/bin/python" kernels/inspect_binaries.py
echo "== kernels in the Triton interpreter (kernels/tests)"
# Two processes of about equal length (the interpreter runs on one core): attention and
# sampling, the rest; the first's output printed after the second's.
sampling_log="$(mktemp)"
(cd kernels/tests && TRITON_INTERPRET=1 "../../$venv/bin/python" -m unittest -v test_attention \
    test_sampling) >"$sampling_log" 2>&1 &
sampling=$!
kernels_status=0
(cd kernels/tests && TRITON_INTERPRET=1 "../../$venv/bin/python" -m unittest -v test_kernels test_fp8 \
    test_worker test_sweep test_build_check) \
    || kernels_status=$?
sampling_status=0
wait "$sampling" || sampling_status=$?
cat "$sampling_log"
rm -f "$sampling_log"
if [ "$kernels_status" -ne 0 ] || [ "$sampling_status" -ne 0 ]; then
    exit 1
fi
echo "== the device layer on the interpreted device (cuda_kernels)"
# --workspace: dependencies get the features of the workspace's test build, which reuses them
# (scripts/test.sh exports FERRUM_TEST_FEATURES, the features of that build).
cargo test --workspace ${FERRUM_TEST_FEATURES:+--features "$FERRUM_TEST_FEATURES"} \
  --test cuda_kernels --test cuda_attention "$@"
