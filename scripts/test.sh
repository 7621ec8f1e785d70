#!/usr/bin/env bash
# Runs every test: the GPU kernels and the CUDA backend's device layer on the interpreted
# device (scripts/test-cuda-interpret.sh, which installs the pinned Triton into a venv), the
# workspace's cargo tests, the GPU round's script on the interpreted device
# (scripts/test-gpu-round.sh), then the OpenAI-client tests of `ferrum serve`
# (scripts/test-openai.sh, which installs the `openai` and `anthropic` packages into a venv), the
# chat page in headless Chromium (scripts/test-webui.sh, which installs Chromium and
# playwright-core), the parallel runs
# under mpirun (scripts/test-mpi.sh, which installs Open MPI when it is missing) and the benchmark
# chart's tests (scripts/test-plot.sh, which installs the plotting library into another). Ends
# with one summary line. The SmolLM2 tests need scripts/fetch-smollm2.sh first; they skip when the
# model is absent, except under CI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STAGES_TITLE="scripts/test.sh"
source scripts/stages.sh
# Every cargo test below builds with these features (MPI's parallel tests and the engine's
# fault injection among the workspace's), so the workspace is compiled for tests once.
source scripts/test-features.sh
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
stage "install Open MPI and libclang (the mpi feature; scripts/install-mpi.sh)"
if ! bash scripts/install-mpi.sh 2>&1 | tee "$log"; then
  # Everything but the parallel runs can still be tested (scripts/test-mpi.sh fails below).
  status=1
  export FERRUM_TEST_FEATURES="ferrum-engine/fault-injection"
fi
# The parallel tests launch mpirun, which refuses root unless told; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
stage "CUDA backend on the interpreted device (scripts/test-cuda-interpret.sh)"
bash scripts/test-cuda-interpret.sh 2>&1 | tee -a "$log" || status=$?
stage "cargo test --workspace --features $FERRUM_TEST_FEATURES"
# --workspace with the features named by package: every crate gets them in one resolution (with
# -p, cargo resolves them for the one package and rebuilds its dependencies).
cargo test --workspace --features "$FERRUM_TEST_FEATURES" --no-fail-fast "$@" 2>&1 \
  | tee -a "$log" || status=$?
# The parallel tests ran above (with the `mpi` feature); scripts/test-mpi.sh runs the rest.
if [[ "$FERRUM_TEST_FEATURES" == *mpi* ]]; then
  export FERRUM_PARALLEL_TESTS_RAN=1
fi
# The binary `cargo test --workspace` built for the CLI's tests, for the client tests below
# (`cargo build` would build it again: dev-dependencies change some dependencies' features).
if [ -x target/debug/ferrum ] && [ -z "${FERRUM_BIN:-}" ]; then
  export FERRUM_BIN="$PWD/target/debug/ferrum"
fi
stage "GPU round's script on the interpreted device (scripts/test-gpu-round.sh)"
bash scripts/test-gpu-round.sh 2>&1 | tee -a "$log" || status=$?
stage "OpenAI client tests (scripts/test-openai.sh)"
bash scripts/test-openai.sh 2>&1 | tee -a "$log" || status=$?
stage "chat page in headless Chromium (scripts/test-webui.sh)"
bash scripts/test-webui.sh 2>&1 | tee -a "$log" || status=$?
stage "parallel runs over MPI (scripts/test-mpi.sh)"
bash scripts/test-mpi.sh 2>&1 | tee -a "$log" || status=$?
stage "benchmark chart tests (scripts/test-plot.sh)"
bash scripts/test-plot.sh 2>&1 | tee -a "$log" || status=$?
stage_table
summary=$(awk '
  /^test result:/ { p += $4; f += $6 }
  /^Ran [0-9]+ tests? in/ { py += $2 }
  /^ok - / { web += 1 }
  /^FAILED: / { wf += 1 }
  /^FAILED \(/ { n = split($0, parts, /[=,)]/); for (i = 2; i <= n; i += 2) pf += parts[i] }
  END { printf "all tests: %d passed, %d failed\n", p + py - pf + web, f + pf + wf }' "$log")
echo "$summary"
# .ci/run prints it again after its own stage table, as its closing line.
if [ -n "${FERRUM_TEST_SUMMARY:-}" ]; then
  mkdir -p "$(dirname "$FERRUM_TEST_SUMMARY")"
  echo "$summary" > "$FERRUM_TEST_SUMMARY"
fi
exit "$status"
