"""Compiles every kernel specialization ahead of time and writes the manifest.

    python kernels/build.py [--out DIR] [--check]

For each architecture in ``ARCHS`` and each specialization in ``specs.all_specs()``, Triton
compiles the kernel to a cubin (no GPU or driver is needed). The cubins of one architecture
are concatenated into ``<arch>.bin``; ``manifest.json`` gives each kernel's place in it (offset,
length, SHA-256), symbol, parameters in order, constexprs, num_warps, shared memory and scratch
sizes. Both go to ``crates/runtime/kernels/``, which the ``ferrum`` binary embeds and
checks at load. ``--check`` compiles into a temporary folder and fails if anything differs
from what is committed: CI runs it, so the embedded binaries are always what the sources give.
"""

import argparse
import filecmp
import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
# Line tables would double the binaries' size and are of no use to a user.
os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import specs  # noqa: E402

# (name, compute capability): Ampere and Ada (sm_80 runs on sm_86/sm_89), Hopper.
ARCHS = (("sm80", 80), ("sm90", 90))
DEFAULT_OUT = os.path.join(HERE, "..", "crates", "runtime", "kernels")


def compile_spec(spec, arch, cc):
    module = importlib.import_module(f"ferrum_kernels.{spec['module']}")
    fn = getattr(module, spec["function"])
    signature = dict(spec["params"])
    for name in spec["constexprs"]:
        signature[name] = "constexpr"
    src = ASTSource(fn=fn, signature=signature, constexprs=dict(spec["constexprs"]))
    options = {"num_warps": spec["num_warps"]}
    if spec.get("num_stages") is not None:
        options["num_stages"] = spec["num_stages"][arch]
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


def build(out):
    os.makedirs(out, exist_ok=True)
    manifest = {"triton": triton.__version__, "archs": [a for a, _ in ARCHS], "kernels": []}
    blobs = {arch: bytearray() for arch, _ in ARCHS}
    for spec in specs.all_specs():
        entry = {k: spec[k] for k in ("name", "module", "function", "num_warps")}
        entry["params"] = [list(p) for p in spec["params"]]
        entry["constexprs"] = dict(spec["constexprs"])
        entry["binaries"] = {}
        for arch, cc in ARCHS:
            compiled = compile_spec(spec, arch, cc)
            md = compiled.metadata
            cubin = compiled.asm["cubin"]
            blob = blobs[arch]
            # cuModuleLoadData wants an 8-byte-aligned image; keep each at a 64-byte boundary.
            blob.extend(b"\0" * (-len(blob) % 64))
            offset = len(blob)
            blob.extend(cubin)
            entry["binaries"][arch] = {
                "offset": offset,
                "symbol": md.name,
                "num_warps": md.num_warps,
                "num_stages": md.num_stages,
                "shared": md.shared,
                "global_scratch_size": md.global_scratch_size,
                "global_scratch_align": md.global_scratch_align,
                "profile_scratch_size": md.profile_scratch_size,
                "profile_scratch_align": md.profile_scratch_align,
                "sha256": hashlib.sha256(cubin).hexdigest(),
                "bytes": len(cubin),
            }
        manifest["kernels"].append(entry)
    for arch, blob in blobs.items():
        with open(os.path.join(out, f"{arch}.bin"), "wb") as f:
            f.write(blob)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return manifest


def same_tree(a, b):
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.diff_files or cmp.funny_files:
        print(f"differs in {a}: only committed {cmp.left_only}, only built {cmp.right_only}, "
              f"changed {cmp.diff_files}", file=sys.stderr)
        return False
    match, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    if mismatch or errors:
        print(f"differs in {a}: {mismatch + errors}", file=sys.stderr)
        return False
    return all(same_tree(os.path.join(a, d), os.path.join(b, d)) for d in cmp.common_dirs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true",
                    help="fail if the committed binaries differ from what the sources give")
    a = ap.parse_args()
    if a.check:
        with tempfile.TemporaryDirectory() as tmp:
            built = os.path.join(tmp, "kernels")
            build(built)
            if not same_tree(os.path.abspath(a.out), built):
                print("the embedded kernels are stale: run `python kernels/build.py` and commit",
                      file=sys.stderr)
                sys.exit(1)
        print("embedded kernels match their sources")
        return
    m = build(os.path.abspath(a.out))
    total = sum(b["bytes"] for k in m["kernels"] for b in k["binaries"].values())
    print(f"{len(m['kernels'])} kernels x {len(ARCHS)} archs, {total} bytes of cubins")


if __name__ == "__main__":
    main()
