"""benchmarks/plot_serve.py draws saved `bench serve --json` reports: a well-formed SVG with
each report's curves and labels, one report or several, and a clear error for a file that is
not a report."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "plot_serve.py"


def level(concurrency, tok_s, completed=8):
    return {
        "concurrency": concurrency,
        "completed": completed,
        "output_tok_s": tok_s,
        "ttft_ms_p50": 10.0 * concurrency,
        "ttft_ms_p99": 20.0 * concurrency,
        "itl_ms_p50": None if completed == 0 else 5.0 + concurrency,
    }


def report(label, scale):
    return {
        "label": label,
        "model": "tiny",
        "base_url": "http://127.0.0.1:1",
        "num_prompts": 8,
        "input_len": 16,
        "output_len": 4,
        "levels": [level(c, scale * c) for c in (4, 1, 2)] + [level(8, 0.0, completed=0)],
    }


class PlotServe(unittest.TestCase):
    def run_plot(self, reports, names):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for r, name in zip(reports, names):
                p = os.path.join(d, name)
                with open(p, "w") as f:
                    json.dump(r, f)
                paths.append(p)
            out = os.path.join(d, "plot.svg")
            proc = subprocess.run(
                [sys.executable, str(SCRIPT), "--out", out, *paths],
                capture_output=True,
                text=True,
            )
            svg = pathlib.Path(out).read_text() if proc.returncode == 0 else ""
            return proc, svg

    def test_one_report(self):
        proc, svg = self.run_plot([report("ferrum-tiny", 100.0)], ["a.json"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        ET.fromstring(svg)  # well-formed
        for text in [
            "bench serve: tiny",
            "ferrum-tiny output tok/s",
            "ferrum-tiny TTFT p50",
            "ferrum-tiny TTFT p99",
            "ferrum-tiny ITL p50",
            "Output throughput",
            "ms (log scale)",
            "input 16 / output 4 tokens per request, 8 requests per level",
        ]:
            self.assertIn(text, svg)

    def test_several_reports_share_one_chart(self):
        proc, svg = self.run_plot(
            [report("ferrum-tiny", 100.0), report("other", 50.0)], ["a.json", "b.json"]
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        ET.fromstring(svg)
        self.assertIn("ferrum-tiny vs other: tiny", svg)
        self.assertIn("other ITL p50", svg)

    def test_a_real_report(self):
        # Written by `ferrum bench serve --json` against `ferrum serve` on the tiny fixture.
        real = json.loads((pathlib.Path(__file__).parent / "serve-report.json").read_text())
        proc, svg = self.run_plot([real], ["real.json"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        ET.fromstring(svg)
        self.assertIn("ferrum-tiny TTFT p99", svg)
        self.assertIn("bench serve: tests/fixtures/tiny-smollm", svg)

    def test_a_file_that_is_not_a_report_is_refused(self):
        bad = report("x", 1.0)
        del bad["levels"]
        proc, _ = self.run_plot([bad], ["bad.json"])
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("not a bench serve report (no 'levels')", proc.stderr)


if __name__ == "__main__":
    unittest.main()
