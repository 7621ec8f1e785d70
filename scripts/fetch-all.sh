#!/usr/bin/env bash
# Everything the tests download, in one go: the real models (SmolLM2-135M, Qwen2.5-Coder-0.5B and
# 1.5B, Gemma 3 270M), llama.cpp's vocabularies, and the Python environments of the test stages
# (the pinned Triton, the OpenAI/Anthropic clients, the plotting library). Each part is a no-op
# when already there. Every part is tried; the exit status is non-zero when one failed. Prints
# each part's seconds.
#
# .ci/run starts it in the background at its beginning, so the downloads overlap the lints
# (which need no network and keep both cores busy), and waits for it before the tests.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
status=0
part() { # part NAME COMMAND...
  local t0=$SECONDS
  echo "== $1"
  shift
  if "$@" >/dev/null; then
    echo "   ok in $((SECONDS - t0)) s"
  else
    echo "   FAILED (exit $?) after $((SECONDS - t0)) s"
    status=1
  fi
}
part "fetch SmolLM2-135M-Instruct" bash scripts/fetch-smollm2.sh
part "fetch Qwen2.5-Coder-0.5B-Instruct Q4_K_M (a real K-quant file for its tests)" \
  bash scripts/fetch-model.sh qwen2.5-coder-0.5b
part "fetch Qwen2.5-Coder-1.5B-Instruct Q4_K_M (the whole agent loop)" \
  bash scripts/fetch-model.sh qwen2.5-coder-1.5b
part "fetch Gemma 3 270M Q4_K_M (the Gemma family's real-model tests)" \
  bash scripts/fetch-model.sh gemma3-270m
part "fetch llama.cpp's vocabulary GGUFs (the tokenizer tests)" bash scripts/fetch-vocab.sh
part "the pinned Triton (scripts/triton-venv.sh)" bash scripts/triton-venv.sh
part "the OpenAI and Anthropic clients (scripts/openai-venv.sh)" bash scripts/openai-venv.sh
part "the plotting library (scripts/plot-venv.sh)" bash scripts/plot-venv.sh
exit "$status"
