#!/usr/bin/env bash
# One GPU round, as a lent session runs it in its one call: the checks, the figures, then the
# tuning sweep, each writing under OUT (the call brings OUT back), within a time budget that
# leaves room to rerun.
#
#   bash scripts/gpu/pack.sh                                # here, first: binaries, candidates
#   bash scripts/gpu/round.sh "$OUT"                        # on the lent machine (carry .gpu-pack)
#   FERRUM_GPU_ROUND=interpreted bash scripts/gpu/round.sh DIR   # CI: the same steps, no GPU
#
# 1. Checks (scripts/test-gpu.sh, on a GPU only): every embedded kernel against host
#    references, the aligned/generic choice, the fixtures against transformers; OUT/checks.log.
#    On the interpreted device CI runs the same tests in `cargo test`.
# 2. Figures (benchmarks/gpu/run.sh OUT/bench): ceilings, decode and prefill of the 8B- and
#    1B-shaped models with per-kernel profiles, engine throughput, transformers beside;
#    OUT/bench/*.jsonl and OUT/bench/benchmarks-gpu.md (copy it to docs/).
# 3. Sweep (kernels/sweep.py run OUT/sweeps): the candidates pack.sh compiled
#    (.gpu-pack/sweeps), each through the engine on the 8B-shaped model (`--kernels`);
#    OUT/sweeps/sweep.md and tuning.json (copy it to kernels/tuning.json for the next build).
#    On the interpreted device: two specs-only candidates per family on the tiny model.
# Budget: FERRUM_ROUND_BUDGET seconds in all (default 600: a 15-minute loan less the machine's
# start and a margin): the checks get at most a third, the sweep the last quarter. Exits
# non-zero when a step failed, after all ran.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out="${1:?usage: $0 OUT}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
budget="${FERRUM_ROUND_BUDGET:-600}"
mode="${FERRUM_GPU_ROUND:-gpu}"
start=$SECONDS
status=0
date -u +%FT%TZ >"$out/round-started.txt"
git log -1 --format='%H %s' >>"$out/round-started.txt" 2>/dev/null
source scripts/gpu/use-pack.sh

if [[ "$mode" == gpu ]]; then
    echo "== checks (scripts/test-gpu.sh), at most $((budget / 3)) s"
    timeout "$((budget / 3))" bash scripts/test-gpu.sh >"$out/checks.log" 2>&1 || status=$?
    tail -n 15 "$out/checks.log"
    echo "   checks: exit $status after $((SECONDS - start)) s"
else
    echo "== checks: on the interpreted device, cargo test runs them"
fi

sweep_share=$((budget / 4))
left=$((budget - (SECONDS - start) - sweep_share - 10))
echo "== figures (benchmarks/gpu/run.sh), $left s"
FERRUM_GPU_BENCH_BUDGET="$left" bash benchmarks/gpu/run.sh "$out/bench" || status=1

left=$((budget - (SECONDS - start) - 10))
echo "== sweep (kernels/sweep.py), $left s"
ferrum="${FERRUM_BIN:-target/release/ferrum}"
if [[ "$mode" == gpu ]]; then
    candidates=.gpu-pack/sweeps
    model="${FERRUM_GPU_MODELS:-/tmp/ferrum-gpu-models}/llama-8b"
    small=()
else
    # Specs-only candidates (the interpreter needs no cubins) for the tiny model's kernels.
    candidates="$out/sweep-candidates"
    model=tests/fixtures/tiny-llama-bf16
    small=(--small)
    target/triton-venv/bin/python kernels/sweep.py build --out "$candidates" --arch none \
        --quick --ty bf16 --head-block 32 >/dev/null || status=1
fi
if [[ -f "$candidates/candidates.json" && -f "$model/config.json" ]]; then
    python3 kernels/sweep.py run --candidates "$candidates" --model "$model" \
        --ferrum "$ferrum" --device "$([[ $mode == gpu ]] && echo cuda || echo interpreted)" \
        --out "$out/sweeps" --budget "$left" "${small[@]}" || status=1
else
    echo "   FAILED: no candidates ($candidates) or no model ($model)"
    status=1
fi
echo "== round: exit $status after $((SECONDS - start)) s; results in $out"
exit "$status"
