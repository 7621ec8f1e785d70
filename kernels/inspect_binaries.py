"""Static checks of the shipped kernel binaries: what a GPU-less CI can know about their speed.

    python kernels/inspect_binaries.py [--write [--allow-regression NAME ...]] [--jobs N]

Reads the binaries the ``ferrum`` binary embeds (``crates/runtime/kernels``: the manifest and
the zstd blobs, never a fresh compile) and, for every kernel, architecture (sm_80, sm_90) and
variant (generic, aligned), reads the cubin's resources (``cuobjdump -res-usage``: registers,
stack, local and shared memory) and computes its theoretical occupancy per SM. For the hot
kernels (products, block-format products, attention, norm) it also disassembles the aligned
binary (``nvdisasm``; both tools come from PyPI's ``nvidia-cuda-cuobjdump`` and
``nvidia-cuda-nvdisasm``, pinned in ``kernels/requirements.txt``) and counts its global loads by
width (16-byte vectors, async 16-byte copies into shared memory, TMA copies, and narrower
ones), its spill instructions (``LDL``/``STL``), its tensor-core instructions and whether its
loads are pipelined (async copies with dependency barriers, or TMA).

A hot kernel whose spec asks for pipeline stages must have pipelined loads in its aligned
binary, always. Without ``--write`` the figures must equal those recorded in
``kernels/binaries.json`` (CI runs this after ``build.py --check``): a binary whose figures
moved needs ``--write``, which records them and rewrites the table in ``kernels/NOTES.md``
between its markers. ``--write`` refuses to record a regression of a hot kernel (more spills or
narrow loads, fewer wide ones, pipelining lost, lower occupancy) unless that kernel is named
with ``--allow-regression`` (``all`` names every one): a regression is a decision, stated in
its commit.
"""

import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import zstandard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import specs  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "..", "crates", "runtime", "kernels")
RECORD = os.path.join(HERE, "binaries.json")
NOTES = os.path.join(HERE, "NOTES.md")
BEGIN = "<!-- binaries: written by kernels/inspect_binaries.py --write; do not edit -->"
END = "<!-- binaries: end -->"

# The kernels whose speed the engine's speed is: the products (dense and block-format, decode
# and prefill shapes), attention (decode, split-K, prefill) and the norm.
HOT = re.compile(r"^(gemm_|qgemm_|paged_attention|prefill_attention|rms_norm)")

# Per SM, for theoretical occupancy: 64K registers allocated per warp in units of 256, at most
# 64 warps and 32 blocks; shared memory per SM (A100 164 KiB, H100/H200 228 KiB) with 1 KiB
# reserved per block.
SM_LIMITS = {
    "sm80": {"smem": 164 * 1024, "warps": 64, "blocks": 32, "regs": 65536},
    "sm90": {"smem": 228 * 1024, "warps": 64, "blocks": 32, "regs": 65536},
}
RESERVED_SMEM = 1024

RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
INSTR = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")


def tool(name):
    """``name`` from the venv's NVIDIA wheels, else from the path."""
    for base in {sys.prefix, os.path.dirname(os.path.dirname(sys.executable))}:
        found = sorted(glob.glob(os.path.join(
            base, "lib", "python3*", "site-packages", "nvidia", "cu*", "bin", name)))
        if found:
            return found[-1]
    path = shutil.which(name)
    if path is None:
        sys.exit(f"{name} not found: pip install -r kernels/requirements.txt")
    return path


def load_binaries():
    """Every (kernel, arch, variant) with its cubin, in the manifest's order."""
    with open(os.path.join(KERNELS, "manifest.json")) as f:
        manifest = json.load(f)
    out = []
    for arch in manifest["archs"]:
        with open(os.path.join(KERNELS, f"{arch}.bin.zst"), "rb") as f:
            blob = zstandard.ZstdDecompressor().decompress(f.read())
        for k in manifest["kernels"]:
            variants = [("generic", k["binaries"])]
            if k.get("aligned"):
                variants.append(("aligned", k["aligned"]["binaries"]))
            for variant, binaries in variants:
                b = binaries[arch]
                out.append({
                    "name": k["name"], "arch": arch, "variant": variant,
                    "warps": k["num_warps"], "dynamic_shared": b["shared"],
                    "cubin": blob[b["offset"]:b["offset"] + b["bytes"]],
                })
    return out


def occupancy(arch, regs, warps, shared):
    """Theoretical occupancy: resident warps per SM over the maximum."""
    lim = SM_LIMITS[arch]
    regs_per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256
    by_regs = (lim["regs"] // regs_per_warp) // warps
    by_warps = lim["warps"] // warps
    by_smem = lim["smem"] // (shared + RESERVED_SMEM) if shared else lim["blocks"]
    blocks = min(by_regs, by_warps, by_smem, lim["blocks"])
    return round(blocks * warps / lim["warps"], 3)


def load_width(op):
    """The width in bits of a global load or async copy opcode's access."""
    mods = op.split(".")[1:]
    for bits, names in ((128, {"128"}), (64, {"64"}), (16, {"U16", "S16"}), (8, {"U8", "S8"})):
        if names & set(mods):
            return bits
    return 32


def sass_figures(sass):
    """Counts from a disassembly: wide and narrow global loads, spills, tensor cores,
    pipelining."""
    ops = [m.group(1) for m in map(INSTR.match, sass.splitlines()) if m]
    f = {"ldg128": 0, "ldg_narrow": 0, "cp_async128": 0, "cp_async_narrow": 0, "tma": 0,
         "spill_instrs": 0, "tensor": 0}
    barriers = 0
    for op in ops:
        head = op.split(".")[0]
        if head == "LDG":
            f["ldg128" if load_width(op) == 128 else "ldg_narrow"] += 1
        elif head == "LDGSTS":
            f["cp_async128" if load_width(op) == 128 else "cp_async_narrow"] += 1
        elif head in ("UTMALDG", "UBLKCP"):
            f["tma"] += 1
        elif head in ("LDL", "STL"):
            f["spill_instrs"] += 1
        elif head in ("HMMA", "HGMMA", "IMMA", "QGMMA"):
            f["tensor"] += 1
        elif head in ("LDGDEPBAR", "DEPBAR") or op.startswith("SYNCS."):
            barriers += 1
    f["pipelined"] = bool((f["cp_async128"] + f["cp_async_narrow"] and barriers) or f["tma"])
    return f


def inspect(entry, cuobjdump, nvdisasm):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as tmp:
        tmp.write(entry["cubin"])
        tmp.flush()
        res = subprocess.run([cuobjdump, "-res-usage", tmp.name], check=True,
                             capture_output=True, text=True).stdout
        m = RES.search(res)
        if m is None:
            raise RuntimeError(f"{entry['name']} ({entry['arch']}): no resource usage in {res!r}")
        regs, stack, static_shared, local = map(int, m.groups())
        shared = static_shared + entry["dynamic_shared"]
        fig = {"regs": regs, "stack": stack, "local": local, "shared": shared,
               "occupancy": occupancy(entry["arch"], regs, entry["warps"], shared)}
        if HOT.match(entry["name"]) and entry["variant"] == "aligned":
            sass = subprocess.run([nvdisasm, "-c", "-ndf", tmp.name], check=True,
                                  capture_output=True, text=True).stdout
            fig.update(sass_figures(sass))
    return f"{entry['name']}/{entry['arch']}/{entry['variant']}", fig


def unpipelined(figs):
    """Hot kernels whose spec asks for a software pipeline (``num_stages`` above 1 for the
    architecture) but whose aligned binary's loads are not pipelined: always an error."""
    bad = []
    for spec in specs.all_specs():
        stages = spec.get("num_stages") or {}
        for arch, n in stages.items():
            fig = figs.get(f"{spec['name']}/{arch}/aligned")
            if fig is not None and n > 1 and HOT.match(spec["name"]) and not fig["pipelined"]:
                bad.append(f"{spec['name']} ({arch}, {n} stages)")
    return bad


def regressions(old, new):
    """What got worse in a hot kernel's figures, in words."""
    worse = []
    for key, bad in (("stack", "more spill stack"),
                     ("spill_instrs", "more spill instructions"),
                     ("ldg_narrow", "more narrow loads"),
                     ("cp_async_narrow", "more narrow copies")):
        if new.get(key, 0) > old.get(key, 0):
            worse.append(f"{bad} ({old.get(key, 0)} -> {new[key]})")
    wide = lambda f: f.get("ldg128", 0) + f.get("cp_async128", 0) + f.get("tma", 0)  # noqa: E731
    if "ldg128" in old and wide(new) < wide(old):
        worse.append(f"fewer wide loads ({wide(old)} -> {wide(new)})")
    if old.get("pipelined") and not new.get("pipelined"):
        worse.append("no longer pipelined")
    if new["occupancy"] < old["occupancy"]:
        worse.append(f"occupancy {old['occupancy']} -> {new['occupancy']}")
    return worse


def table(figs):
    """The NOTES.md table: one row per hot kernel, its aligned binary on sm_90 and sm_80, and
    the generic binary's registers and spill stack beside."""
    names = sorted({k.split("/")[0] for k in figs if HOT.match(k)})
    rows = [
        "| kernel | sm90 regs | stack | smem KiB | occ. | 16-B loads | narrow | TMA | pipelined "
        "| tensor | sm80 regs | stack | occ. | generic sm90 regs / stack |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:-:|---:|---:|---:|---:|---:|",
    ]
    for n in names:
        a9, a8, g9 = figs[f"{n}/sm90/aligned"], figs[f"{n}/sm80/aligned"], figs[f"{n}/sm90/generic"]
        rows.append(
            f"| `{n}` | {a9['regs']} | {a9['stack']} | {a9['shared'] / 1024:.1f} "
            f"| {a9['occupancy']:.2f} | {a9['ldg128'] + a9['cp_async128']} "
            f"| {a9['ldg_narrow'] + a9['cp_async_narrow']} | {a9['tma']} "
            f"| {'yes' if a9['pipelined'] else 'no'} | {a9['tensor']} | {a8['regs']} "
            f"| {a8['stack']} | {a8['occupancy']:.2f} | {g9['regs']} / {g9['stack']} |")
    return "\n".join(rows)


def write_notes(text):
    with open(NOTES) as f:
        notes = f.read()
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in notes and END in notes:
        before, rest = notes.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        notes = before + block + after
    else:
        notes = notes.rstrip("\n") + "\n\n" + block + "\n"
    with open(NOTES, "w") as f:
        f.write(notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true",
                    help="record the figures in kernels/binaries.json and the NOTES.md table")
    ap.add_argument("--allow-regression", nargs="*", default=[], metavar="NAME",
                    help="with --write: hot kernels allowed to get worse (all: every one)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    cuobjdump, nvdisasm = tool("cuobjdump"), tool("nvdisasm")
    entries = load_binaries()
    with ThreadPoolExecutor(max(a.jobs, 1)) as pool:
        figs = dict(pool.map(lambda e: inspect(e, cuobjdump, nvdisasm), entries))
    try:
        with open(RECORD) as f:
            recorded = json.load(f)
    except FileNotFoundError:
        recorded = {}
    worse = {}
    for key, new in figs.items():
        old = recorded.get(key)
        if old is not None and HOT.match(key):
            w = regressions(old, new)
            if w:
                worse[key] = w
    for key, w in sorted(worse.items()):
        print(f"regression: {key}: {'; '.join(w)}", file=sys.stderr)
    hot_aligned = [f for k, f in figs.items() if HOT.match(k) and k.endswith("/aligned")]
    spilling = sum(1 for f in hot_aligned if f["stack"] > 0)
    narrow = sum(1 for f in hot_aligned if f["ldg_narrow"] + f["cp_async_narrow"] > 0)
    print(f"{len(figs)} binaries; hot aligned binaries: {len(hot_aligned)}, "
          f"{spilling} with spill stack, {narrow} with narrow global loads")
    flat = unpipelined(figs)
    if flat:
        sys.exit(f"not pipelined though their specs ask for stages: {', '.join(flat)}")
    if a.write:
        allowed = set(a.allow_regression)
        refused = [k for k in worse if "all" not in allowed and k.split("/")[0] not in allowed]
        if refused:
            sys.exit(f"refusing to record {len(refused)} regressions (name them with "
                     f"--allow-regression): {', '.join(sorted(refused))}")
        with open(RECORD, "w") as f:
            json.dump(figs, f, indent=1, sort_keys=True)
            f.write("\n")
        write_notes(table(figs))
        print(f"wrote {os.path.relpath(RECORD)} and the table in {os.path.relpath(NOTES)}")
        return
    stale = sorted(set(figs) ^ set(recorded)) + sorted(
        k for k in figs if k in recorded and figs[k] != recorded[k])
    if worse or stale:
        for k in stale[:20]:
            print(f"changed: {k}", file=sys.stderr)
        sys.exit(f"{len(worse)} hot binaries regressed, {len(stale)} differ from "
                 "kernels/binaries.json: run `python kernels/inspect_binaries.py --write` "
                 "(it refuses regressions unless named) and commit")
    with open(NOTES) as f:
        if f"{BEGIN}\n{table(figs)}\n{END}" not in f.read():
            sys.exit("the table in kernels/NOTES.md is stale: run "
                     "`python kernels/inspect_binaries.py --write`")
    print("the shipped binaries match kernels/binaries.json")


if __name__ == "__main__":
    main()
