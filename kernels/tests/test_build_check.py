"""``build.py --check``, the quick form CI runs, refuses what it must without compiling: a
manifest whose recorded ``sources`` are not today's, a specialization that is not the spec's, a
binary whose bytes fail its SHA-256; and the ``sources`` digest follows every file the binaries
are compiled from, and no other. (The recompilation of one specialization per kernel function,
and ``--full``, run in ``scripts/test-cuda-interpret.sh`` over the committed binaries.)
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import zstandard

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.dirname(HERE)
COMMITTED = os.path.join(KERNELS, "..", "crates", "runtime", "kernels")
sys.path.insert(0, KERNELS)

import build  # noqa: E402


def quick(folder):
    """``check_quick`` of ``folder``: (passed, what it printed to stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        ok = build.check_quick(folder)
    return ok, err.getvalue()


class QuickCheck(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = os.path.join(self.tmp.name, "kernels")
        shutil.copytree(COMMITTED, self.dir)
        with open(os.path.join(self.dir, "manifest.json")) as f:
            self.manifest = json.load(f)

    def tearDown(self):
        self.tmp.cleanup()

    def write_manifest(self):
        with open(os.path.join(self.dir, "manifest.json"), "w") as f:
            json.dump(self.manifest, f, indent=1, sort_keys=True)

    def test_sources_changed_since_the_build_are_refused(self):
        self.manifest["sources"] = "0" * 64
        self.write_manifest()
        ok, err = quick(self.dir)
        self.assertFalse(ok)
        self.assertIn("changed since the binaries were built", err)
        del self.manifest["sources"]
        self.write_manifest()
        self.assertFalse(quick(self.dir)[0])

    def test_a_specialization_other_than_the_spec_is_refused(self):
        k = self.manifest["kernels"][3]
        name = next(iter(k["constexprs"]))
        k["constexprs"][name] += 1
        self.write_manifest()
        ok, err = quick(self.dir)
        self.assertFalse(ok)
        self.assertIn(f"{k['name']} is not the spec's", err)

    def test_a_binary_whose_bytes_fail_its_checksum_is_refused(self):
        k = self.manifest["kernels"][5]
        b = k["aligned"]["binaries"]["sm90"]
        path = os.path.join(self.dir, "sm90.bin.zst")
        blob = bytearray(build.read_blob(path))
        blob[b["offset"] + b["bytes"] // 2] ^= 0x40
        with open(path, "wb") as f:
            f.write(zstandard.ZstdCompressor(level=1).compress(bytes(blob)))
        ok, err = quick(self.dir)
        self.assertFalse(ok)
        self.assertIn(f"{k['name']} sm90 aligned: the blob's bytes fail its SHA-256", err)


class SourcesDigest(unittest.TestCase):
    def test_every_input_changes_it_and_the_interpreter_does_not(self):
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "kernels")
            shutil.copytree(KERNELS, copy, ignore=shutil.ignore_patterns("tests", "__pycache__"))

            def digest():
                return subprocess.run(
                    [sys.executable, "-c", "import build; print(build.sources_digest())"],
                    cwd=copy, check=True, capture_output=True, text=True).stdout.strip()

            first = digest()
            self.assertEqual(first, build.sources_digest())
            for rel in ("ferrum_kernels/worker.py", "ferrum_kernels/interp.py", "NOTES.md"):
                with open(os.path.join(copy, rel), "a") as f:
                    f.write("\n# an edit the binaries do not see\n")
            self.assertEqual(digest(), first)
            seen = {first}
            for rel in ("ferrum_kernels/norm.py", "specs.py", "requirements.txt"):
                with open(os.path.join(copy, rel), "a") as f:
                    f.write("\n# an edit\n")
                seen.add(digest())
            with open(os.path.join(copy, "tuning.json"), "w") as f:
                json.dump({"families": {}}, f)
            seen.add(digest())
            self.assertEqual(len(seen), 5, "each edit gives a digest of its own")


if __name__ == "__main__":
    unittest.main()
