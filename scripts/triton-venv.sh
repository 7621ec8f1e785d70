#!/usr/bin/env bash
# Makes sure target/triton-venv holds the pinned Triton toolchain of kernels/requirements.txt
# (installed from PyPI on first use, and again when the pins change) and prints the path of its
# python. The interpreted device, kernels/build.py's check and the kernel tests run with it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=target/triton-venv
if ! "$venv/bin/python" -c 'import triton, numpy' 2>/dev/null \
    || ! cmp -s kernels/requirements.txt "$venv/requirements.txt"; then
    echo "triton-venv: installing the pinned Triton into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r kernels/requirements.txt
    cp kernels/requirements.txt "$venv/requirements.txt"
fi
echo "$PWD/$venv/bin/python"
