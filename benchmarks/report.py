"""Writes docs/benchmarks.md (to stdout) from the JSON files benchmarks/run.sh leaves in a folder."""

import json
import pathlib
import platform
import subprocess
import sys


def load(path: pathlib.Path):
    return json.loads(path.read_text()) if path.exists() else None


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"


def cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next(l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name"))
    except (OSError, StopIteration):
        name = platform.processor()
    flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0]
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f" {f}" in flags]
    return f"{name}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores ({', '.join(isa)})"


def main() -> None:
    d = pathlib.Path(sys.argv[1])
    p = print
    p("# Benchmarks: Ferrum against llama.cpp and vLLM on one machine\n")
    p(f"Machine: {cpu()}. Model: SmolLM2-135M-Instruct, Q4_1 GGUF (vLLM and `ferrum-bf16`: the same")
    p("weights dequantized to a bf16 Hugging Face folder). Every figure comes from one run of")
    p("`bash benchmarks/run.sh`; ratios compare engines measured minutes apart on the same machine.\n")
    p("## Raw model speed (2 threads, same token ids)\n")
    p("| | Ferrum | llama.cpp | ratio |")
    p("| --- | --- | --- | --- |")
    for name, label in [("single", "one sequence"), ("batch16", "16 sequences together")]:
        f = load(d / f"latency-ferrum-{name}.json")
        l = load(d / f"latency-llamacpp-{name}.json")
        if not f or not l:
            continue
        p(f"| prefill, {label}, {f['input_len']}-token prompts (tok/s) | {f['prefill_tok_s']:.1f} | "
          f"{l['prefill_tok_s']:.1f} | {ratio(f['prefill_tok_s'], l['prefill_tok_s'])} |")
        p(f"| decode, {label}, {f['output_len']} steps (tok/s) | {f['decode_tok_s']:.1f} | "
          f"{l['decode_tok_s']:.1f} | {ratio(f['decode_tok_s'], l['decode_tok_s'])} |")
    p("\n## Serving (`ferrum bench serve`: 100-token prompts, ignore_eos, streaming)\n")
    serves = {x.stem[len("serve-"):]: load(x) for x in sorted(d.glob("serve-*.json"))}
    rss = {x.stem[len("rss-"):]: load(x) for x in sorted(d.glob("rss-*.json"))}
    p("| server | concurrency | output tok/s | requests/s | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) | failed |")
    p("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, rep in serves.items():
        for lv in rep["levels"]:
            p(f"| {name} | {lv['concurrency']} | {lv['output_tok_s']:.1f} | {lv['requests_per_s']:.2f} | "
              f"{lv['ttft_ms_p50']:.0f} | {lv['ttft_ms_p99']:.0f} | {lv['itl_ms_p50']:.1f} | {lv['failed']} |")
    base = serves.get("ferrum-gguf")
    if base:
        p("\nFerrum (GGUF) output tok/s over each peer, per concurrency level:\n")
        for name, rep in serves.items():
            if name.startswith("ferrum"):
                continue
            by_c = {lv["concurrency"]: lv for lv in rep["levels"]}
            parts = [f"c={lv['concurrency']}: {ratio(lv['output_tok_s'], by_c[lv['concurrency']]['output_tok_s'])}"
                     for lv in base["levels"] if lv["concurrency"] in by_c]
            p(f"- against {name}: " + ", ".join(parts))
    if rss:
        p("\nPeak resident memory of each server (VmHWM after its load):\n")
        for name, r in rss.items():
            p(f"- {name}: {r['peak_rss_mib']} MiB")
    p("\n![throughput and latency against concurrency](benchmarks-serve.svg)\n")
    p("## How to reproduce\n")
    p("```sh")
    p("bash benchmarks/setup-vllm.sh      # optional: vLLM's CPU build and the bf16 folder")
    p("bash benchmarks/run.sh             # installs llama.cpp, builds Ferrum, runs everything")
    p("```\n")
    p("The raw-speed rows run `ferrum bench latency --model M --input-len N --output-len N")
    p("[--batch-size 16] --threads 2 --json` against `benchmarks/llamacpp_latency.py`, which drives")
    p("llama.cpp's own batch API (llama-cpp-python 0.3.36 built with GGML_NATIVE) over the same token")
    p("ids. The serving rows start each server on a free port and run `ferrum bench serve --concurrency")
    p("1,4,16 --num-prompts 32 --input-len 100 --output-len 128 --tokenizer M --json` against it.")
    p("llama-cpp-python's server runs one request at a time (it has no parallel slots), so its")
    p("concurrency levels queue.")


if __name__ == "__main__":
    main()
