#!/usr/bin/env bash
# Drives a real `ferrum serve` with the official `openai` Python client: installs the client
# into a venv (target/openai-venv), builds the binary, and runs tests/openai on the tiny fixture
# and, when it has been fetched (scripts/fetch-smollm2.sh), on SmolLM2.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OPENAI_VERSION="3.54.0"
venv="target/openai-venv"
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "test-openai: python3 is needed" >&2
  exit 1
fi
if ! "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  echo "test-openai: installing openai==$OPENAI_VERSION into $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
fi

cargo build --quiet --bin ferrum
export FERRUM_BIN="$PWD/target/debug/ferrum"
export FERRUM_FIXTURES="$PWD/tests/fixtures"
export FERRUM_SMOLLM2="${FERRUM_SMOLLM2:-${FERRUM_MODELS_DIR:-$PWD/models}/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ ! -s "$FERRUM_SMOLLM2" ] && [ -n "${CI:-}" ]; then
  echo "test-openai: $FERRUM_SMOLLM2 is missing (run scripts/fetch-smollm2.sh)" >&2
  exit 1
fi
"$venv/bin/python" -m unittest discover -s tests/openai -t tests/openai -v "$@"
