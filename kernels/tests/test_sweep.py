"""A tuning sweep's two ends that run without a GPU: ``build.py``'s candidate overlays (only the
named kernels, with the override's constexprs and warps) and ``specs.py`` taking a sweep's
``tuning.json`` (applied to the kernels it names; a stale file refused, never half applied).
The timing in between runs in ``scripts/test-gpu-round.sh`` on the interpreted device.
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


def tuning_file(families):
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"device": "test", "families": families}, f)
    f.close()
    return f.name


class Sweep(unittest.TestCase):
    def test_an_overlay_holds_the_named_kernels_with_the_override(self):
        with tempfile.TemporaryDirectory() as tmp:
            override = os.path.join(tmp, "o.json")
            with open(override, "w") as f:
                json.dump({"gemm_bf16_decode": {"constexprs": {"BLOCK_N": 64},
                                                "num_warps": 8}}, f)
            out = os.path.join(tmp, "cand")
            subprocess.run([sys.executable, os.path.join(KERNELS, "build.py"), "--only",
                            "gemm_bf16_decode,gemm_bf16_split", "--override", override,
                            "--arch", "none", "--out", out], check=True, capture_output=True)
            with open(os.path.join(out, "manifest.json")) as f:
                m = json.load(f)
            self.assertEqual(m["archs"], [])
            got = {k["name"]: (k["constexprs"]["BLOCK_N"], k["num_warps"]) for k in m["kernels"]}
            self.assertEqual(got, {"gemm_bf16_decode": (64, 8), "gemm_bf16_split": (32, 4)})
            # Refused: an override of a kernel that does not exist, or of a constexpr it lacks,
            # and an overlay written over the embedded kernels.
            for bad, args in (({"gemm_bf16_nope": {}}, ["--out", out]),
                              ({"gemm_bf16_decode": {"constexprs": {"BLOCK_Q": 1}}},
                               ["--out", out]),
                              ({"gemm_bf16_decode": {}}, [])):
                with open(override, "w") as f:
                    json.dump(bad, f)
                done = subprocess.run([sys.executable, os.path.join(KERNELS, "build.py"),
                                       "--only", "gemm_bf16_decode", "--override", override,
                                       "--arch", "none"] + args, capture_output=True, text=True)
                self.assertNotEqual(done.returncode, 0, (bad, args))

    def test_tuning_applies_to_the_named_kernels_only(self):
        choice = {"kernels": ["gemm_bf16_decode"],
                  "overrides": {"constexprs": {"BLOCK_N": 64}, "num_warps": 8,
                                "num_stages": {"sm80": 3, "sm90": 5}}}
        path = tuning_file({"decode_products": choice})
        try:
            tuned = {s["name"]: s for s in specs.all_specs(tuning=path)}
        finally:
            os.unlink(path)
        shipped = {s["name"]: s for s in specs.all_specs(tuning="/nonexistent")}
        d = tuned["gemm_bf16_decode"]
        self.assertEqual((d["constexprs"]["BLOCK_N"], d["num_warps"], d["num_stages"]["sm90"]),
                         (64, 8, 5))
        self.assertEqual(d["constexprs"]["BLOCK_K"],
                         shipped["gemm_bf16_decode"]["constexprs"]["BLOCK_K"])
        self.assertEqual(tuned["gemm_f16_decode"], shipped["gemm_f16_decode"])
        self.assertEqual(len(tuned), len(shipped))

    def test_a_stale_tuning_file_is_refused(self):
        for choice in ({"kernels": ["gemm_bf16_gone"], "overrides": {}},
                       {"kernels": ["gemm_bf16_decode"],
                        "overrides": {"constexprs": {"NO_SUCH": 1}}}):
            path = tuning_file({"decode_products": choice})
            try:
                with self.assertRaises(ValueError):
                    specs.all_specs(tuning=path)
            finally:
                os.unlink(path)


if __name__ == "__main__":
    unittest.main()
