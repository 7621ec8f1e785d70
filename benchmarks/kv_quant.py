#!/usr/bin/env python3
"""The int8 KV cache against an f16 one, beside llama.cpp's q8_0 KV cache, on one GGUF file.

Prints one JSON object:

- quality: `ferrum bench perplexity --kv-cache-dtype int8 --reference-kv-cache-dtype f16` on a
  held-out text (perplexity of each, KL(f16 || int8), argmax agreement, last-position logits,
  greedy continuations), and llama.cpp's `llama-perplexity` with an f16 cache (the KL base) and
  then `-ctk q8_0 -ctv q8_0 --kl-divergence` on the same text and chunk size.
- speed: decode at batch `--batch` (prompts of `--input-len`, `--output-len` steps), alternated
  over `--rounds` rounds: Ferrum f16, Ferrum int8, llama-batched-bench f16 and q8_0 (flash
  attention on for both, which llama.cpp's quantized V cache needs), each round opened by
  `ferrum bench bandwidth`.
- capacity: KV bytes per token of each cache type (Ferrum's from `bench latency`; llama.cpp's
  q8_0 is 34 bytes per 32 values, f16 2 per value).

Usage: python3 benchmarks/kv_quant.py --bin target/release/ferrum --llama-bin DIR --model M
       [--text benchmarks/texts/heldout.md] [--ctx 512] [--threads 2]
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile


def run(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, capture_output=True, text=True)


def ferrum_quality(a):
    out = run([a.bin, "bench", "perplexity", "--model", a.model, "--file", a.text, "--ctx",
               str(a.ctx), "--threads", str(a.threads), "--kv-cache-dtype", "int8",
               "--reference-kv-cache-dtype", "f16", "--json"]).stdout
    return json.loads(out.strip().splitlines()[-1])


def llama_quality(a):
    ppl = f"{a.llama_bin}/llama-perplexity"
    common = ["-m", a.model, "-f", a.text, "-c", str(a.ctx), "-t", str(a.threads), "-fa", "on"]
    with tempfile.TemporaryDirectory() as tmp:
        base = f"{tmp}/base.kld"
        r = run([ppl, *common, "--kl-divergence-base", base])
        log = r.stdout + r.stderr
        f16 = float(re.search(r"Final estimate: PPL = ([0-9.]+)", log).group(1))
        r = run([ppl, *common, "-ctk", "q8_0", "-ctv", "q8_0", "--kl-divergence-base", base,
                 "--kl-divergence"])
        log = r.stdout + r.stderr
    num = lambda pat: float(re.search(pat, log).group(1))
    return {
        "ppl_f16": f16,
        "ppl_q8_0": num(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)"),
        "ppl_base": num(r"Mean PPL\(base\)\s*:\s*([0-9.]+)"),
        "mean_kl": num(r"Mean\s+KLD:\s*([0-9.eE+-]+)"),
        "max_kl": num(r"Maximum KLD:\s*([0-9.eE+-]+)"),
        "top1_agreement": num(r"Same top p:\s*([0-9.]+)") / 100,
    }


def ferrum_speed(a, dtype):
    out = run([a.bin, "bench", "latency", "--model", a.model, "--input-len", str(a.input_len),
               "--output-len", str(a.output_len), "--batch-size", str(a.batch), "--num-iters", "1",
               "--num-iters-warmup", "0", "--threads", str(a.threads), "--kv-cache-dtype", dtype,
               "--json"]).stdout
    return json.loads(out.strip().splitlines()[-1])


def llama_speed(a, kv):
    cmd = [f"{a.llama_bin}/llama-batched-bench", "-m", a.model,
           "-c", str(a.batch * (a.input_len + a.output_len) + 16), "-b", "2048", "-ub", "512",
           "-npp", str(a.input_len), "-ntg", str(a.output_len), "-npl", str(a.batch),
           "-t", str(a.threads), "-tb", str(a.threads), "-fa", "on", "-ctk", kv, "-ctv", kv,
           "--output-format", "jsonl"]
    runs = [json.loads(l) for l in run(cmd).stdout.splitlines() if l.startswith("{")]
    return {"prefill_tok_s": runs[0]["speed_pp"], "decode_tok_s": runs[0]["speed_tg"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ferrum")
    ap.add_argument("--llama-bin", default="target/bench/llama.cpp/bin")
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", default="benchmarks/texts/heldout.md")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    result = {"model": a.model.split("/")[-1], "text": a.text, "ctx": a.ctx,
              "batch": a.batch, "input_len": a.input_len, "output_len": a.output_len,
              "ferrum_quality": ferrum_quality(a), "llamacpp_quality": llama_quality(a)}
    speed = {k: [] for k in ("bandwidth", "ferrum_f16", "ferrum_int8", "llamacpp_f16",
                             "llamacpp_q8_0")}
    kv_bytes = {}
    for _ in range(a.rounds):
        bw = json.loads(run([a.bin, "bench", "bandwidth", "--json"]).stdout)
        speed["bandwidth"].append(bw["read_gb_s"])
        for dtype in ("f16", "int8"):
            r = ferrum_speed(a, dtype)
            speed[f"ferrum_{dtype}"].append(r["decode_tok_s"])
            kv_bytes[dtype] = r["kv_bytes_per_token"]
        for kv in ("f16", "q8_0"):
            speed[f"llamacpp_{kv}"].append(llama_speed(a, kv)["decode_tok_s"])
    result["decode_tok_s"] = speed
    result["median_decode_tok_s"] = {k: statistics.median(v) for k, v in speed.items()}
    result["kv_bytes_per_token"] = {
        "ferrum_f16": kv_bytes["f16"], "ferrum_int8": kv_bytes["int8"],
        "llamacpp_f16": kv_bytes["f16"], "llamacpp_q8_0": kv_bytes["f16"] / 2 * 34 / 32}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
