"""The interpreted device's worker: device memory and kernel launches for the Rust backend,
in this process's host memory and the Triton interpreter.

Run as ``python -m ferrum_kernels.worker`` from ``kernels/`` (the Rust side does). Requests
arrive on stdin as JSON lines, replies leave on stdout the same way (see
``crates/runtime/src/cuda/interpreted.rs``):

* ``alloc {bytes}`` -> ``{ptr}``: a zeroed, 256-byte-aligned buffer; ``free {ptr}``;
* ``write {ptr, bytes}`` + raw bytes; ``read {ptr, bytes}`` -> ``{}`` + raw bytes; both must
  lie inside one live allocation;
* ``load {name, variant, module, function, params, constexprs, hints}`` -> ``{handle}``;
* ``launch {handle, grid, args}``: args in the kernel's parameter order; pointers are
  addresses from ``alloc`` (plus offsets) and must fall inside a live allocation, and so must
  every byte the kernel loads or stores (an out-of-bounds access is an error naming the
  kernel: on a GPU it would corrupt memory silently). The ``hints`` of an aligned variant
  must hold: each named pointer or integer divisible by 16, as its compiled binary assumes
  (a launch that breaks one is an error: on a GPU it would read misaligned vectors);
* ``copy {dst, src, bytes}``: a device-to-device copy, both ranges inside live allocations;
* ``gemm_open`` -> ``{library}``; ``gemm_support {...}`` -> ``{}`` or ``{unsupported}``;
  ``gemm {trans_a, trans_b, m, n, k, a, lda, b, ldb, input, d, ldd, output}``: cuBLASLt's
  matmul ``D = op(A) op(B)`` (alpha 1, beta 0) on column-major operands under its rules:
  each leading dimension at least its stored matrix's rows, addresses aligned to their
  element, every element read or written inside a live allocation; f32 accumulation, the
  output rounded to nearest even when it is half precision.

Streams, events and host buffers live on the Rust side: the worker runs each request in the
order it arrives. Any failure is answered ``{"error": "..."}`` and the worker carries on.

With ``FERRUM_INTERP_PROFILE=PREFIX`` set, the worker keeps ``PREFIX.<pid>`` up to date (at
most once a second, and when its input ends; the Rust side kills it at the end): one line per
kernel and for the cuBLASLt stand-in, with seconds, launches and programs, slowest first. It
shows where a test's time goes in the interpreter.
"""

import bisect
import importlib
import json
import os
import sys
import time
import traceback

import numpy as np

from . import interp

ALIGN = 256


class Memory:
    """Live allocations, by base address."""

    def __init__(self):
        self.buffers = {}  # base -> (numpy uint8 array holding it, length)
        self.bases = []

    def alloc(self, n):
        raw = np.zeros(n + ALIGN, dtype=np.uint8)
        base = raw.ctypes.data
        start = (-base) % ALIGN
        self.buffers[base + start] = (raw, start, n)
        bisect.insort(self.bases, base + start)
        return base + start

    def free(self, ptr):
        if ptr not in self.buffers:
            raise ValueError(f"free of {ptr:#x}, which is not an allocation")
        del self.buffers[ptr]
        self.bases.remove(ptr)

    def view(self, ptr, n):
        """The bytes ``ptr .. ptr + n``, which must lie in one allocation."""
        i = bisect.bisect_right(self.bases, ptr) - 1
        if i >= 0:
            base = self.bases[i]
            raw, start, length = self.buffers[base]
            if ptr + n <= base + length:
                off = start + ptr - base
                return raw[off:off + n]
        raise ValueError(f"{n} bytes at {ptr:#x} are outside every allocation")

    def check_ptr(self, ptr):
        if ptr != 0:
            self.view(ptr, 0)

    def regions(self):
        """The live allocations as ``interp.Regions``."""
        r = interp.Regions()
        r.set((base, length) for base, (_, _, length) in self.buffers.items())
        return r


# cuBLASLt's element types: numpy's dtype for the stored bits, and the size.
LT_TYPES = {"f32": (np.float32, 4), "f16": (np.float16, 2), "bf16": (np.uint16, 2)}


class LtError(ValueError):
    """A product cuBLASLt would refuse (CUBLAS_STATUS_INVALID_VALUE or NOT_SUPPORTED)."""


def lt_shapes(req):
    """The stored (rows, cols, ld) of A, B and D, column-major, as cuBLASLt reads them."""
    m, n, k = req["m"], req["n"], req["k"]
    a = (k, m) if req["trans_a"] else (m, k)
    b = (n, k) if req["trans_b"] else (k, n)
    return (("A", req["a"], req["input"], *a, req["lda"]),
            ("B", req["b"], req["input"], *b, req["ldb"]),
            ("D", req["d"], req["output"], m, n, req["ldd"]))


def lt_check(req):
    """Why cuBLASLt would refuse ``req``, or None."""
    if req["input"] not in ("f16", "bf16"):
        return f"inputs of type {req['input']}"
    if req["output"] not in ("f32", req["input"]):
        return f"{req['output']} output from {req['input']} inputs"
    if min(req["m"], req["n"], req["k"]) < 1:
        return "an empty product"
    for name, ptr, ty, rows, cols, ld in lt_shapes(req):
        if ld < max(1, rows):
            return f"{name}'s leading dimension {ld} is under its {rows} rows"
        if ptr % LT_TYPES[ty][1]:
            return f"{name} at {ptr:#x} is not aligned to its {ty} elements"
    return None


def lt_operand(memory, name, ptr, ty, rows, cols, ld):
    """The column-major ``rows x cols`` matrix at ``ptr`` (leading dimension ``ld``) as a
    writable numpy view of the device memory; every element must lie in one allocation."""
    dtype, size = LT_TYPES[ty]
    count = (cols - 1) * ld + rows
    try:
        raw = memory.view(ptr, count * size)
    except ValueError as e:
        raise LtError(f"{name}: {e}") from None
    flat = raw.view(dtype)
    return np.lib.stride_tricks.as_strided(flat, shape=(rows, cols),
                                           strides=(size, ld * size), writeable=True)


def lt_matmul(memory, req):
    why = lt_check(req)
    if why is not None:
        raise LtError(why)
    (a, b, d) = [lt_operand(memory, *shape) for shape in lt_shapes(req)]

    def f32(x, ty):
        return interp._bf16_to_f32(x) if ty == "bf16" else x.astype(np.float32)

    av, bv = f32(a, req["input"]), f32(b, req["input"])
    if req["trans_a"]:
        av = av.T
    if req["trans_b"]:
        bv = bv.T
    # Summed in f64, then rounded once: a row's result does not depend on how many rows share
    # the product nor on the host's BLAS (an f32 product's blocking changes with the number of
    # rows and the machine, and a graph's padded batch would then differ from a plain step's).
    out = np.matmul(av.astype(np.float64), bv.astype(np.float64)).astype(np.float32)
    if req["output"] == "bf16":
        d[...] = interp._f32_to_bf16(out)
    else:
        d[...] = out.astype(LT_TYPES[req["output"]][0])


class Profile:
    """Seconds, launches and programs per kernel (``FERRUM_INTERP_PROFILE``), or nothing."""

    def __init__(self, prefix):
        self.path = f"{prefix}.{os.getpid()}" if prefix else None
        self.rows = {}  # name -> [seconds, launches, programs]
        self.written = time.monotonic()

    def add(self, name, seconds, programs):
        if self.path:
            row = self.rows.setdefault(name, [0.0, 0, 0])
            row[0] += seconds
            row[1] += 1
            row[2] += programs
            if time.monotonic() - self.written >= 1.0:
                self.write()

    def write(self):
        if not self.path or not self.rows:
            return
        self.written = time.monotonic()
        rows = sorted(self.rows.items(), key=lambda kv: -kv[1][0])
        with open(self.path + ".tmp", "w", encoding="utf-8") as f:
            f.write(f"# worker {os.getpid()}: {sum(r[0] for _, r in rows):.2f} s in kernels\n")
            for name, (secs, launches, programs) in rows:
                f.write(f"{secs:9.3f} s {launches:7d} launches {programs:9d} programs  {name}\n")
        os.replace(self.path + ".tmp", self.path)


def main():
    profile = Profile(os.environ.get("FERRUM_INTERP_PROFILE"))
    try:
        serve(profile)
    finally:
        profile.write()


def serve(profile):
    memory = Memory()
    kernels = []
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer

    def reply(obj, payload=None):
        stdout.write(json.dumps(obj).encode() + b"\n")
        if payload is not None:
            stdout.write(payload)
        stdout.flush()

    while True:
        line = stdin.readline()
        if not line:
            return
        payload = None
        try:
            req = json.loads(line)
            op = req["op"]
            if op == "write":
                payload = stdin.read(req["bytes"])
                if len(payload) != req["bytes"]:
                    return
            if op == "hello":
                reply({})
            elif op == "alloc":
                reply({"ptr": memory.alloc(int(req["bytes"]))})
            elif op == "free":
                memory.free(req["ptr"])
                reply({})
            elif op == "write":
                memory.view(req["ptr"], req["bytes"])[:] = np.frombuffer(payload, np.uint8)
                reply({})
            elif op == "read":
                data = memory.view(req["ptr"], req["bytes"]).tobytes()
                reply({}, data)
            elif op == "copy":
                src = memory.view(req["src"], req["bytes"]).copy()
                memory.view(req["dst"], req["bytes"])[:] = src
                reply({})
            elif op == "gemm_open":
                reply({"library": "cuBLASLt stand-in (numpy, the interpreted device)"})
            elif op == "gemm_support":
                why = lt_check(req)
                reply({} if why is None else {"unsupported": why})
            elif op == "gemm":
                start = time.perf_counter()
                try:
                    lt_matmul(memory, req)
                except LtError as e:
                    reply({"error": f"cuBLASLt product: {e}"})
                    continue
                profile.add("cuBLASLt stand-in", time.perf_counter() - start, 1)
                reply({})
            elif op == "load":
                module = importlib.import_module(f"ferrum_kernels.{req['module']}")
                fn = getattr(module, req["function"])
                params = [tuple(p) for p in req["params"]]
                hints = req.get("hints", [])
                unknown = set(hints) - {p for p, _ in params}
                if unknown:
                    raise ValueError(f"hints {sorted(unknown)} name no parameter")
                name = req["name"]
                if req.get("variant", "generic") != "generic":
                    name = f"{name} ({req['variant']})"
                kernels.append((name, fn, params, req["constexprs"], set(hints)))
                reply({"handle": len(kernels) - 1})
            elif op == "launch":
                name, fn, params, constexprs, hints = kernels[req["handle"]]
                broken = [f"{p} = {v}" for (p, _), v in zip(params, req["args"])
                          if p in hints and int(v) % 16 != 0]
                if broken:
                    reply({"error": f"kernel {name}: hinted arguments not divisible by 16: "
                                    + ", ".join(broken)})
                    continue
                args = []
                for (pname, ty), value in zip(params, req["args"]):
                    if ty.startswith("*"):
                        memory.check_ptr(value)
                        args.append(interp.Ptr(value, ty[1:]))
                    else:
                        args.append(value)
                start = time.perf_counter()
                try:
                    interp.launch(fn, req["grid"], params, args, constexprs, memory.regions())
                except interp.OutOfBounds as e:
                    reply({"error": f"kernel {name}: {e}"})
                    continue
                programs = 1
                for g in req["grid"]:
                    programs *= int(g)
                profile.add(name, time.perf_counter() - start, programs)
                reply({})
            else:
                reply({"error": f"unknown op {op!r}"})
        except MemoryError as e:
            reply({"error": f"out of host memory: {e}"})
        except Exception as e:  # noqa: BLE001 - every failure is answered, the worker lives on
            traceback.print_exc(file=sys.stderr)
            reply({"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
