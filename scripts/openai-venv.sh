#!/usr/bin/env bash
# Makes sure target/openai-venv holds the pinned `openai`, `anthropic` and `openai-agents`
# clients and `jsonschema` (installed from PyPI on first use, and again when a pin changes) and
# prints the path of its python. scripts/test-openai.sh runs tests/openai with it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OPENAI_VERSION="3.54.0"
JSONSCHEMA_VERSION="4.25.1"
ANTHROPIC_VERSION="2.14.0"
AGENTS_VERSION="0.24.0"
venv="target/openai-venv"
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "openai-venv: python3 is needed" >&2
  exit 1
fi
if ! "$venv/bin/python" -c "import openai, anthropic, jsonschema, importlib.metadata as m, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION' or anthropic.__version__ != '$ANTHROPIC_VERSION' or m.version('jsonschema') != '$JSONSCHEMA_VERSION' or m.version('openai-agents') != '$AGENTS_VERSION')" 2>/dev/null; then
  echo "openai-venv: installing openai==$OPENAI_VERSION, anthropic==$ANTHROPIC_VERSION, openai-agents==$AGENTS_VERSION and jsonschema==$JSONSCHEMA_VERSION into $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" "anthropic==$ANTHROPIC_VERSION" "jsonschema==$JSONSCHEMA_VERSION" "openai-agents==$AGENTS_VERSION"
fi
echo "$PWD/$venv/bin/python"
