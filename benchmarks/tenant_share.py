#!/usr/bin/env python3
"""Fair shares between tenants, measured through HTTP: two tenants of weights 3 and 1 flooding
one server (each a closed loop of `--concurrency` clients, the same request shape), under
`--scheduling fair --tenant-weights a=3,b=1` and, as the baseline, `--scheduling fifo`; then
tenant b alone under `fair` (idle capacity goes to whoever asks). `--max-num-seqs` is kept
below the two floods together, so requests queue and the policy decides who goes next.

Each run is a fresh `ferrum serve` and one `ferrum bench serve --class ...` for `--duration`
seconds; runs alternate over `--rounds`. Prints one JSON object: per run, each tenant's
output tok/s and completed requests as the clients saw them, the tokens the server computed
for each (prompt and output: `ferrum_tenant_computed_tokens_total`, what the weights share)
between two scrapes of `/metrics` while both tenants flood (from 20% to 95% of the run: the
clients stop sending at its end, and the queued requests drain after, no longer under
contention, so the totals at the end are not the share), and the a:b ratios of both.

    python3 benchmarks/tenant_share.py --bin target/release/ferrum \\
        --model models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
"""

import argparse
import json
import re
import sys
import threading
import time
import urllib.request

from slo_mix import Server, bench


def computed_tokens(base):
    """The server's tokens computed per weighted tenant, from /metrics."""
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'ferrum_tenant_computed_tokens_total\{.*tenant="([^"]+)"\} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ferrum")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--duration", type=float, default=45)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=100)
    ap.add_argument("--output-len", type=int, default=48)
    a = ap.parse_args()
    common = ["--threads", str(a.threads), "--max-num-seqs", str(a.max_num_seqs)]
    shape = f"concurrency={a.concurrency},input={a.input_len},output={a.output_len}"
    both = ["--class", f"name=a,{shape},user=a", "--class", f"name=b,{shape},user=b"]
    alone = ["--class", f"name=b,{shape},user=b"]
    plans = [("fair", ["--scheduling", "fair", "--tenant-weights", "a=3,b=1"], both),
             ("fifo", ["--scheduling", "fifo"], both),
             ("fair, b alone", ["--scheduling", "fair", "--tenant-weights", "a=3,b=1"], alone)]
    runs = []
    for r in range(a.rounds):
        for name, flags, classes in plans:
            s = Server(a.bin, a.model, common + flags)
            try:
                scrapes = []

                def scrape():
                    t0 = time.time()
                    for at in (0.2, 0.95):
                        time.sleep(max(0.0, t0 + at * a.duration - time.time()))
                        scrapes.append(computed_tokens(s.base))

                scraper = threading.Thread(target=scrape)
                scraper.start()
                rep = bench(a.bin, ["--base-url", s.base, "--tokenizer", a.model,
                                    "--duration", str(a.duration), *classes])
                scraper.join()
                computed = {t: scrapes[1][t] - scrapes[0].get(t, 0) for t in scrapes[1]}
            finally:
                s.stop()
            tenants = {c["name"]: {"output_tok_s": c["output_tok_s"], "completed": c["completed"],
                                   "failed": c["failed"], "refused": c["refused"]}
                       for c in rep["classes"]}
            for t, n in computed.items():
                if t in tenants:
                    tenants[t]["computed_tokens"] = n
            run = {"round": r, "policy": name, "tenants": tenants}
            if "a" in tenants and tenants["b"]["output_tok_s"] > 0:
                run["ratio_a_to_b"] = tenants["a"]["output_tok_s"] / tenants["b"]["output_tok_s"]
                if computed.get("b"):
                    run["computed_ratio_a_to_b"] = computed.get("a", 0) / computed["b"]
            print(f"{name}: {tenants}", file=sys.stderr)
            runs.append(run)
    print(json.dumps({"model": a.model.split("/")[-1], "weights": {"a": 3, "b": 1},
                      "concurrency_per_tenant": a.concurrency, "max_num_seqs": a.max_num_seqs,
                      "input_len": a.input_len, "output_len": a.output_len,
                      "duration_s": a.duration, "runs": runs}))


if __name__ == "__main__":
    main()
