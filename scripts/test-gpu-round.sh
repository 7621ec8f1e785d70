#!/usr/bin/env bash
# The GPU round's script (scripts/gpu/round.sh) end to end on the interpreted device, with the
# tiny bf16 Llama fixture: every step of benchmarks/gpu/run.sh that does not need torch on a
# GPU runs with the `ferrum` binary given (FERRUM_BIN, default target/debug/ferrum), the
# report is written, and the tuning sweep builds and times its candidates through the engine
# (`--kernels`). Fails when a step fails, when a step's results lack what report.py reads
# (per-kernel profiles, throughput counters), when the report lacks a section, or when the
# sweep's results lack a family. So a lent session never spends device time on a bug of the
# script. Needs the Triton venv (scripts/test-cuda-interpret.sh makes it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export FERRUM_BIN="${FERRUM_BIN:-$PWD/target/debug/ferrum}"
[[ -x "$FERRUM_BIN" ]] || cargo build -p ferrum-cli
out="target/gpu-round"
rm -rf "$out"
FERRUM_GPU_ROUND=interpreted FERRUM_ROUND_BUDGET=400 bash scripts/gpu/round.sh "$out"
python3 - "$out/bench" "$out/sweeps" <<'PY'
import json, os, sys
res, sweeps = sys.argv[1], sys.argv[2]
def rows(name):
    with open(os.path.join(res, name)) as f:
        return [json.loads(l) for l in f if l.startswith("{")]
problems = []
for name in ("ferrum-8b-graph", "ferrum-8b-plain", "ferrum-1b-graph", "ferrum-1b-plain",
             "ferrum-8b-graph-256", "ferrum-8b-plain-256"):
    rs = rows(name + ".jsonl")
    if not rs or any(not r.get("profile", {}).get("kernels") for r in rs):
        problems.append(f"{name}: no per-kernel profile")
    else:
        # Graphs replay whole steps; plain launches show each kernel.
        want = "graph replay" if "graph" in name else "gemm_"
        if not any(k["name"].startswith(want) for r in rs for k in r["profile"]["kernels"]):
            problems.append(f"{name}: no {want!r} in the profile")
for name in ("ferrum-1b-throughput-overlap", "ferrum-1b-throughput-sync", "ferrum-8b-prefill",
             "ferrum-8b-prefill-triton", "ferrum-1b-kv-bf16", "ferrum-1b-kv-fp8"):
    rs = rows(name + ".jsonl")
    if not rs:
        problems.append(f"{name}: no result")
for kind in ("without", "with"):
    rs = rows(f"ferrum-1b-kvhost-{kind}.jsonl")
    if not rs or len(rs[0].get("pass_seconds", [])) != 2:
        problems.append(f"ferrum-1b-kvhost-{kind}: no result with two passes")
    elif kind == "with" and not (rs[0].get("kv_host") or {}).get("hits"):
        problems.append(f"ferrum-1b-kvhost-with: no block came back from the host: {rs[0].get('kv_host')}")
report = open(os.path.join(res, "benchmarks-gpu.md")).read()
for section in ("## Decode, Llama-3.1-8B-shaped", "## Decode, Llama-3.2-1B-shaped",
                "Where a batch-1 decode step goes", "## Engine throughput", "## Prefill",
                "## The host KV tier", "## The fp8 KV cache"):
    if section not in report:
        problems.append(f"the report has no section {section!r}")
skipped = open(os.path.join(res, "skipped.txt")).read().split()
if sorted(skipped) != sorted(["ceilings", "hf-8b", "hf-1b"]):
    problems.append(f"skipped steps {skipped}: only the torch steps may be")
tuning = json.load(open(os.path.join(sweeps, "tuning.json")))["families"]
for family in ("decode_products", "decode_attention"):
    f = tuning.get(family)
    if not f or f["candidates_run"] != 2 or not f["baseline_ms"]:
        problems.append(f"sweep: {family}: {f}")
for p in problems:
    print("FAILED:", p)
if problems:
    sys.exit(1)
print(f"ok - the GPU round's steps, report and sweep on the interpreted device ({res})")
PY
