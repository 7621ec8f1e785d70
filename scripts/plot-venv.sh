#!/usr/bin/env bash
# Makes sure target/plot-venv holds the plotting library pinned in
# benchmarks/requirements-plot.txt (installed from PyPI on first use) and prints the path of its
# python. benchmarks/plot_serve.py runs with it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="target/plot-venv"
req="benchmarks/requirements-plot.txt"
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "plot-venv: python3 is needed" >&2
  exit 1
fi
if ! cmp -s "$req" "$venv/requirements.txt" 2>/dev/null; then
  echo "plot-venv: installing $(tr '\n' ' ' < "$req")into $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$venv/requirements.txt"
fi
echo "$PWD/$venv/bin/python"
