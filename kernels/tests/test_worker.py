"""The interpreted device's worker (``ferrum_kernels/worker.py``) over its own protocol: an
aligned variant's hints are checked at each of its launches, so a launcher that took the
aligned binary for arguments that do not qualify fails here as it would misbehave on a GPU.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.dirname(HERE)
sys.path.insert(0, KERNELS)

import specs  # noqa: E402


class Worker:
    def __init__(self, env=None):
        self.p = subprocess.Popen([sys.executable, "-m", "ferrum_kernels.worker"], cwd=KERNELS,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=None if env is None else dict(os.environ, **env))

    def call(self, req):
        self.p.stdin.write(json.dumps(req).encode() + b"\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


class AlignedHints(unittest.TestCase):
    def test_hinted_arguments_off_16_are_refused_and_the_generic_binary_runs(self):
        spec = next(s for s in specs.all_specs() if s["name"] == "add_rows")
        hints = specs.aligned_hints(spec)
        self.assertEqual(hints, ["x_ptr", "y_ptr", "n_cols", "x_stride", "y_stride"])
        w = Worker()
        try:
            load = {"op": "load", "name": spec["name"], "module": spec["module"],
                    "function": spec["function"], "params": spec["params"],
                    "constexprs": spec["constexprs"]}
            generic = w.call(dict(load, variant="generic", hints=[]))["handle"]
            aligned = w.call(dict(load, variant="aligned", hints=hints))["handle"]
            x = w.call({"op": "alloc", "bytes": 4 * 64})["ptr"]
            y = w.call({"op": "alloc", "bytes": 4 * 64})["ptr"]
            ok = {"op": "launch", "grid": [2, 1, 1], "args": [x, y, 32, 32, 32]}
            self.assertEqual(w.call(dict(ok, handle=aligned)), {})
            # x four bytes into its buffer, then a row length of 24.
            for args in ([x + 4, y, 24, 32, 32], [x, y, 24, 32, 32]):
                bad = {"op": "launch", "grid": [1, 1, 1], "args": args}
                reply = w.call(dict(bad, handle=aligned))
                self.assertIn("not divisible by 16", reply.get("error", ""), reply)
                self.assertIn("add_rows (aligned)", reply["error"])
                self.assertEqual(w.call(dict(bad, handle=generic)), {})
            reply = w.call(dict(load, variant="aligned", hints=["no_such"]))
            self.assertIn("no_such", reply.get("error", ""))
        finally:
            w.close()


if __name__ == "__main__":
    unittest.main()


class Profile(unittest.TestCase):
    def test_the_profile_counts_each_kernels_launches_and_programs(self):
        spec = next(s for s in specs.all_specs() if s["name"] == "add_rows")
        with tempfile.TemporaryDirectory() as tmp:
            prefix = os.path.join(tmp, "prof")
            w = Worker(env={"FERRUM_INTERP_PROFILE": prefix})
            try:
                handle = w.call({"op": "load", "name": spec["name"], "module": spec["module"],
                                 "function": spec["function"], "params": spec["params"],
                                 "constexprs": spec["constexprs"], "hints": []})["handle"]
                x = w.call({"op": "alloc", "bytes": 4 * 64})["ptr"]
                y = w.call({"op": "alloc", "bytes": 4 * 64})["ptr"]
                for grid in ([2, 1, 1], [1, 1, 1]):
                    launch = {"op": "launch", "handle": handle, "grid": grid,
                              "args": [x, y, 32, 32, 32]}
                    self.assertEqual(w.call(launch), {})
            finally:
                w.close()
            (name,) = os.listdir(tmp)
            self.assertEqual(name, f"prof.{w.p.pid}")
            lines = open(os.path.join(tmp, name)).read().splitlines()
            self.assertTrue(lines[0].startswith(f"# worker {w.p.pid}:"), lines)
            fields = lines[1].split()
            self.assertEqual(fields[2:7], ["2", "launches", "3", "programs", "add_rows"])
