"""Runs kernel specializations (from ``specs.py``) on arrays, in the interpreter or on a GPU.

``FERRUM_KERNEL_RUNNER=interp`` (the default) uses numpy arrays and the Triton interpreter
(``ferrum_kernels.interp``, no torch); ``FERRUM_KERNEL_RUNNER=cuda`` uses torch tensors on the
GPU and Triton's JIT, for ``scripts/test-gpu.sh``. Tests see only numpy: ``dev(array, ty)`` puts
a copy on the device, ``host(handle)`` brings it back as f32 (or the integer type).
"""

import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import specs  # noqa: E402

RUNNER = os.environ.get("FERRUM_KERNEL_RUNNER", "interp")
SPECS = {s["name"]: s for s in specs.all_specs()}


def bf16_round(x):
    """Rounds f32 values to bf16 (nearest even), returned as f32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def round_to(x, ty):
    """``x`` rounded to the kernel element type ``ty`` (f32, f16, bf16), as f32."""
    x = np.asarray(x, dtype=np.float32)
    if ty == "f16":
        return x.astype(np.float16).astype(np.float32)
    if ty == "bf16":
        return bf16_round(x)
    return x


def e4m3_values():
    """The 127 non-negative finite e4m3 values, by code (0x00 .. 0x7E), from the format's
    definition: exponent bias 7, 3 mantissa bits, subnormals at exponent 0."""
    c = np.arange(127)
    e, m = c >> 3, (c & 7).astype(np.float64)
    return np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))


def e4m3_encode(y):
    """``y`` as e4m3 codes (u8): the nearest value of the table, ties to the even code,
    magnitudes past 448 (and NaN) saturating; a search, independent of the kernel's bits."""
    vals = e4m3_values()
    y = np.asarray(y, dtype=np.float64)
    a = np.where(np.abs(y) < 448.0, np.abs(y), 448.0)
    hi = np.clip(np.searchsorted(vals, a), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dh, dl = vals[hi] - a, a - vals[lo]
    code = np.where((dh < dl) | ((dh == dl) & (hi % 2 == 0)), hi, lo)
    return (code | np.where(y < 0, 128, 0)).astype(np.uint8)


def e4m3_decode(codes):
    """E4M3 codes as f32 (0x7F and 0xFF, NaN, are never written)."""
    codes = np.asarray(codes, dtype=np.int64)
    v = e4m3_values()[np.minimum(codes & 0x7F, 126)]
    return np.where(codes & 0x80, -v, v).astype(np.float32)


def fp8_rows(x):
    """Rows ``x`` (``[..., head_dim]`` f32) as an fp8 cache stores them: (codes, scales), the
    scale ``amax / 448`` per row, NaN for a row with a non-finite value, 0 for a zero row."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.where(np.isfinite(x), np.abs(x), 0).max(axis=-1).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, np.float32(448.0) / amax, np.float32(0)).astype(np.float32)
    scale = np.where(np.isfinite(x).all(axis=-1), amax / np.float32(448.0), np.nan)
    with np.errstate(invalid="ignore"):
        codes = e4m3_encode((x * inv[..., None]).astype(np.float32))
    return codes, scale.astype(np.float32)


class Handle:
    """A device buffer with its element type (Triton name) and shape."""

    def __init__(self, store, ty, shape):
        self.store, self.ty, self.shape = store, ty, shape


class InterpRunner:
    name = "interpreter"

    def __init__(self):
        from ferrum_kernels import interp
        self.interp = interp
        # Every buffer lives as long as the runner: a launch sees only addresses.
        self.keep = []

    def dev(self, array, ty="fp32"):
        a = np.asarray(array)
        if ty == "bf16":
            store = (bf16_round(a).view(np.uint32) >> 16).astype(np.uint16)
        else:
            store = np.ascontiguousarray(
                a, dtype={"fp32": np.float32, "fp16": np.float16, "u32": np.uint32,
                          "u8": np.uint8, "i32": np.int32, "fp64": np.float64}[ty])
        h = Handle(np.ascontiguousarray(store).copy(), ty, a.shape)
        self.keep.append(h)
        return h

    def host(self, h):
        if h.ty == "bf16":
            return (h.store.astype(np.uint32) << 16).view(np.float32).reshape(h.shape)
        if h.ty in ("u32", "u8", "i32", "fp64"):
            return h.store.copy().reshape(h.shape)
        return h.store.astype(np.float32).reshape(h.shape)

    def ptr(self, h, offset=0):
        return self.interp.Ptr(h.store.ctypes.data, h.ty) + offset

    def launch(self, name, grid, args):
        spec = SPECS[name]
        mod = __import__(f"ferrum_kernels.{spec['module']}", fromlist=[spec["function"]])
        fn = getattr(mod, spec["function"])
        # Every access must fall inside a buffer the test made.
        regions = self.interp.Regions()
        regions.set((h.store.ctypes.data, h.store.nbytes) for h in self.keep)
        self.interp.launch(fn, grid, spec["params"], args, spec["constexprs"], regions)


class CudaRunner:
    name = "cuda"

    def __init__(self):
        import torch
        self.torch = torch
        self.types = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                      "u32": torch.int32, "u8": torch.uint8, "i32": torch.int32,
                      "fp64": torch.float64}

    def dev(self, array, ty="fp32"):
        t = self.torch
        a = np.asarray(array)
        if ty == "u32":
            x = t.from_numpy(a.astype(np.int32)).cuda()
        elif ty == "u8":
            x = t.from_numpy(np.ascontiguousarray(a, dtype=np.uint8)).cuda()
        elif ty == "i32":
            x = t.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).cuda()
        elif ty == "fp64":
            x = t.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).cuda()
        else:
            x = t.from_numpy(a.astype(np.float32)).cuda().to(self.types[ty])
        return Handle(x.contiguous(), ty, a.shape)

    def host(self, h):
        if h.ty == "u32":
            return h.store.cpu().numpy().view(np.uint32).reshape(h.shape)
        if h.ty in ("u8", "i32", "fp64"):
            return h.store.cpu().numpy().reshape(h.shape)
        return h.store.float().cpu().numpy().reshape(h.shape)

    def ptr(self, h, offset=0):
        return h.store.view(-1)[offset:]

    def launch(self, name, grid, args):
        spec = SPECS[name]
        mod = __import__(f"ferrum_kernels.{spec['module']}", fromlist=[spec["function"]])
        fn = getattr(mod, spec["function"])
        kwargs = dict(spec["constexprs"])
        if spec.get("num_stages"):
            major = self.torch.cuda.get_device_capability()[0]
            kwargs["num_stages"] = spec["num_stages"]["sm90" if major >= 9 else "sm80"]
        fn[tuple(grid)](*args, **kwargs, num_warps=spec["num_warps"])
        self.torch.cuda.synchronize()


def runner():
    return CudaRunner() if RUNNER == "cuda" else InterpRunner()


def assert_close(tc, what, got, want, tol):
    """Every element within ``tol`` x max |want|; NaN (an unwritten element) fails."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    tc.assertEqual(got.shape, want.shape, what)
    scale = max(np.abs(want).max(), 1e-30)
    err = np.abs(got - want) / scale
    worst = np.nanargmax(np.where(np.isnan(err), np.inf, err))
    tc.assertFalse(np.isnan(got).any(), f"{what}: NaN (unwritten) at {np.argwhere(np.isnan(got))[:4]}")
    tc.assertLessEqual(err.flat[worst], tol,
                       f"{what}: element {np.unravel_index(worst, got.shape)} is {got.flat[worst]}, "
                       f"reference {want.flat[worst]} (error {err.flat[worst]:.2e} of max |ref|)")


class KernelCase(unittest.TestCase):
    """A test case with the runner (``self.r``), a generator seeded by the test's id, and
    host-side helpers."""

    @classmethod
    def setUpClass(cls):
        cls.r = runner()

    def setUp(self):
        self.rng = np.random.default_rng(abs(hash(self.id())) % (2**32))

    def rand(self, *shape, scale=1.0):
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def nan(self, *shape):
        """A device array of NaN (an output poisoned before its launch)."""
        return self.r.dev(np.full(shape, np.nan, np.float32))
