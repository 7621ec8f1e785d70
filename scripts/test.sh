#!/usr/bin/env bash
# Runs every test of the workspace and ends with one summary line over all test binaries. The
# SmolLM2 tests need scripts/fetch-smollm2.sh first; they skip when the model is absent, except
# under CI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { p += $4; f += $6 } END { printf "all tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
