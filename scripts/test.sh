#!/usr/bin/env bash
# Runs every test of the workspace. The SmolLM2 tests need scripts/fetch-smollm2.sh first; they
# skip when the model is absent, except under CI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo test --workspace "$@"
