#!/usr/bin/env bash
# Tests benchmarks/plot_serve.py (the chart of `ferrum bench serve` reports) with the pinned
# plotting library (scripts/plot-venv.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=$(bash scripts/plot-venv.sh)
"$python" -m unittest discover -s tests/benchmarks -t tests/benchmarks -v "$@"
