"""Compiles every kernel specialization ahead of time and writes the manifest.

    python kernels/build.py [--out DIR] [--check]

For each architecture in ``ARCHS`` and each specialization in ``specs.all_specs()``, Triton
compiles the kernel to two cubins (no GPU or driver is needed): the generic one, and the
aligned one that assumes the parameters of ``specs.aligned_hints`` divisible by 16 (the
manifest lists them under ``aligned``; the launcher takes it only when every one qualifies).
The cubins of one architecture are concatenated into one blob, written zstd-compressed as
``<arch>.bin.zst`` (the binary embeds it compressed and decompresses it once when a GPU of that
architecture loads its kernels);
``manifest.json`` gives each blob's length and each kernel's place in it (offset, length,
SHA-256), symbol, parameters in order, constexprs, num_warps, shared memory and scratch sizes.
Both go to ``crates/runtime/kernels/``, which the ``ferrum`` binary embeds and checks at load.
The manifest also records ``sources``, a SHA-256 of everything the binaries are compiled from
(the kernel modules, ``specs.py``, the tuning file, the pinned Triton, the compile and layout
code of this file, the architectures and variants, the compiler's settings).

``--check`` (CI runs it) fails unless the committed binaries are what the sources give: the
recorded ``sources`` must be today's (any edit of a kernel, a spec or the pin asks for a
rebuild), the manifest's specializations those of ``specs.py``, every binary's SHA-256 must
hold over its bytes in the decompressed blob, and one specialization of each kernel function,
for every architecture and variant, is compiled again and must give the committed bytes and
figures (about a sixth of the compilations: minutes saved on every CI run). ``--check --full``
compiles everything into a temporary folder and fails if the manifest or any decompressed blob
differs from what is committed (the compressed bytes may differ with the compressor's version;
their content may not).

A tuning candidate is an overlay: ``--only NAMES --override FILE --out DIR`` compiles only the
named kernels, with the constexprs, ``num_warps`` and ``num_stages`` of the override file
(``{name: {"constexprs": {...}, "num_warps": n, "num_stages": {arch: n}}}``), for the
architectures of ``--arch`` (none: a manifest of specs only, for the interpreted device). The
engine runs it with ``--kernels DIR``: those kernels from the folder, the rest embedded
(``kernels/sweep.py`` builds and times such candidates).
"""

import argparse
import filecmp
import glob
import hashlib
import importlib
import inspect
import json
import multiprocessing
import os
import sys
import tempfile

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
# Line tables would double the binaries' size and are of no use to a user.
os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import triton  # noqa: E402
import zstandard  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import specs  # noqa: E402

# (name, compute capability): Ampere and Ada (sm_80 runs on sm_86/sm_89), Hopper.
ARCHS = (("sm80", 80), ("sm90", 90))
DEFAULT_OUT = os.path.join(HERE, "..", "crates", "runtime", "kernels")
# Level 19 takes the blobs to about a seventh of their size; the frame carries its length and a
# checksum, which the loader checks.
ZSTD_LEVEL = 19


# The two binaries of every kernel: generic (no assumption on its arguments) and aligned
# (``specs.aligned_hints``: divisibility by 16 of the hinted parameters, as the JIT infers).
VARIANTS = ("generic", "aligned")


def compile_spec(spec, arch, cc, variant="generic"):
    module = importlib.import_module(f"ferrum_kernels.{spec['module']}")
    fn = getattr(module, spec["function"])
    signature = dict(spec["params"])
    for name in spec["constexprs"]:
        signature[name] = "constexpr"
    attrs = {}
    if variant == "aligned":
        attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]]
                 for name in specs.aligned_hints(spec)}
    src = ASTSource(fn=fn, signature=signature, constexprs=dict(spec["constexprs"]), attrs=attrs)
    options = {"num_warps": spec["num_warps"]}
    if spec.get("num_stages") is not None:
        options["num_stages"] = spec["num_stages"][arch]
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


# What the binaries are compiled from, beside the compile and layout code below: the specs, the
# tuning file they read, the Triton pin, and every kernel module but the interpreter's own.
DIGEST_FILES = ("specs.py", "tuning.json", "requirements.txt")
INTERPRETER_ONLY = ("interp.py", "worker.py")
# The compiler settings this file sets in the environment.
DIGEST_ENV = ("TRITON_DEFAULT_FP_FUSION", "TRITON_DISABLE_LINE_INFO")


def sources_digest():
    """SHA-256 (hex) of everything the binaries depend on: an edit of any of it changes it."""
    h = hashlib.sha256()

    def put(label, data):
        h.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    put("triton", triton.__version__.encode())
    put("targets", repr((ARCHS, VARIANTS)).encode())
    put("env", repr([(k, os.environ.get(k)) for k in DIGEST_ENV]).encode())
    for fn in (compile_spec, build):
        put(fn.__name__, inspect.getsource(fn).encode())
    modules = sorted(p for p in glob.glob(os.path.join(HERE, "ferrum_kernels", "*.py"))
                     if os.path.basename(p) not in INTERPRETER_ONLY)
    for path in [os.path.join(HERE, f) for f in DIGEST_FILES] + modules:
        rel = os.path.relpath(path, HERE).replace(os.sep, "/")
        try:
            with open(path, "rb") as f:
                put(rel, f.read())
        except FileNotFoundError:
            put(rel + " (absent)", b"")
    return h.hexdigest()


# A tuning candidate's changes to the specs ({name: {"constexprs", "num_warps", "num_stages"}}),
# set by main before the workers fork.
OVERRIDES = {}


def current_specs():
    """``specs.all_specs()`` with ``OVERRIDES`` applied."""
    out = specs.all_specs()
    for spec in out:
        o = OVERRIDES.get(spec["name"])
        if o:
            spec["constexprs"] = dict(spec["constexprs"], **o.get("constexprs", {}))
            spec["num_warps"] = o.get("num_warps", spec["num_warps"])
            spec["num_stages"] = o.get("num_stages", spec["num_stages"])
    return out


def compile_job(job):
    """One (spec, arch, variant) compilation, in a worker: the cubin and the compiler's
    figures."""
    i, arch, cc, variant = job
    spec = current_specs()[i]
    compiled = compile_spec(spec, arch, cc, variant)
    md = compiled.metadata
    figures = {k: getattr(md, k) for k in (
        "num_warps", "num_stages", "shared", "global_scratch_size", "global_scratch_align",
        "profile_scratch_size", "profile_scratch_align")}
    figures["symbol"] = md.name
    return compiled.asm["cubin"], figures


def compile_all(jobs):
    """``{(i, arch, variant): (cubin, figures)}`` of ``compile_job`` over ``jobs``. Each
    compilation is independent and single-threaded (Triton, then ptxas): one worker per core."""
    workers = int(os.environ.get("FERRUM_BUILD_JOBS", os.cpu_count() or 1))
    if workers > 1 and len(jobs) > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(compile_job, jobs, chunksize=1)
    else:
        results = [compile_job(j) for j in jobs]
    return dict(zip(((i, arch, v) for i, arch, _, v in jobs), results))


def spec_fields(spec):
    """The fields of a kernel's manifest entry that come from its spec alone (``build`` adds the
    binaries' figures)."""
    entry = {k: spec[k] for k in ("name", "module", "function", "num_warps")}
    entry["params"] = [list(p) for p in spec["params"]]
    entry["constexprs"] = dict(spec["constexprs"])
    entry["aligned"] = {"hints": specs.aligned_hints(spec)}
    return entry


def build(out, compress=True, archs=ARCHS, only=None):
    """Compiles every spec (or those named in ``only``) for ``archs`` into ``out``."""
    os.makedirs(out, exist_ok=True)
    manifest = {"triton": triton.__version__, "archs": [a for a, _ in archs], "kernels": [],
                "dispatch": specs.dispatch(), "sources": sources_digest()}
    if OVERRIDES:
        manifest["overrides"] = OVERRIDES
    blobs = {arch: bytearray() for arch, _ in archs}
    all_specs = current_specs()
    chosen = [i for i, s in enumerate(all_specs) if only is None or s["name"] in only]
    jobs = [(i, arch, cc, v) for i in chosen for arch, cc in archs for v in VARIANTS]
    compiled = compile_all(jobs)

    def place(i, arch, variant):
        cubin, figures = compiled[(i, arch, variant)]
        blob = blobs[arch]
        # cuModuleLoadData wants an 8-byte-aligned image; keep each at a 64-byte boundary.
        blob.extend(b"\0" * (-len(blob) % 64))
        offset = len(blob)
        blob.extend(cubin)
        return dict(figures, offset=offset, sha256=hashlib.sha256(cubin).hexdigest(),
                    bytes=len(cubin))

    for i in chosen:
        entry = spec_fields(all_specs[i])
        entry["binaries"] = {arch: place(i, arch, "generic") for arch, _ in archs}
        entry["aligned"]["binaries"] = {arch: place(i, arch, "aligned") for arch, _ in archs}
        manifest["kernels"].append(entry)
    manifest["blobs"] = {arch: {"bytes": len(blob)} for arch, blob in blobs.items()}
    zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, write_content_size=True)
    # A check compares the blobs themselves: compressing them (about 10 s) would be wasted.
    for arch, blob in blobs.items() if compress else ():
        with open(os.path.join(out, f"{arch}.bin.zst"), "wb") as f:
            f.write(zstd.compress(bytes(blob)))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return manifest, blobs


def read_blob(path):
    with open(path, "rb") as f:
        return zstandard.ZstdDecompressor().decompress(f.read())


def same_build(committed, built, blobs):
    """Whether the committed folder holds the built manifest and, decompressed, the built blobs,
    and nothing else."""
    names = sorted(os.listdir(committed))
    want = sorted(["manifest.json"] + [f"{arch}.bin.zst" for arch in blobs])
    if names != want:
        print(f"{committed} holds {names}, the build writes {want}", file=sys.stderr)
        return False
    if not filecmp.cmp(os.path.join(committed, "manifest.json"),
                       os.path.join(built, "manifest.json"), shallow=False):
        print(f"{committed}/manifest.json differs from the build's", file=sys.stderr)
        return False
    for arch, blob in blobs.items():
        try:
            same = read_blob(os.path.join(committed, f"{arch}.bin.zst")) == bytes(blob)
        except zstandard.ZstdError as e:
            print(f"{committed}/{arch}.bin.zst does not decompress: {e}", file=sys.stderr)
            return False
        if not same:
            print(f"{committed}/{arch}.bin.zst holds other cubins than the build's", file=sys.stderr)
            return False
    return True


def check_quick(committed_dir):
    """The check CI runs (see the module's doc); prints what differs and returns False on any
    difference."""
    problems = []
    with open(os.path.join(committed_dir, "manifest.json")) as f:
        committed = json.load(f)
    if committed.get("sources") != sources_digest():
        print("the kernel sources, specs, tuning file or Triton pin changed since the binaries "
              "were built (manifest.json's `sources`)", file=sys.stderr)
        return False
    top = {"triton": triton.__version__, "archs": [a for a, _ in ARCHS],
           "dispatch": specs.dispatch(), "overrides": None}
    problems += [f"manifest.json: {k} is {committed.get(k)!r}, the build writes {v!r}"
                 for k, v in top.items() if committed.get(k) != v]
    all_specs = current_specs()
    entries = committed.get("kernels", [])
    if [e.get("name") for e in entries] != [s["name"] for s in all_specs]:
        problems.append("manifest.json lists other specializations than specs.py")
    for spec, e in zip(all_specs, entries):
        want = spec_fields(spec)
        got = {k: e.get(k) for k in want}
        got["aligned"] = {"hints": e.get("aligned", {}).get("hints")}
        if got != want:
            problems.append(f"manifest.json: {spec['name']} is not the spec's")
    names = sorted(os.listdir(committed_dir))
    want_names = sorted(["manifest.json"] + [f"{a}.bin.zst" for a, _ in ARCHS])
    if names != want_names:
        problems.append(f"{committed_dir} holds {names}, the build writes {want_names}")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return False
    blobs = {}
    for arch, _ in ARCHS:
        try:
            blobs[arch] = read_blob(os.path.join(committed_dir, f"{arch}.bin.zst"))
        except zstandard.ZstdError as e:
            print(f"{committed_dir}/{arch}.bin.zst does not decompress: {e}", file=sys.stderr)
            return False
        if len(blobs[arch]) != committed["blobs"][arch]["bytes"]:
            problems.append(f"{arch}.bin.zst: {len(blobs[arch])} bytes, the manifest says "
                            f"{committed['blobs'][arch]['bytes']}")

    def recorded(e, arch, variant):
        return (e["binaries"] if variant == "generic" else e["aligned"]["binaries"])[arch]

    # Every binary's checksum over its bytes.
    for e in entries:
        for arch, _ in ARCHS:
            for v in VARIANTS:
                b = recorded(e, arch, v)
                cubin = blobs[arch][b["offset"]:b["offset"] + b["bytes"]]
                if len(cubin) != b["bytes"] or hashlib.sha256(cubin).hexdigest() != b["sha256"]:
                    problems.append(f"{e['name']} {arch} {v}: the blob's bytes fail its SHA-256")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return False
    # One specialization of each kernel function, compiled again.
    firsts = {}
    for i, spec in enumerate(all_specs):
        firsts.setdefault((spec["module"], spec["function"]), i)
    jobs = [(i, arch, cc, v) for i in firsts.values() for arch, cc in ARCHS for v in VARIANTS]
    for (i, arch, v), (cubin, figures) in compile_all(jobs).items():
        b = recorded(entries[i], arch, v)
        want = dict(figures, sha256=hashlib.sha256(cubin).hexdigest(), bytes=len(cubin))
        differ = sorted(k for k in want if b.get(k) != want[k])
        if differ:
            problems.append(f"{entries[i]['name']} {arch} {v}: the build gives other "
                            f"{', '.join(differ)}")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return False
    n = len(entries) * len(ARCHS) * len(VARIANTS)
    print(f"embedded kernels: sources as built, {n} binaries' checksums hold, {len(jobs)} "
          f"binaries (one specialization of each of {len(firsts)} kernel functions, every "
          f"architecture and variant) compiled again bit for bit; --full compiles all")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true",
                    help="fail if the committed binaries differ from what the sources give")
    ap.add_argument("--full", action="store_true",
                    help="with --check: compile every binary again, not one per kernel function")
    ap.add_argument("--only", help="comma-separated kernel names: an overlay of those only")
    ap.add_argument("--override", help="JSON file of changes to the named kernels' specs")
    ap.add_argument("--arch", action="append", choices=[a for a, _ in ARCHS] + ["none"],
                    help="architectures to compile for (repeatable; none: specs only)")
    a = ap.parse_args()
    if a.check and (a.only or a.override or a.arch):
        ap.error("--check compares the whole build: --only, --override and --arch do not apply")
    if a.full and not a.check:
        ap.error("--full is a kind of --check")
    if a.override:
        with open(a.override) as f:
            OVERRIDES.update(json.load(f))
        names = {s["name"] for s in specs.all_specs()}
        unknown = sorted(set(OVERRIDES) - names)
        if unknown:
            ap.error(f"--override names no kernel: {', '.join(unknown)}")
        # Only the constexprs a kernel has can change (a new one would not reach its source).
        for name, o in OVERRIDES.items():
            spec = next(s for s in specs.all_specs() if s["name"] == name)
            extra = sorted(set(o.get("constexprs", {})) - set(spec["constexprs"]))
            if extra:
                ap.error(f"--override: {name} has no constexpr {', '.join(extra)}")
    archs = ARCHS if not a.arch else tuple(x for x in ARCHS if x[0] in a.arch)
    only = set(a.only.split(",")) if a.only else None
    if only:
        unknown = sorted(only - {s["name"] for s in specs.all_specs()})
        if unknown:
            ap.error(f"--only names no kernel: {', '.join(unknown)}")
    if a.check and not a.full:
        if not check_quick(os.path.abspath(a.out)):
            print("the embedded kernels are stale: run `python kernels/build.py` and commit",
                  file=sys.stderr)
            sys.exit(1)
        return
    if a.check:
        with tempfile.TemporaryDirectory() as tmp:
            built = os.path.join(tmp, "kernels")
            _, blobs = build(built, compress=False)
            if not same_build(os.path.abspath(a.out), built, blobs):
                print("the embedded kernels are stale: run `python kernels/build.py` and commit",
                      file=sys.stderr)
                sys.exit(1)
        print("embedded kernels match their sources")
        return
    out = os.path.abspath(a.out)
    if (only or OVERRIDES or a.arch) and out == os.path.abspath(DEFAULT_OUT):
        ap.error("an overlay or a partial build goes to a folder of its own (--out DIR), "
                 "never over the embedded kernels")
    m, blobs = build(out, archs=archs, only=only)
    total = sum(len(b) for b in blobs.values())
    packed = sum(os.path.getsize(os.path.join(out, f"{arch}.bin.zst")) for arch in blobs)
    print(f"{len(m['kernels'])} kernels x {len(archs)} archs x {len(VARIANTS)} variants, "
          f"{total} bytes of cubins, "
          f"{packed} compressed")


if __name__ == "__main__":
    main()
