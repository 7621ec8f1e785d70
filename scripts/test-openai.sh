#!/usr/bin/env bash
# Drives a real `ferrum serve` with the official `openai` and `anthropic` Python clients and
# the openai-agents SDK: installs them (and `jsonschema`, which checks structured output) into
# a venv (target/openai-venv), builds the binary, and runs tests/openai on the tiny fixture
# and, when they have been fetched (scripts/fetch-smollm2.sh, scripts/fetch-model.sh
# qwen2.5-coder-0.5b and qwen2.5-coder-1.5b), on SmolLM2 and on Qwen2.5-Coder-0.5B and 1.5B
# (structured output, tools, agent runs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="target/openai-venv"
bash scripts/openai-venv.sh >/dev/null

# FERRUM_BIN: a binary built elsewhere (scripts/test-mpi.sh builds one with MPI).
if [ -z "${FERRUM_BIN:-}" ]; then
  cargo build --quiet --bin ferrum
  export FERRUM_BIN="$PWD/target/debug/ferrum"
fi
bash scripts/unpack-fixtures.sh
export FERRUM_FIXTURES="$PWD/tests/fixtures"
export FERRUM_SMOLLM2="${FERRUM_SMOLLM2:-${FERRUM_MODELS_DIR:-$PWD/models}/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ ! -s "$FERRUM_SMOLLM2" ] && [ -n "${CI:-}" ]; then
  echo "test-openai: $FERRUM_SMOLLM2 is missing (run scripts/fetch-smollm2.sh)" >&2
  exit 1
fi
export FERRUM_QWEN05="${FERRUM_QWEN05:-${FERRUM_MODELS_DIR:-$PWD/models}/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf}"
if [ ! -s "$FERRUM_QWEN05" ] && [ -n "${CI:-}" ]; then
  echo "test-openai: $FERRUM_QWEN05 is missing (run scripts/fetch-model.sh qwen2.5-coder-0.5b)" >&2
  exit 1
fi
export FERRUM_QWEN15="${FERRUM_QWEN15:-${FERRUM_MODELS_DIR:-$PWD/models}/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf}"
if [ ! -s "$FERRUM_QWEN15" ] && [ -n "${CI:-}" ]; then
  echo "test-openai: $FERRUM_QWEN15 is missing (run scripts/fetch-model.sh qwen2.5-coder-1.5b)" >&2
  exit 1
fi
export OPENAI_AGENTS_DISABLE_TRACING=1
"$venv/bin/python" -m unittest discover -s tests/openai -t tests/openai -v "$@"
