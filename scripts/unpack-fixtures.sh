#!/usr/bin/env bash
# Unpacks the packed test fixtures (tests/fixtures/packed.json: the tiny SmolLM's weights and
# references, SmolLM2's tokenizer.json) in place, once; the Rust tests do it themselves, the
# shell and Python tests call this first. Uses $FERRUM_TESTDATA_BIN (a prebuilt
# ferrum-testdata, as scripts/gpu/pack.sh packs it for a machine without cargo), else cargo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -n "${FERRUM_TESTDATA_BIN:-}" ]; then
  "$FERRUM_TESTDATA_BIN" >/dev/null
else
  cargo run --quiet -p ferrum-testdata >/dev/null
fi
