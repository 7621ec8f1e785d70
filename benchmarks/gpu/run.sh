#!/usr/bin/env bash
# Ferrum's CUDA backend on a GPU, in one run: the device's two ceilings, then Llama-3.1-8B- and
# Llama-3.2-1B-shaped bf16 models (random weights made on the device) through `ferrum bench
# latency` with and without CUDA graphs (each step's kernels profiled), and transformers'
# generation on the same GPU and folders. Writes RESULTS/*.json(l) and docs/benchmarks-gpu.md
# (benchmarks/gpu/report.py). Needs python3 with torch, transformers and safetensors (the lent
# GPU machines have them) and a ferrum binary:
#
#   FERRUM_BIN=target/release/ferrum bash benchmarks/gpu/run.sh [RESULTS] [MODELS]
#
# (or, on a lent machine, the ferrum of the pack scripts/gpu/pack.sh made, found by itself)
#
# RESULTS defaults to target/bench/gpu, MODELS (about 20 GB) to /tmp/ferrum-gpu-models. Every
# step has a time limit and a failed one is reported, not fatal, so one call on a lent machine
# returns whatever could be measured; FERRUM_GPU_BENCH_BUDGET (seconds) bounds the whole run,
# the steps that no longer fit being skipped and reported.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
res="$(mkdir -p "${1:-$root/target/bench/gpu}" && cd "${1:-$root/target/bench/gpu}" && pwd)"
models="${2:-/tmp/ferrum-gpu-models}"
pushd "$root" >/dev/null && source scripts/gpu/use-pack.sh && popd >/dev/null
ferrum="${FERRUM_BIN:-$root/target/release/ferrum}"
here="$root/benchmarks/gpu"
mkdir -p "$models"
failed=()
deadline=$((SECONDS + ${FERRUM_GPU_BENCH_BUDGET:-3600}))

step() { # step NAME SECONDS OUTFILE COMMAND...: runs COMMAND with a limit, stdout to OUTFILE
    local name="$1" limit="$2" outfile="$3"
    shift 3
    local t0=$SECONDS left=$((deadline - SECONDS - 15))
    echo "== $name"
    if ((left < 10)); then
        echo "   SKIPPED: the run's time budget is spent"
        failed+=("$name(skipped)")
        return
    fi
    ((limit > left)) && limit=$left
    if timeout "$limit" "$@" >"$res/$outfile" 2>"$res/$name.log"; then
        echo "   ok in $((SECONDS - t0)) s"
    else
        echo "   FAILED (exit $?) after $((SECONDS - t0)) s; last lines of $name.log:"
        tail -n 5 "$res/$name.log" | sed 's/^/   /'
        failed+=("$name")
    fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$res/device.txt"
"$ferrum" --version >>"$res/device.txt" 2>&1
[[ -s "$res/ceilings.json" ]] || step ceilings 60 ceilings.json python3 "$here/ceilings.py"
[[ -f "$models/llama-8b/config.json" ]] || step make-8b 150 make-8b.txt python3 "$here/make_model.py" "$models/llama-8b" 8b
[[ -f "$models/llama-1b/config.json" ]] || step make-1b 60 make-1b.txt python3 "$here/make_model.py" "$models/llama-1b" 1b

lat=("$ferrum" bench latency --device cuda --json --input-len 128 --output-len 32)
# Decode: graphs (the default) at 1, 64 and 256 sequences, and plain launches; each batch size
# gets one more, profiled iteration (device time per kernel against the step's wall time).
step ferrum-8b-graph 150 ferrum-8b-graph.jsonl "${lat[@]}" --model "$models/llama-8b" \
    --batch-size 1,64 --num-iters 2 --num-iters-warmup 1 --profile-kernels
step ferrum-8b-plain 120 ferrum-8b-plain.jsonl "${lat[@]}" --model "$models/llama-8b" --no-cuda-graph \
    --batch-size 1,64 --num-iters 1 --num-iters-warmup 1 --profile-kernels
# Prefill: one 2048-token prompt.
step ferrum-8b-prefill 90 ferrum-8b-prefill.jsonl "$ferrum" bench latency --device cuda --json \
    --model "$models/llama-8b" --input-len 2048 --output-len 2 --num-iters 3
step ferrum-1b-graph 90 ferrum-1b-graph.jsonl "${lat[@]}" --model "$models/llama-1b" \
    --batch-size 1,64 --num-iters 3 --num-iters-warmup 1 --profile-kernels
step ferrum-1b-plain 90 ferrum-1b-plain.jsonl "${lat[@]}" --model "$models/llama-1b" --no-cuda-graph \
    --batch-size 1,64 --num-iters 3 --num-iters-warmup 1 --profile-kernels
# The engine: 256 requests of 128 + 128 tokens through continuous batching, with steps
# overlapped (the default) and finished one at a time.
thr=("$ferrum" bench throughput --device cuda --json --num-prompts 256 --input-len 128 --output-len 128 \
    --max-num-seqs 256)
step ferrum-1b-throughput-overlap 120 ferrum-1b-throughput-overlap.jsonl "${thr[@]}" --model "$models/llama-1b"
step ferrum-1b-throughput-sync 120 ferrum-1b-throughput-sync.jsonl "${thr[@]}" --model "$models/llama-1b" --no-overlap
[[ -s "$res/hf-8b.jsonl" ]] || step hf-8b 150 hf-8b.jsonl python3 "$here/hf_peer.py" "$models/llama-8b" --batch-size 1,64 \
    --input-len 128 --output-len 32 --prefill-len 2048
[[ -s "$res/hf-1b.jsonl" ]] || step hf-1b 90 hf-1b.jsonl python3 "$here/hf_peer.py" "$models/llama-1b" --batch-size 1,64 \
    --input-len 128 --output-len 32
# 256 sequences prefill one by one (about 15 s an iteration): fewer iterations.
step ferrum-8b-graph-256 150 ferrum-8b-graph-256.jsonl "${lat[@]}" --model "$models/llama-8b" \
    --batch-size 256 --num-iters 1 --num-iters-warmup 1 --profile-kernels
step ferrum-8b-plain-256 120 ferrum-8b-plain-256.jsonl "${lat[@]}" --model "$models/llama-8b" \
    --no-cuda-graph --batch-size 256 --num-iters 1 --num-iters-warmup 0 --profile-kernels
cp "$models"/llama-8b/config.json "$res/config-8b.json" 2>/dev/null
cp "$models"/llama-1b/config.json "$res/config-1b.json" 2>/dev/null
printf '%s\n' "${failed[@]}" >"$res/failed.txt"
python3 "$here/report.py" "$res" >"$root/docs/benchmarks-gpu.md" && echo "wrote docs/benchmarks-gpu.md"
[[ ${#failed[@]} -eq 0 ]] || { echo "failed steps: ${failed[*]}"; exit 1; }
