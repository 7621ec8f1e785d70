#!/usr/bin/env python3
"""Scheduling to service-level targets, measured: an interactive class beside a batch class at
1.5x the load the server can take, under `--scheduling fifo` and under `--scheduling slo`.

1. Capacity: `ferrum bench serve --concurrency 8` on the batch class's shape, in requests per
   second, on a `fifo` server.
2. For each policy in turn (alternated over `--rounds`), a fresh `ferrum serve` and one mixed
   run (`ferrum bench serve --class ...` for `--duration` seconds): the interactive class
   (open-loop Poisson at `--interactive-share` of capacity, short prompts, `--ttft-ms` and
   `--tpot-ms` targets sent as `slo`, priority 0) and the batch class (open-loop at the rest of
   1.5x capacity, longer prompts, no target, priority 1).

`--policies` picks them (default `fifo,slo`); `LABEL:POLICY=BINARY` serves one from another
build, so two builds' scheduling are compared in one run.

Prints one JSON object: the capacity, and per policy and round each class's report (goodput,
refused, output tok/s, TTFT/TPOT percentiles, chunk gaps, refusal latency and the waits asked;
with `--retry-check`, how the waits compared with when the retries were served).

    python3 benchmarks/slo_mix.py --bin target/release/ferrum \\
        --model models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
"""

import argparse
import json
import re
import signal
import subprocess
import sys
import time


class Server:
    def __init__(self, binary, model, extra):
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model, "--port", "0", "--no-web-ui", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.base = None
        log = []
        deadline = time.time() + 600
        while self.base is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("ferrum serve exited:\n" + "".join(log))
            log.append(line)
            m = re.search(r"on (http://[^\s/]+:\d+)", line)
            if m:
                self.base = m.group(1)
            if time.time() > deadline:
                raise RuntimeError("ferrum serve did not start")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def bench(binary, args):
    print("+ bench serve " + " ".join(args), file=sys.stderr)
    out = subprocess.run([binary, "bench", "serve", *args, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ferrum")
    ap.add_argument("--policies", default="fifo,slo",
                    help="comma-separated policies, each POLICY or LABEL:POLICY=BINARY (that "
                         "policy served by another build, reported as LABEL: an A/B of two "
                         "builds' slo scheduling, say fifo,base:slo=/tmp/old,slo)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--duration", type=float, default=90)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--load", type=float, default=1.5)
    ap.add_argument("--interactive-share", type=float, default=0.5)
    ap.add_argument("--ttft-ms", type=int, default=1000)
    ap.add_argument("--tpot-ms", type=int, default=100)
    ap.add_argument("--retry-check", action="store_true",
                    help="retry the interactive class's refusals at half their wait, then at "
                         "all of it (`bench serve`'s retry=check: are the waits within 2x?)")
    a = ap.parse_args()
    common = ["--threads", str(a.threads)]
    s = Server(a.bin, a.model, common + ["--scheduling", "fifo"])
    try:
        cap = bench(a.bin, ["--base-url", s.base, "--tokenizer", a.model, "--concurrency", "8",
                            "--num-prompts", "16", "--input-len", "200", "--output-len", "64"])
    finally:
        s.stop()
    rps = cap["levels"][0]["requests_per_s"]
    inter = a.load * rps * a.interactive_share
    batch = a.load * rps * (1 - a.interactive_share)
    classes = [
        "--class", f"name=interactive,rate={inter:.4f},input=50,output=32,ttft_ms={a.ttft_ms},"
                   f"tpot_ms={a.tpot_ms},slo=body,priority=0"
                   + (",retry=check" if a.retry_check else ""),
        "--class", f"name=batch,rate={batch:.4f},input=200,output=64,priority=1",
    ]
    policies = []
    for p in a.policies.split(","):
        label, _, binary = p.partition("=")
        policies.append((label, label.split(":")[-1], binary or a.bin))
    runs = []
    for r in range(a.rounds):
        for label, policy, binary in policies:
            s = Server(binary, a.model, common + ["--scheduling", policy])
            try:
                rep = bench(a.bin, ["--base-url", s.base, "--tokenizer", a.model,
                                    "--duration", str(a.duration), *classes])
            finally:
                s.stop()
            runs.append({"round": r, "policy": label, "report": rep})
    print(json.dumps({"model": a.model.split("/")[-1], "capacity_rps": rps, "load": a.load,
                      "rates": {"interactive": inter, "batch": batch},
                      "targets": {"ttft_ms": a.ttft_ms, "tpot_ms": a.tpot_ms},
                      "duration_s": a.duration, "runs": runs}))


if __name__ == "__main__":
    main()
