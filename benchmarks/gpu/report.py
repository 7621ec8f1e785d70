"""Turns a results folder of benchmarks/gpu/run.sh into docs/benchmarks-gpu.md (printed).

Rooflines: decode reads every weight once per step plus each sequence's K/V (`ferrum bench
latency` reports those bytes per token), so its ceiling is the measured copy bandwidth over
them; prefill does 2 FLOPs per weight per token plus attention's 4 x layers x q-width x
(mean causal context), so its ceiling is the measured bf16 product rate over them.

    python3 benchmarks/gpu/report.py RESULTS > docs/benchmarks-gpu.md
"""

import glob
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def by_batch(rows):
    return {r["batch_size"]: r for r in rows if not r.get("prefill_only")}


def fmt(v, spec=".1f", unit=""):
    return "n/a" if v is None else format(v, spec) + unit


def outside(r):
    p = r.get("profile") if r else None
    if not p or not p.get("wall_ms_per_step"):
        return None
    return 100.0 * (1 - p["device_ms_per_step"] / p["wall_ms_per_step"])


def main(res):
    dev = open(os.path.join(res, "device.txt")).read().strip() if os.path.exists(
        os.path.join(res, "device.txt")) else "unknown"
    ceil = (load(os.path.join(res, "ceilings.json")) or [{}])[0]
    bw, tf = ceil.get("copy_gb_s"), ceil.get("bf16_tflop_s")
    failed = [l for l in open(os.path.join(res, "failed.txt")).read().split() if l] \
        if os.path.exists(os.path.join(res, "failed.txt")) else []
    # The run's sizes (run.sh writes them; the GPU round's defaults otherwise).
    rnd = dict({"device": "cuda", "input_len": 128, "output_len": 32, "prefill_len": 2048,
                "num_prompts": 256, "throughput_len": 128},
               **((load(os.path.join(res, "round.json")) or [{}])[0]))
    p = print
    p("# Ferrum on a GPU: figures\n")
    if rnd["device"] != "cuda":
        p(f"**Not GPU figures**: this run was on the {rnd['device']} device, which checks the "
          "round's steps end to end; its times are the interpreter's.\n")
    p("Written by `benchmarks/gpu/run.sh` (one call on a lent machine; see its header). "
      "Models are Llama-shaped with random bf16 weights made on the device "
      "(`benchmarks/gpu/make_model.py`); the peer is transformers' `generate` on the same GPU "
      "and folder (bf16, SDPA, dynamic cache, greedy). "
      f"Decode: {rnd['input_len']}-token prompts, {rnd['output_len']} tokens, "
      "greedy, the batch advancing together (`ferrum bench latency`).\n")
    p(f"- Device: `{dev.splitlines()[0] if dev else dev}`")
    p(f"- Ceilings measured first: device-to-device copy **{fmt(bw)} GB/s** (bytes read + "
      f"written), bf16 8192^3 product **{fmt(tf)} TFLOP/s** (cuBLAS through PyTorch "
      f"{ceil.get('torch', '?')}).")
    if failed:
        p(f"- Steps that failed in this run: {', '.join(failed)}.")
    p("")
    for shape, name in (("8b", "Llama-3.1-8B-shaped"), ("1b", "Llama-3.2-1B-shaped")):
        def runs(kind):
            files = sorted(glob.glob(os.path.join(res, f"ferrum-{shape}-{kind}*.jsonl")))
            return by_batch([r for f in files for r in load(f)])

        g, n = runs("graph"), runs("plain")
        hf = by_batch(load(os.path.join(res, f"hf-{shape}.jsonl")))
        if not (g or n):
            continue
        p(f"## Decode, {name} (bf16)\n")
        p("| batch | Ferrum, graphs (tok/s) | Ferrum, plain launches | transformers | "
          "roofline tok/s | Ferrum share of roofline | graphs / plain | Ferrum / transformers "
          "| outside kernels (graphs, plain) |")
        p("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for b in sorted(set(g) | set(n)):
            rg, rn, rh = g.get(b), n.get(b), hf.get(b)
            r = rg or rn
            roof = bw * 1e9 / r["bytes_per_decode_token"] if bw else None
            best = rg["decode_tok_s"] if rg else None
            share = 100.0 * best / roof if (best and roof) else None
            ratio = best / rn["decode_tok_s"] if (best and rn) else None
            vs_hf = best / rh["decode_tok_s"] if (best and rh) else None
            og, on = outside(rg), outside(rn)
            p(f"| {b} | {fmt(best)} | {fmt(rn and rn['decode_tok_s'])} | "
              f"{fmt(rh and rh['decode_tok_s'])} | {fmt(roof)} | {fmt(share, '.1f', '%')} | "
              f"{fmt(ratio, '.2f', 'x')} | {fmt(vs_hf, '.2f', 'x')} | {fmt(og, '.1f', '%')}, "
              f"{fmt(on, '.1f', '%')} |")
        p("")
        prof = n.get(1) or {}
        pr = prof.get("profile")
        if pr:
            launches = pr.get("launches_per_step")
            launches = f", {launches:.0f} launches" if launches is not None else ""
            p(f"Where a batch-1 decode step goes without graphs ({name}; "
              f"{pr['wall_ms_per_step']:.3f} ms wall, {pr['device_ms_per_step']:.3f} ms in "
              f"kernels{launches}, device events around each launch; `*`: the kernel's aligned "
              "binary):\n")
            p("| kernel | grid | launches/step | ms/step | share of kernel time |")
            p("| --- | --- | --- | --- | --- |")
            for k in pr["kernels"][:12]:
                grid = "x".join(str(g) for g in k.get("grid", []))
                mark = "*" if k.get("variant") == "aligned" else ""
                p(f"| `{k['name']}`{mark} | {grid} | {k['launches_per_step']:.0f} | "
                  f"{k['ms_per_step']:.4f} | "
                  f"{100 * k['ms_per_step'] / pr['device_ms_per_step']:.1f}% |")
            p("")
    thr = {k: load(os.path.join(res, f"ferrum-1b-throughput-{k}.jsonl")) for k in ("overlap", "sync")}
    if thr["overlap"] or thr["sync"]:
        n, tl = rnd["num_prompts"], rnd["throughput_len"]
        p(f"## Engine throughput, 1B-shaped, {n} requests of {tl} + {tl} tokens\n")
        p("Steps overlapped (the next scheduled and enqueued while one runs) against steps "
          "finished one at a time (`--no-overlap`).\n")
        p("| steps | output tok/s | total tok/s | steps overlapped | ms/step | host ms/step | "
          "share of the step waiting on the GPU |")
        p("| --- | --- | --- | --- | --- | --- | --- |")
        for k, name in (("overlap", "overlapped"), ("sync", "one at a time")):
            for r in thr[k]:
                p(f"| {name} | {r['output_tok_s']:.0f} | {r['total_tok_s']:.0f} | "
                  f"{r.get('steps_overlapped', 0)} of {r.get('steps', 0)} | "
                  f"{fmt(r.get('step_ms'), '.2f')} | "
                  f"{fmt(r.get('host_ms_per_step') if k == 'overlap' else None, '.2f')} | "
                  f"{fmt(100 * r['device_wait_share'] if k == 'overlap' and 'device_wait_share' in r else None, '.0f', '%')} |")
        p("\nOverlapped, the host's own work per step (scheduling, batch building, processing "
          "the previous step's tokens) runs while the GPU computes; it is hidden while the share "
          "waiting on the GPU stays above zero. One at a time, every step's wall time is the "
          "host's work plus the GPU's.")
        if thr["overlap"] and thr["sync"]:
            ratio = thr["overlap"][0]["output_tok_s"] / thr["sync"][0]["output_tok_s"]
            p(f"\nOverlapped against one at a time: {ratio:.2f}x output tok/s.")
        p("")
    ws = {k: load(os.path.join(res, f"ferrum-1b-kvhost-{k}.jsonl")) for k in ("without", "with")}
    if ws["without"] or ws["with"]:
        r0 = (ws["without"] or ws["with"])[0]
        p(f"## The host KV tier, 1B-shaped: {r0['num_prompts']} documents of {r0['input_len']} "
          "tokens, more than the KV cache holds, sent twice\n")
        p("The second pass recomputes what the KV cache evicted, or, with `--kv-offload-memory`, "
          "copies it back from page-locked host memory.\n")
        p("| host tier | first pass s | second pass s | blocks brought back | recomputed at admission |")
        p("| --- | --- | --- | --- | --- |")
        for k in ("without", "with"):
            for r in ws[k]:
                passes = r.get("pass_seconds") or [None, None]
                h = r.get("kv_host") or {}
                p(f"| {k} | {fmt(passes[0], '.2f')} | {fmt(passes[-1], '.2f')} | "
                  f"{h.get('hits', '-')} | {h.get('misses', '-')} |")
        if ws["without"] and ws["with"]:
            a, b = ws["without"][0]["pass_seconds"][-1], ws["with"][0]["pass_seconds"][-1]
            p(f"\nSecond pass, without the tier against with it: {a / b:.2f}x.")
        p("")
    kv = {k: by_batch(load(os.path.join(res, f"ferrum-1b-kv-{k}.jsonl"))) for k in ("bf16", "fp8")}
    if kv["bf16"] or kv["fp8"]:
        r0 = next(iter((kv["bf16"] or kv["fp8"]).values()))
        p(f"## The fp8 KV cache, 1B-shaped, {r0['input_len']}-token prompts\n")
        p("Decode with `--kv-cache-dtype fp8` (e4m3 bytes and an f32 scale per token and KV "
          "head) against the model's bf16 cache, graphs on; the roofline counts each cache's "
          "bytes.\n")
        p("| batch | bf16 cache tok/s | fp8 cache tok/s | fp8 / bf16 | K/V bytes per token "
          "(bf16, fp8) | fp8 share of its roofline |")
        p("| --- | --- | --- | --- | --- | --- |")
        for b in sorted(set(kv["bf16"]) | set(kv["fp8"])):
            h, e = kv["bf16"].get(b), kv["fp8"].get(b)
            ratio = e["decode_tok_s"] / h["decode_tok_s"] if (h and e) else None
            roof = bw * 1e9 / e["bytes_per_decode_token"] if (bw and e) else None
            share = 100.0 * e["decode_tok_s"] / roof if roof else None
            p(f"| {b} | {fmt(h and h['decode_tok_s'])} | {fmt(e and e['decode_tok_s'])} | "
              f"{fmt(ratio, '.2f', 'x')} | {h['kv_bytes_per_token'] if h else '-'}, "
              f"{e['kv_bytes_per_token'] if e else '-'} | {fmt(share, '.1f', '%')} |")
        p("")
    pre = load(os.path.join(res, "ferrum-8b-prefill.jsonl"))
    cfg_path = os.path.join(res, "config-8b.json")
    if pre and os.path.exists(cfg_path):
        c = json.load(open(cfg_path))
        r = pre[0]
        L = r["input_len"]
        qw = c["num_attention_heads"] * c["head_dim"]
        # Weight FLOPs: 2 per bf16 weight read (weight_bytes / 2 weights).
        flops = r["weight_bytes_per_step"] + 4 * c["num_hidden_layers"] * qw * (L + 1) / 2
        ftf = r["prefill_tok_s"] * flops / 1e12
        hfp = [x for x in load(os.path.join(res, "hf-8b.jsonl")) if x.get("prefill_only")]
        p(f"## Prefill, one {L}-token prompt, Llama-3.1-8B-shaped\n")
        p("| engine | tok/s | TFLOP/s | share of the measured bf16 rate |")
        p("| --- | --- | --- | --- |")
        p(f"| Ferrum | {r['prefill_tok_s']:.0f} | {ftf:.1f} | {fmt(tf and 100 * ftf / tf, '.1f', '%')} |")
        tri = load(os.path.join(res, "ferrum-8b-prefill-triton.jsonl"))
        if tri:
            t = tri[0]["prefill_tok_s"]
            ttf = t * flops / 1e12
            p(f"| Ferrum, `--gemm triton` | {t:.0f} | {ttf:.1f} | "
              f"{fmt(tf and 100 * ttf / tf, '.1f', '%')} |")
        if hfp:
            h = hfp[0]["prefill_tok_s"]
            htf = h * flops / 1e12
            p(f"| transformers | {h:.0f} | {htf:.1f} | {fmt(tf and 100 * htf / tf, '.1f', '%')} |")
        p("")


if __name__ == "__main__":
    main(sys.argv[1])
