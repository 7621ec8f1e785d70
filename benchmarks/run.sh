#!/usr/bin/env bash
# Ferrum against llama.cpp (and vLLM's CPU build when benchmarks/setup-vllm.sh has installed it)
# on this machine, in one run, all served engines measured by the same client
# (`ferrum bench serve`). Writes target/bench/results/*.json and docs/benchmarks.md.
#
#   bash benchmarks/run.sh            # the full run (about 25 minutes on 2 cores)
#   bash benchmarks/run.sh --quick    # a smoke run with few prompts and short outputs
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

quick=0
[ "${1:-}" = "--quick" ] && quick=1
threads="${FERRUM_BENCH_THREADS:-2}"
out="target/bench/results"
mkdir -p "$out"
rm -f "$out"/*.json

if [ "$quick" = 1 ]; then
  num_prompts=8 concurrency=1,4 lat_out=32 serve_out=32 iters=1
else
  num_prompts="${FERRUM_BENCH_PROMPTS:-32}" concurrency=1,4,16 lat_out=128 serve_out=128 iters=3
fi

model="$(bash scripts/fetch-smollm2.sh | tail -n 1)"
cargo build --release -p ferrum-cli
ferrum="$root/target/release/ferrum"
bash benchmarks/setup-llamacpp.sh
llama_py="$root/target/bench/venv-llamacpp/bin/python"

echo "== raw model speed (same GGUF, same token ids, $threads threads)"
lat() { # name, input, output, batch
  "$ferrum" bench latency --model "$model" --input-len "$2" --output-len "$3" --batch-size "$4" \
    --num-iters "$iters" --threads "$threads" --json > "$out/latency-ferrum-$1.json"
  "$llama_py" benchmarks/llamacpp_latency.py --model "$model" --input-len "$2" --output-len "$3" \
    --batch-size "$4" --num-iters "$iters" --threads "$threads" 2>/dev/null > "$out/latency-llamacpp-$1.json"
  echo "  $1: ferrum $(cat "$out/latency-ferrum-$1.json")"
  echo "  $1: llama.cpp $(cat "$out/latency-llamacpp-$1.json")"
}
lat single 512 "$lat_out" 1
lat batch16 128 "$lat_out" 16

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# serve NAME -- command...: starts the server, loads it, records peak RSS, stops it.
serve() {
  local name="$1"; shift 2
  local port; port="$(free_port)"
  local cmd=("${@//PORT/$port}")
  echo "== serve: $name"
  local log="$out/$name.log"
  "${cmd[@]}" > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 1200); do
    if curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null 2>&1; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then echo "$name exited; see $log" >&2; tail -20 "$log" >&2; return 1; fi
    sleep 0.5
  done
  "$ferrum" bench serve --base-url "http://127.0.0.1:$port" --concurrency "$concurrency" \
    --num-prompts "$num_prompts" --input-len 100 --output-len "$serve_out" --tokenizer "$model" \
    --label "$name" --json > "$out/serve-$name.json"
  local rss_kb; rss_kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  echo "{\"name\": \"$name\", \"peak_rss_mib\": $((rss_kb / 1024))}" > "$out/rss-$name.json"
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

serve ferrum-gguf -- "$ferrum" serve --model "$model" --port PORT --threads "$threads" --max-num-seqs 64
serve llamacpp-gguf -- "$llama_py" -m llama_cpp.server --model "$model" --port PORT \
  --n_threads "$threads" --n_threads_batch "$threads" --n_ctx 4096
if [ -x target/bench/venv-vllm/bin/python ] && [ -d target/bench/smollm2-bf16 ]; then
  VLLM_CPU_KVCACHE_SPACE=2 OMP_NUM_THREADS="$threads" \
    serve vllm-cpu-bf16 -- target/bench/venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
      --model target/bench/smollm2-bf16 --port PORT --served-model-name smollm2 --dtype bfloat16 \
      --max-model-len 4096
  serve ferrum-bf16 -- "$ferrum" serve --model target/bench/smollm2-bf16 --port PORT \
    --threads "$threads" --served-model-name smollm2
else
  echo "== vLLM's CPU build is not installed (bash benchmarks/setup-vllm.sh): skipped"
fi

jsons=$(ls "$out"/serve-*.json | paste -sd, -)
mkdir -p docs
"$ferrum" bench serve --compare "$jsons" --plot docs/benchmarks-serve.svg
python3 benchmarks/report.py "$out" > docs/benchmarks.md
echo "wrote docs/benchmarks.md and docs/benchmarks-serve.svg"
