#!/usr/bin/env bash
# Installs llama.cpp for the benchmarks, all from PyPI's llama-cpp-python 0.3.36 built for this CPU
# (GGML_NATIVE: AVX-512 VNNI where the CPU has it). Does nothing for parts already there.
#
# 1. target/bench/venv-llamacpp: the Python bindings (`llama_cpp`, used by llamacpp_latency.py)
#    and their server (`python -m llama_cpp.server`).
# 2. target/bench/llama.cpp/bin: llama.cpp's own `llama-server`, `llama-batched-bench`, `llama-perplexity` and
#    `llama-speculative` (draft-model speculative decoding, the peer of `--speculative-model`).
#    The wheel does not ship them: its CMakeLists adds llama.cpp as a subdirectory, where
#    LLAMA_BUILD_TOOLS and LLAMA_BUILD_SERVER default to OFF, and it installs only the libraries.
#    (CMAKE_ARGS="-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_TOOLS_INSTALL=ON" would
#    build every tool into site-packages/bin, linked to shared libraries it does not put on the
#    run path.) So the two programs are built here, statically, from the llama.cpp sources inside
#    the same sdist: the same llama.cpp commit as the bindings.
#
# Why llama-server: llama-cpp-python's server holds one lock around the model, so it serves one
# request at a time, and by default (interrupt_requests=True) a waiting request cuts the running
# stream short. llama-server has parallel slots (-np) with continuous batching.
#
# About 10 minutes for each part on 2 cores; only PyPI is contacted.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bench="$root/target/bench"
venv="$bench/venv-llamacpp"
version="0.3.36"
jobs="$(nproc)"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import llama_cpp, llama_cpp.server; assert llama_cpp.__version__ == '$version'" 2>/dev/null; then
  echo "setup-llamacpp: llama-cpp-python $version already in $venv" >&2
else
  echo "setup-llamacpp: building llama-cpp-python $version from source (about 10 minutes on 2 cores)" >&2
  python3 -m venv "$venv"
  CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
    "$venv/bin/pip" install --disable-pip-version-check "llama-cpp-python[server]==$version"
fi

bin="$bench/llama.cpp/bin"
tools=(llama-server llama-batched-bench llama-speculative llama-perplexity)
have=1
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || have=0; done
if [ "$have" = 1 ]; then
  echo "setup-llamacpp: ${tools[*]} already in $bin" >&2
  exit 0
fi
echo "setup-llamacpp: building ${tools[*]} (about 10 minutes on 2 cores)" >&2
"$venv/bin/pip" install --disable-pip-version-check -q cmake ninja "scikit-build-core>=0.9.2"
src="$bench/downloads/llama_cpp_python-$version"
if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
  mkdir -p "$bench/downloads"
  # --no-build-isolation: pip reads the sdist's metadata with the scikit-build-core installed
  # above instead of fetching (and, with --no-binary :all:, compiling) a build environment.
  "$venv/bin/pip" download --disable-pip-version-check -q --no-deps --no-build-isolation \
    --no-binary llama-cpp-python -d "$bench/downloads" "llama-cpp-python==$version"
  tar -xzf "$bench/downloads/llama_cpp_python-$version.tar.gz" -C "$bench/downloads"
fi
build="$bench/llama.cpp-build"
# LLAMA_USE_PREBUILT_UI=OFF: the server's web UI would otherwise be downloaded from Hugging Face;
# without it the server has no UI page, which the benchmarks do not need.
PATH="$venv/bin:$PATH" cmake -S "$src/vendor/llama.cpp" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF > "$build.configure.log" 2>&1 \
  || { echo "setup-llamacpp: cmake configure failed; see $build.configure.log" >&2; exit 1; }
PATH="$venv/bin:$PATH" cmake --build "$build" --target "${tools[@]}" -j "$jobs"
mkdir -p "$bin"
for t in "${tools[@]}"; do cp "$build/bin/$t" "$bin/"; done
"$bin/llama-server" --version 2>&1 | tail -n 2 >&2
