"""Tuning sweeps of the shipped kernels, measured through the engine's own launch path.

    python kernels/sweep.py build --out DIR [--arch sm90|sm80|none] [--ty bf16] \
        [--head-block 128] [--quick]
    python kernels/sweep.py run --candidates DIR --model M --ferrum BIN --device cuda \
        --out RESULTS [--budget SECONDS] [--small]

``build`` (here, with the pinned Triton: the GPU machine's may differ) compiles each candidate
of each family exactly as ``build.py`` compiles the shipped kernels, as an overlay of the
family's kernels only (``build.py --only NAMES --override FILE --out DIR``: a few hundred KB
each, carried to the GPU in the pack), and writes ``DIR/candidates.json``. ``--arch none``
writes specs only, for the interpreted device; ``--quick`` two candidates per family. The
kernels are those of a model of float type ``--ty`` and head block ``--head-block`` (the
8B-shaped bf16 model of the GPU round: bf16, 128).

``run`` (on the device; no Triton needed) runs ``ferrum bench latency --kernels CANDIDATE
--no-cuda-graph --profile-kernels`` for every candidate, baseline (the shipped tiles) first,
on a model whose dtype and head size pick the kernels, and adds up the device time per step of
the family's kernels (the figure a candidate must lower, the engine's decode rate beside it).
It writes ``RESULTS/<family>.jsonl`` (one line per candidate and batch size),
``RESULTS/sweep.md`` (the table) and ``RESULTS/tuning.json``: each family's fastest candidate
against the baseline. That file is what the next build reads: copy it to ``kernels/tuning.json``
and ``specs.py`` takes its tiles for the kernels it names (``kernels/NOTES.md`` says how).
Each family's candidates run in order, shipped first, within the family's share of
``--budget`` seconds; the rest are reported as not run. ``--small`` shrinks every bench to a few tokens (the interpreted device in CI).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Each family: the kernels it retunes (names with {ty} for the model's float type and {d} for
# its head block), the candidates (the parameters they set: constexprs, num_warps,
# num_stages), and the bench that exercises them. Every family's sweep starts with the shipped
# specs (`shipped`), built the same way.
FAMILIES = {
    "decode_products": {
        "kernels": ["gemm_{ty}_decode", "gemm_{ty}_split", "gemm_{ty}_split_silu",
                    "gemm_{ty}_split_gelu"],
        # (BLOCK_N, BLOCK_K, num_warps, num_stages on sm90 and sm80)
        "candidates": [(64, 256, 4, 4), (16, 256, 4, 4), (32, 128, 4, 4), (32, 512, 4, 3),
                       (64, 128, 8, 4), (32, 256, 8, 4), (64, 256, 8, 3)],
        "bench": {"input_len": 128, "output_len": 16, "batch_size": "1,16"},
    },
    "decode_attention": {
        "kernels": ["paged_attention_{ty}_d{d}", "paged_attention_split_{ty}_d{d}"],
        # (BLOCK_N: keys per tile, num_warps)
        "candidates": [(32, 4), (64, 4), (128, 4), (128, 8), (64, 8)],
        "bench": {"input_len": 4096, "output_len": 8, "batch_size": "1"},
    },
}
HEAD_BLOCKS = (32, 64, 128, 256)
# Every family's bench with --small: a few tokens (the interpreted device).
SMALL_BENCH = {"input_len": 8, "output_len": 2, "batch_size": "2"}


def family_overrides(family, cand):
    """The spec changes of candidate ``cand`` of ``family`` (None: the shipped specs)."""
    if cand is None:
        return {}
    if family == "decode_products":
        bn, bk, warps, stages = cand
        return {"constexprs": {"BLOCK_N": bn, "BLOCK_K": bk}, "num_warps": warps,
                "num_stages": {"sm80": min(stages, 3), "sm90": stages}}
    bn, warps = cand
    return {"constexprs": {"BLOCK_N": bn}, "num_warps": warps}


def label(family, cand):
    if cand is None:
        return "shipped"
    if family == "decode_products":
        return "n{}_k{}_w{}_s{}".format(*cand)
    return "n{}_w{}".format(*cand)


def kernel_names(family, ty, d):
    return [k.format(ty=ty, d=d) for k in FAMILIES[family]["kernels"]]


def build(args):
    sys.path.insert(0, HERE)
    import specs  # noqa: E402 - the pinned toolchain's, here only

    shipped = {s["name"]: s for s in specs.all_specs()}
    os.makedirs(args.out, exist_ok=True)
    listing = []
    ty, d = args.ty, args.head_block
    for family, f in FAMILIES.items():
        cands = [None] + (f["candidates"][:1] if args.quick else f["candidates"])
        names = kernel_names(family, ty, d)
        missing = [n for n in names if n not in shipped]
        if missing:
            sys.exit(f"{family}: no kernel {', '.join(missing)}")
        for cand in cands:
            key = f"{family}/{ty}_d{d}/{label(family, cand)}"
            out = os.path.join(args.out, key)
            overrides = {n: family_overrides(family, cand) for n in names}
            # A candidate equal to the shipped specs is the shipped one, already built.
            if cand is not None and all(
                    all(shipped[n]["constexprs"].get(k) == v
                        for k, v in o["constexprs"].items())
                    and o["num_warps"] == shipped[n]["num_warps"]
                    and o.get("num_stages", shipped[n]["num_stages"]) == shipped[n]["num_stages"]
                    for n, o in overrides.items()):
                continue
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as tmp:
                json.dump({n: o for n, o in overrides.items() if o}, tmp)
            cmd = [sys.executable, os.path.join(HERE, "build.py"), "--only",
                   ",".join(names), "--override", tmp.name, "--out", out,
                   "--arch", args.arch]
            done = subprocess.run(cmd, capture_output=True, text=True)
            os.unlink(tmp.name)
            if done.returncode != 0:
                sys.exit(f"{key}: build.py failed:\n{done.stderr}")
            listing.append({"family": family, "label": label(family, cand),
                            "baseline": cand is None, "dir": key,
                            "overrides": overrides[names[0]]})
            print(f"built {key}")
    with open(os.path.join(args.out, "candidates.json"), "w") as f:
        json.dump({"arch": args.arch, "ty": ty, "head_block": d, "candidates": listing}, f,
                  indent=1)


def model_kernels(model):
    """The float type and head block of the model folder ``model`` (its config.json)."""
    with open(os.path.join(model, "config.json")) as f:
        c = json.load(f)
    ty = {"bfloat16": "bf16", "float16": "f16"}.get(c.get("torch_dtype") or c.get("dtype"))
    if ty is None:
        sys.exit(f"{model}: a sweep needs a bf16 or f16 model")
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    d = next((b for b in HEAD_BLOCKS if b >= hd), None)
    return ty, d


def bench(args, cand_dir, b):
    """One candidate's ``bench latency`` rows (None when it failed, with the reason)."""
    cmd = [args.ferrum, "bench", "latency", "--device", args.device, "--model", args.model,
           "--json", "--no-cuda-graph", "--profile-kernels", "--num-iters", "1",
           "--num-iters-warmup", "1", "--input-len", str(b["input_len"]), "--output-len",
           str(b["output_len"]), "--batch-size", b["batch_size"]]
    if cand_dir:
        cmd += ["--kernels", cand_dir]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.step_timeout)
    if done.returncode != 0:
        return None, done.stderr.strip().splitlines()[-1:] or ["failed"]
    rows = [json.loads(l) for l in done.stdout.splitlines() if l.startswith("{")]
    return rows, None


def run(args):
    with open(os.path.join(args.candidates, "candidates.json")) as f:
        listing = json.load(f)["candidates"]
    with open(os.path.join(args.candidates, "candidates.json")) as f:
        built = json.load(f)
    ty, d = model_kernels(args.model)
    if (ty, d) != (built["ty"], built["head_block"]):
        sys.exit(f"{args.model} runs {ty} kernels of head block {d}; the candidates are "
                 f"{built['ty']}, {built['head_block']}")
    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    best, table = {}, []
    for fi, family in enumerate(FAMILIES):
        # Each family its share of the budget (what one leaves, the next may use).
        deadline = start + args.budget * (fi + 1) / len(FAMILIES)
        names = set(kernel_names(family, ty, d))
        cands = [c for c in listing if c["family"] == family]
        cands.sort(key=lambda c: not c["baseline"])
        results = []
        with open(os.path.join(args.out, f"{family}.jsonl"), "w") as out:
            for c in cands:
                if time.monotonic() > deadline:
                    table.append((family, c["label"], None, None, "not run: budget spent"))
                    continue
                try:
                    b = SMALL_BENCH if args.small else FAMILIES[family]["bench"]
                    rows, why = bench(args, os.path.join(args.candidates, c["dir"]), b)
                except subprocess.TimeoutExpired:
                    rows, why = None, ["timed out"]
                if rows is None:
                    table.append((family, c["label"], None, None, f"failed: {why[0]}"))
                    continue
                total = 0.0
                for r in rows:
                    ms = sum(k["ms_per_step"] for k in r["profile"]["kernels"]
                             if k["name"] in names)
                    total += ms
                    line = {"family": family, "candidate": c["label"], "overrides": c["overrides"],
                            "batch_size": r["batch_size"], "family_ms_per_step": ms,
                            "decode_tok_s": r["decode_tok_s"], "kernels": [
                                k for k in r["profile"]["kernels"] if k["name"] in names]}
                    out.write(json.dumps(line) + "\n")
                results.append((total, c))
                tok = ", ".join(f"{r['decode_tok_s']:.1f}" for r in rows)
                table.append((family, c["label"], total, tok, "baseline" if c["baseline"] else ""))
        base = next((t for t, c in results if c["baseline"]), None)
        if results:
            t, c = min(results, key=lambda x: x[0])
            best[family] = {"kernels": sorted(names), "best": c["label"],
                            "overrides": c["overrides"], "family_ms": t, "baseline_ms": base,
                            "speedup": (base / t) if base and t else None,
                            "candidates_run": len(results)}
    device = subprocess.run([args.ferrum, "--version"], capture_output=True, text=True).stdout
    with open(os.path.join(args.out, "tuning.json"), "w") as f:
        json.dump({"device": args.device, "model": os.path.basename(args.model.rstrip("/")),
                   "ferrum": device.strip(), "families": best}, f, indent=1)
    with open(os.path.join(args.out, "sweep.md"), "w") as f:
        f.write(f"Sweep on {args.device}, {os.path.basename(args.model.rstrip('/'))} ({ty}, "
                f"head block {d}): device ms per step of each family's kernels, summed over "
                "the batch sizes (lower is better), and decode tok/s per batch size.\n\n")
        f.write("| family | candidate | family ms/step | decode tok/s | note |\n")
        f.write("| --- | --- | --- | --- | --- |\n")
        for family, lab, ms, tok, note in table:
            ms_s = "n/a" if ms is None else f"{ms:.4f}"
            f.write(f"| {family} | {lab} | {ms_s} | {tok or 'n/a'} | {note} |\n")
    print(open(os.path.join(args.out, "sweep.md")).read())
    missing = [f for f in FAMILIES if f not in best]
    if missing:
        sys.exit(f"no candidate of {', '.join(missing)} ran")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the candidates (here)")
    b.add_argument("--out", required=True)
    b.add_argument("--arch", default="sm90", choices=["sm80", "sm90", "none"])
    b.add_argument("--quick", action="store_true", help="two candidates per family")
    b.add_argument("--ty", default="bf16", choices=["bf16", "f16"])
    b.add_argument("--head-block", type=int, default=128, choices=HEAD_BLOCKS)
    r = sub.add_parser("run", help="time the candidates through the engine (on the device)")
    r.add_argument("--candidates", required=True)
    r.add_argument("--model", required=True)
    r.add_argument("--ferrum", required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--out", required=True)
    r.add_argument("--budget", type=float, default=240)
    r.add_argument("--step-timeout", type=float, default=90)
    r.add_argument("--small", action="store_true", help="a few tokens per bench")
    a = ap.parse_args()
    build(a) if a.cmd == "build" else run(a)


if __name__ == "__main__":
    main()
