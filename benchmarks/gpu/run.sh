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
# the steps that no longer fit being skipped and reported. The report goes to
# RESULTS/benchmarks-gpu.md (a call brings RESULTS back; copy it to docs/).
#
# FERRUM_GPU_ROUND=interpreted runs the same steps on the interpreted device (the kernels in the
# Triton interpreter, no GPU) with the tiny bf16 Llama fixture in place of both models and
# small sizes, leaving out the steps that need torch on a GPU (ceilings, model making,
# transformers), which it lists in RESULTS/skipped.txt: CI runs it (scripts/test-gpu-round.sh),
# so a lent session never finds a broken step on the device.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
res="$(mkdir -p "${1:-$root/target/bench/gpu}" && cd "${1:-$root/target/bench/gpu}" && pwd)"
models="${2:-/tmp/ferrum-gpu-models}"
pushd "$root" >/dev/null && source scripts/gpu/use-pack.sh && popd >/dev/null
ferrum="${FERRUM_BIN:-$root/target/release/ferrum}"
here="$root/benchmarks/gpu"
failed=()
skipped=()
deadline=$((SECONDS + ${FERRUM_GPU_BENCH_BUDGET:-3600}))
# Sizes: decode prompt and output, decode batches, the large batch, the prefill prompt, and
# the throughput run's requests and their prompt and output lengths.
case "${FERRUM_GPU_ROUND:-gpu}" in
    gpu)
        device=cuda m8="$models/llama-8b" m1="$models/llama-1b"
        in_len=128 out_len=32 batches=1,64 large=256 prefill=2048 prompts=256 thr_len=128
        iters=2 iters_1b=3 ws_docs=16 ws_len=1024 ws_blocks=320 kv_len=2048 kv_batches=1,32 ;;
    interpreted)
        tiny="$root/tests/fixtures/tiny-llama-bf16"
        [[ -f "$tiny/config.json" ]] || bash "$root/scripts/unpack-fixtures.sh" >/dev/null
        device=interpreted m8="$tiny" m1="$tiny"
        in_len=8 out_len=3 batches=1,2 large=4 prefill=16 prompts=4 thr_len=4
        iters=1 iters_1b=1 ws_docs=3 ws_len=40 ws_blocks=4 kv_len=20 kv_batches=1,2 ;;
    *) echo "FERRUM_GPU_ROUND is gpu or interpreted, not ${FERRUM_GPU_ROUND}" >&2; exit 2 ;;
esac
mkdir -p "$models"

# On a GPU the steps run one at a time (a step's timings are its own). On the interpreted
# device each step is one interpreter process, which keeps one core busy: two run at once, and
# a failure is recorded in a file, as a step then runs in a subshell.
at_once=1
[[ "$device" == interpreted ]] && at_once=2
rm -f "$res/failed-steps.txt"
run_step() { # run_step NAME SECONDS OUTFILE COMMAND...: runs COMMAND with a limit, stdout to OUTFILE
    local name="$1" limit="$2" outfile="$3"
    shift 3
    local t0=$SECONDS left=$((deadline - SECONDS - 15)) msg
    msg="== $name"$'\n'
    if ((left < 10)); then
        echo "${msg}   SKIPPED: the run's time budget is spent"
        echo "$name(skipped)" >>"$res/failed-steps.txt"
        return
    fi
    ((limit > left)) && limit=$left
    if timeout "$limit" "$@" >"$res/$outfile" 2>"$res/$name.log"; then
        echo "${msg}   ok in $((SECONDS - t0)) s"
    else
        local code=$?
        echo "${msg}   FAILED (exit $code) after $((SECONDS - t0)) s; last lines of $name.log:"$'\n'"$(tail -n 5 "$res/$name.log" | sed 's/^/   /')"
        echo "$name" >>"$res/failed-steps.txt"
    fi
}

step() { # step NAME SECONDS OUTFILE COMMAND...: run_step, in the background where two run at once
    if ((at_once > 1)); then
        while (($(jobs -rp | wc -l) >= at_once)); do wait -n; done
        run_step "$@" &
    else
        run_step "$@"
    fi
}

torch_step() { # torch_step NAME ...: step's arguments; a step of python3 with torch on a GPU
    if [[ "$device" == interpreted ]]; then
        echo "== $1"
        echo "   skipped: needs torch on a GPU"
        skipped+=("$1")
        return
    fi
    step "$@"
}

if [[ "$device" == cuda ]]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$res/device.txt"
else
    echo "interpreted (Triton interpreter on the host, no GPU)" >"$res/device.txt"
fi
"$ferrum" --version >>"$res/device.txt" 2>&1
printf '{"device": "%s", "input_len": %d, "output_len": %d, "batches": "%s", "large_batch": %d, "prefill_len": %d, "num_prompts": %d, "throughput_len": %d}\n' \
    "$device" "$in_len" "$out_len" "$batches" "$large" "$prefill" "$prompts" "$thr_len" >"$res/round.json"
[[ -s "$res/ceilings.json" ]] || torch_step ceilings 60 ceilings.json python3 "$here/ceilings.py"
[[ -f "$m8/config.json" ]] || torch_step make-8b 150 make-8b.txt python3 "$here/make_model.py" "$m8" 8b
[[ -f "$m1/config.json" ]] || torch_step make-1b 60 make-1b.txt python3 "$here/make_model.py" "$m1" 1b

lat=("$ferrum" bench latency --device "$device" --json --input-len "$in_len" --output-len "$out_len")
# Decode: graphs (the default) at 1 and 64 sequences, and plain launches; each batch size
# gets one more, profiled iteration (device time per kernel against the step's wall time).
step ferrum-8b-graph 150 ferrum-8b-graph.jsonl "${lat[@]}" --model "$m8" \
    --batch-size "$batches" --num-iters "$iters" --num-iters-warmup 1 --profile-kernels
step ferrum-8b-plain 120 ferrum-8b-plain.jsonl "${lat[@]}" --model "$m8" --no-cuda-graph \
    --batch-size "$batches" --num-iters 1 --num-iters-warmup 1 --profile-kernels
# Prefill: one long prompt (2048 tokens).
# The products of more than 16 rows run on cuBLASLt where it opens (--gemm auto, the start
# line says which); the same prompt on the Triton products beside it.
step ferrum-8b-prefill 90 ferrum-8b-prefill.jsonl "$ferrum" bench latency --device "$device" --json \
    --model "$m8" --input-len "$prefill" --output-len 2 --num-iters "$iters_1b"
step ferrum-8b-prefill-triton 90 ferrum-8b-prefill-triton.jsonl "$ferrum" bench latency \
    --device "$device" --json --model "$m8" --input-len "$prefill" --output-len 2 \
    --num-iters "$iters_1b" --gemm triton
step ferrum-1b-graph 90 ferrum-1b-graph.jsonl "${lat[@]}" --model "$m1" \
    --batch-size "$batches" --num-iters "$iters_1b" --num-iters-warmup 1 --profile-kernels
step ferrum-1b-plain 90 ferrum-1b-plain.jsonl "${lat[@]}" --model "$m1" --no-cuda-graph \
    --batch-size "$batches" --num-iters "$iters_1b" --num-iters-warmup 1 --profile-kernels
# The engine: 256 requests of 128 + 128 tokens through continuous batching, with steps
# overlapped (the default) and finished one at a time.
thr=("$ferrum" bench throughput --device "$device" --json --num-prompts "$prompts" \
    --input-len "$thr_len" --output-len "$thr_len" --max-num-seqs "$prompts")
step ferrum-1b-throughput-overlap 120 ferrum-1b-throughput-overlap.jsonl "${thr[@]}" --model "$m1"
step ferrum-1b-throughput-sync 120 ferrum-1b-throughput-sync.jsonl "${thr[@]}" --model "$m1" --no-overlap
# The host KV tier: documents more than the KV cache holds (16 of 1024 tokens against 320
# blocks of 16, room for 5), sent twice; the second pass recomputes them without the tier and
# copies them back from page-locked host memory with it (--kv-offload-memory).
ws=("$ferrum" bench throughput --device "$device" --json --model "$m1" --num-prompts "$ws_docs" \
    --input-len "$ws_len" --output-len 4 --passes 2 --num-kv-blocks "$ws_blocks")
step ferrum-1b-kvhost-without 90 ferrum-1b-kvhost-without.jsonl "${ws[@]}"
step ferrum-1b-kvhost-with 90 ferrum-1b-kvhost-with.jsonl "${ws[@]}" --kv-offload-memory 4GiB
# The fp8 KV cache (e4m3 with a scale per row) against the model's own bf16 cache at a long
# context, where K/V are a large share of a decode step's reads: 2048-token prompts, 1 and 32
# sequences (32 x 2048 tokens of a 1B model's K/V: 2.1 GB in bf16 against 2.5 GB of weights).
long=("$ferrum" bench latency --device "$device" --json --model "$m1" --input-len "$kv_len" \
    --output-len "$out_len" --batch-size "$kv_batches" --num-iters "$iters_1b" \
    --num-iters-warmup 1)
step ferrum-1b-kv-bf16 90 ferrum-1b-kv-bf16.jsonl "${long[@]}" --kv-cache-dtype bf16
step ferrum-1b-kv-fp8 90 ferrum-1b-kv-fp8.jsonl "${long[@]}" --kv-cache-dtype fp8
[[ -s "$res/hf-8b.jsonl" ]] || torch_step hf-8b 150 hf-8b.jsonl python3 "$here/hf_peer.py" "$m8" \
    --batch-size "$batches" --input-len "$in_len" --output-len "$out_len" --prefill-len "$prefill"
[[ -s "$res/hf-1b.jsonl" ]] || torch_step hf-1b 90 hf-1b.jsonl python3 "$here/hf_peer.py" "$m1" \
    --batch-size "$batches" --input-len "$in_len" --output-len "$out_len"
# 256 sequences prefill one by one (about 15 s an iteration): fewer iterations.
step ferrum-8b-graph-256 150 ferrum-8b-graph-256.jsonl "${lat[@]}" --model "$m8" \
    --batch-size "$large" --num-iters 1 --num-iters-warmup 1 --profile-kernels
step ferrum-8b-plain-256 120 ferrum-8b-plain-256.jsonl "${lat[@]}" --model "$m8" \
    --no-cuda-graph --batch-size "$large" --num-iters 1 --num-iters-warmup 0 --profile-kernels
wait
[[ -s "$res/failed-steps.txt" ]] && mapfile -t -O "${#failed[@]}" failed <"$res/failed-steps.txt"
cp "$m8/config.json" "$res/config-8b.json" 2>/dev/null
cp "$m1/config.json" "$res/config-1b.json" 2>/dev/null
printf '%s\n' "${failed[@]}" >"$res/failed.txt"
printf '%s\n' "${skipped[@]}" >"$res/skipped.txt"
if python3 "$here/report.py" "$res" >"$res/benchmarks-gpu.md"; then
    echo "wrote $res/benchmarks-gpu.md"
else
    failed+=(report)
fi
[[ ${#failed[@]} -eq 0 ]] || { echo "failed steps: ${failed[*]}"; exit 1; }
