"""The disk KV tier, measured: a long prefix asked again after a server restart, and a working
set of documents larger than the KV cache asked in turn.

Each round starts `ferrum serve --kv-disk-dir DIR` twice on the same folder:
- `cold`: the folder is emptied first, so the prompt is computed (and its blocks written);
- `restart`: a new server process on the folder the cold one left, which reads the prompt's
  prefix back instead of computing it;
and stops each server gracefully (SIGTERM). Rounds alternate cold and restart runs; the
prompt is the same every time (`--prefix-tokens` token ids, a fixed pseudo-random text of the
vocabulary's first 20000 ids, then a short question), so prefix blocks are the only thing
shared. Reports, per run, the time to the first streamed token and the generated tokens (which
must be the same in every run), and prints JSON: medians, their ratio, and the server's
`ferrum_kv_tier_*` counters after the restart runs.

    python3 benchmarks/kv_disk_restart.py --bin target/release/ferrum \
        --model models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf --prefix-tokens 4000 --rounds 3

`--working-set N:D:B` instead: N documents of D tokens, a KV cache of B blocks of 16 (less than
the documents), each document asked twice in turn (two passes), on one server with the tier
and one without (alternated per pass: without, with, without, with). Reports each server's
second-pass median time to first token and total seconds, and whether both gave the same
tokens.
"""

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


class Server:
    def __init__(self, binary, model, kv_dir, extra):
        tier = ["--kv-disk-dir", kv_dir] if kv_dir else []
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model, "--port", "0", "--served-model-name", "m",
             "--no-web-ui", *tier, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = None
        self.log = []
        deadline = time.time() + 600
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("ferrum serve exited:\n" + "".join(self.log))
            self.log.append(line)
            m = re.search(r"http://[^\s:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if time.time() > deadline:
                raise RuntimeError("ferrum serve did not start")

    def first_token(self, prompt, max_tokens):
        """Seconds to the first streamed token, and the generated text."""
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0, "stream": True, "ignore_eos": True})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        t0 = time.time()
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
        first, text = None, []
        for line in r:
            if not line.startswith(b"data:") or b"[DONE]" in line:
                continue
            chunk = json.loads(line[5:])
            for ch in chunk.get("choices", []):
                if ch.get("text") is not None:
                    if first is None:
                        first = time.time() - t0
                    text.append(ch["text"])
        return first, "".join(text)

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        out = {}
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith("ferrum_kv_tier_"):
                name, value = line.split("{", 1)[0], line.rsplit(" ", 1)[1]
                out[name] = float(value)
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def evict_from_page_cache(folder):
    """Writes the folder's files out and drops them from the page cache."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def working_set(a, spec) -> int:
    n, d, blocks = (int(x) for x in spec.split(":"))
    rng = random.Random(99)
    docs = [[rng.randrange(100, 20000) for _ in range(d)] for _ in range(n)]
    kv_dir = tempfile.mkdtemp(prefix="ferrum-kv-disk-ws-")
    extra = ["--num-kv-blocks", str(blocks), *a.extra]
    servers = {"without": Server(a.bin, a.model, None, extra),
               "with": Server(a.bin, a.model, kv_dir, extra)}
    ttft = {k: [[], []] for k in servers}
    secs = {k: [0.0, 0.0] for k in servers}
    texts = {k: [] for k in servers}
    try:
        for p in range(2):
            for kind in ("without", "with"):
                t0 = time.time()
                for doc in docs:
                    t, text = servers[kind].first_token(doc, a.max_tokens)
                    ttft[kind][p].append(t)
                    texts[kind].append(text)
                secs[kind][p] = time.time() - t0
                print(f"pass {p} {kind} the tier: {secs[kind][p]:.1f} s", file=sys.stderr)
        tier = servers["with"].metrics()
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(kv_dir, ignore_errors=True)
    out = {
        "model": os.path.basename(a.model),
        "documents": n, "doc_tokens": d, "kv_blocks": blocks,
        "second_pass_median_ttft_s": {k: round(statistics.median(v[1]), 3) for k, v in ttft.items()},
        "second_pass_s": {k: round(v[1], 1) for k, v in secs.items()},
        "first_pass_s": {k: round(v[0], 1) for k, v in secs.items()},
        "same_tokens": texts["with"] == texts["without"],
        "tier": tier,
    }
    out["second_pass_speedup"] = round(secs["without"][1] / secs["with"][1], 1)
    print(json.dumps(out, indent=1))
    return 0 if out["same_tokens"] else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ferrum")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prefix-tokens", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="the tier's folder (default: a temporary one)")
    ap.add_argument("--cold-files", action="store_true",
                    help="before each restart run, evict the tier's files from the page cache "
                         "(posix_fadvise DONTNEED), so the blocks come from the disk itself")
    ap.add_argument("--working-set", metavar="N:D:B",
                    help="N documents of D tokens against a KV cache of B blocks instead")
    ap.add_argument("extra", nargs="*", help="more `ferrum serve` flags (after --)")
    a = ap.parse_args()
    if a.working_set:
        return working_set(a, a.working_set)
    rng = random.Random(1234)
    prompt = [rng.randrange(100, 20000) for _ in range(a.prefix_tokens)]
    kv_dir = a.dir or tempfile.mkdtemp(prefix="ferrum-kv-disk-bench-")
    runs = {"cold": [], "restart": []}
    outputs = set()
    tier = {}
    try:
        for r in range(a.rounds):
            for kind in ("cold", "restart"):
                if kind == "cold":
                    shutil.rmtree(kv_dir, ignore_errors=True)
                    os.makedirs(kv_dir)
                elif a.cold_files:
                    evict_from_page_cache(kv_dir)
                s = Server(a.bin, a.model, kv_dir, a.extra)
                try:
                    ttft, text = s.first_token(prompt, a.max_tokens)
                    if kind == "restart":
                        tier = s.metrics()
                finally:
                    s.stop()
                runs[kind].append(ttft)
                outputs.add(text)
                print(f"round {r} {kind}: first token after {ttft:.3f} s", file=sys.stderr)
    finally:
        if not a.dir:
            shutil.rmtree(kv_dir, ignore_errors=True)
    cold, warm = statistics.median(runs["cold"]), statistics.median(runs["restart"])
    print(json.dumps({
        "model": os.path.basename(a.model),
        "prefix_tokens": a.prefix_tokens,
        "rounds": a.rounds,
        "ttft_cold_s": runs["cold"],
        "ttft_restart_s": runs["restart"],
        "cold_files": a.cold_files,
        "median_cold_s": round(cold, 3),
        "median_restart_s": round(warm, 3),
        "speedup": round(cold / warm, 1),
        "same_tokens": len(outputs) == 1,
        "tier_after_restart": tier,
    }, indent=1))
    return 0 if len(outputs) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
