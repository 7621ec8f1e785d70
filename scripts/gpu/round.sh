#!/usr/bin/env bash
# One GPU round, as a lent session runs it in its one call: the checks, then the figures, each
# writing under OUT (the call brings OUT back), within a time budget that leaves room to rerun.
#
#   bash scripts/gpu/pack.sh                                # here, first: the binaries
#   bash scripts/gpu/round.sh "$OUT"                        # on the lent machine (carry .gpu-pack)
#   FERRUM_GPU_ROUND=interpreted bash scripts/gpu/round.sh DIR   # CI: the same steps, no GPU
#
# 1. Checks (scripts/test-gpu.sh, on a GPU only): every embedded kernel against host
#    references, the aligned/generic choice, the fixtures against transformers; OUT/checks.log.
#    On the interpreted device CI runs the same tests in `cargo test`.
# 2. Figures (benchmarks/gpu/run.sh OUT/bench): ceilings, decode and prefill of the 8B- and
#    1B-shaped models with per-kernel profiles, engine throughput, transformers beside;
#    OUT/bench/*.jsonl and OUT/bench/benchmarks-gpu.md (copy it to docs/).
# Budget: FERRUM_ROUND_BUDGET seconds in all (default 600: a 15-minute loan less the machine's
# start and a margin); the checks get at most a third. Exits non-zero when a check or a figure
# step failed, after both ran.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out="${1:?usage: $0 OUT}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
budget="${FERRUM_ROUND_BUDGET:-600}"
start=$SECONDS
status=0
date -u +%FT%TZ >"$out/round-started.txt"
git log -1 --format='%H %s' >>"$out/round-started.txt" 2>/dev/null

if [[ "${FERRUM_GPU_ROUND:-gpu}" == gpu ]]; then
    echo "== checks (scripts/test-gpu.sh), at most $((budget / 3)) s"
    timeout "$((budget / 3))" bash scripts/test-gpu.sh >"$out/checks.log" 2>&1 || status=$?
    tail -n 15 "$out/checks.log"
    echo "   checks: exit $status after $((SECONDS - start)) s"
else
    echo "== checks: on the interpreted device, cargo test runs them"
fi

left=$((budget - (SECONDS - start) - 10))
echo "== figures (benchmarks/gpu/run.sh), $left s left"
FERRUM_GPU_BENCH_BUDGET="$left" bash benchmarks/gpu/run.sh "$out/bench" || status=1
echo "== round: exit $status after $((SECONDS - start)) s; results in $out"
exit "$status"
