#!/usr/bin/env bash
# Drives the chat page (GET /) in headless Chromium with Playwright (tests/webui/chat.mjs):
# installs Debian's chromium when it is missing (as root) and playwright-core (pinned) into
# target/webui-node, builds the binary, runs the test. The screenshot goes to
# $FERRUM_SCREENSHOT (default target/webui/chat.png). docs/webui.png was made the same way:
#   FERRUM_WEBUI_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf FERRUM_WEBUI_SYSTEM= \
#   FERRUM_WEBUI_PROMPT="What is the capital of Germany?" FERRUM_SCREENSHOT=docs/webui.png \
#   bash scripts/test-webui.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PLAYWRIGHT_VERSION="1.65.1"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "test-webui: node and npm are needed" >&2
  exit 1
fi
if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "test-webui: install Debian's chromium package first" >&2
    exit 1
  fi
  echo "test-webui: installing chromium" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
prefix="target/webui-node"
if [ "$(node -p "try{require('./$prefix/node_modules/playwright-core/package.json').version}catch(e){''}")" != "$PLAYWRIGHT_VERSION" ]; then
  echo "test-webui: installing playwright-core@$PLAYWRIGHT_VERSION into $prefix" >&2
  mkdir -p "$prefix"
  npm install --silent --no-audit --no-fund --prefix "$prefix" "playwright-core@$PLAYWRIGHT_VERSION" >/dev/null
fi
if [ -z "${FERRUM_BIN:-}" ]; then
  cargo build --quiet --bin ferrum
  export FERRUM_BIN="$PWD/target/debug/ferrum"
fi
bash scripts/unpack-fixtures.sh
mkdir -p target/webui
export PLAYWRIGHT_PREFIX="$PWD/$prefix"
export FERRUM_WEBUI_MODEL="${FERRUM_WEBUI_MODEL:-$PWD/tests/fixtures/tiny-smollm}"
node tests/webui/chat.mjs
