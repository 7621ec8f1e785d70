#!/usr/bin/env python3
"""Draws `ferrum bench serve --json` reports as one SVG chart: output tok/s, and TTFT p50/p99
and ITL p50 (log scale), against concurrency; one color per report (its `label`).

    python3 benchmarks/plot_serve.py --out serve.svg ferrum.json vllm.json llamacpp.json

Needs matplotlib (pinned in benchmarks/requirements-plot.txt). Text stays text in the SVG, so
the labels can be searched.
"""

import argparse
import json
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LATENCY = [
    ("TTFT p50", "ttft_ms_p50", "-"),
    ("TTFT p99", "ttft_ms_p99", "--"),
    ("ITL p50", "itl_ms_p50", ":"),
]


def distinct(values):
    seen = []
    for v in values:
        if str(v) not in seen:
            seen.append(str(v))
    return seen


def curve(report, metric):
    """(concurrency, value) pairs of a report, by concurrency; levels without the value left out."""
    points = []
    for level in sorted(report["levels"], key=lambda lv: lv["concurrency"]):
        value = metric(level)
        if value is not None:
            points.append((level["concurrency"], value))
    return points


def load(path):
    with open(path) as f:
        report = json.load(f)
    for key in ("label", "model", "input_len", "output_len", "num_prompts", "levels"):
        if key not in report:
            raise SystemExit(f"{path}: not a bench serve report (no '{key}')")
    return report


def plot(reports, out):
    plt.rcParams["svg.fonttype"] = "none"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, (thr, lat) = plt.subplots(1, 2, figsize=(12, 5))
    for i, r in enumerate(reports):
        color = colors[i % len(colors)]
        pts = curve(r, lambda lv: lv["output_tok_s"] if lv["completed"] > 0 else None)
        if pts:
            thr.plot(*zip(*pts), "-o", color=color, label=f"{r['label']} output tok/s")
        for name, key, style in LATENCY:
            pts = curve(r, lambda lv, key=key: lv.get(key))
            if pts:
                lat.plot(*zip(*pts), style, marker="o", color=color, label=f"{r['label']} {name}")
    thr.set(title="Output throughput", xlabel="concurrent requests", ylabel="output tokens/s")
    lat.set(title="Latency", xlabel="concurrent requests", ylabel="ms (log scale)", yscale="log")
    for ax in (thr, lat):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    labels = " vs ".join(distinct(r["label"] for r in reports))
    models = ", ".join(distinct(r["model"] for r in reports))
    title = f"{labels}: {models}" if len(reports) > 1 else f"bench serve: {models}"

    def lens(key):
        return "/".join(distinct(r[key] for r in reports))

    fig.suptitle(
        f"{title}\ninput {lens('input_len')} / output {lens('output_len')} tokens per request, "
        f"{lens('num_prompts')} requests per level"
    )
    fig.tight_layout()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the SVG file to write")
    ap.add_argument("reports", nargs="+", help="bench serve --json reports")
    args = ap.parse_args(argv)
    plot([load(p) for p in args.reports], args.out)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
