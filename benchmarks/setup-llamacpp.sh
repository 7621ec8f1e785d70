#!/usr/bin/env bash
# Installs llama.cpp's Python bindings and server (PyPI llama-cpp-python[server], built from
# source for this CPU) into target/bench/venv-llamacpp. Does nothing when already there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/bench/venv-llamacpp"
version="0.3.36"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import llama_cpp, llama_cpp.server; assert llama_cpp.__version__ == '$version'" 2>/dev/null; then
  exit 0
fi
echo "setup-llamacpp: building llama-cpp-python $version from source (about 10 minutes on 2 cores)" >&2
python3 -m venv "$venv"
CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "$venv/bin/pip" install --disable-pip-version-check "llama-cpp-python[server]==$version"
