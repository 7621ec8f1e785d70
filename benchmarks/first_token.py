"""Time from a server's process start to its first streamed token, as a user sees it.

benchmarks/run.sh takes the clock (--since, seconds since the epoch) right before it starts a
server, then runs this script, which polls GET /v1/models every 10 ms until it answers 200, then
streams one completion (max_tokens 1) for the model the server lists, and prints JSON:
{"name", "ready_s", "first_token_s"}, both counted from --since. Exits 1 on a timeout or an
error answer, saying which.
"""

import argparse
import http.client
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--since", type=float, required=True)
    ap.add_argument("--timeout", type=float, default=900.0)
    a = ap.parse_args()
    deadline = a.since + a.timeout
    model = None
    while model is None:
        if time.time() > deadline:
            print(f"{a.name}: not ready after {a.timeout:.0f} s", file=sys.stderr)
            return 1
        try:
            c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=5)
            c.request("GET", "/v1/models")
            r = c.getresponse()
            body = r.read()
            if r.status == 200:
                model = json.loads(body)["data"][0]["id"]
                break
        except (OSError, ValueError, KeyError, IndexError, http.client.HTTPException):
            pass
        time.sleep(0.01)
    ready = time.time() - a.since
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1, "stream": True,
                       "temperature": 0})
    c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=a.timeout)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        print(f"{a.name}: the first request got {r.status}: {r.read()[:300]!r}", file=sys.stderr)
        return 1
    first = None
    for line in r:
        if line.startswith(b"data:") and b"[DONE]" not in line and b'"choices"' in line:
            first = time.time() - a.since
            break
    if first is None:
        print(f"{a.name}: the stream ended without a token", file=sys.stderr)
        return 1
    r.read()
    print(json.dumps({"name": a.name, "ready_s": round(ready, 3), "first_token_s": round(first, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
