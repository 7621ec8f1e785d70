"""Runs a kernel in the Triton interpreter on host memory, without torch.

``launch(fn, grid, args, constexprs)`` executes every program of ``grid`` the way a GPU launch
would: pointer arguments are plain host addresses (``Ptr``), scalars are typed by the kernel's
signature. This is the execution engine of the kernel tests and of the Rust backend's
interpreted device (``worker.py``). It drives the interpreter of the pinned Triton version
directly, because the public launcher (``kernel[grid](...)``) only takes torch tensors.
"""

import inspect
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as _interp  # noqa: E402



# --- Where the pinned interpreter's bf16 arithmetic differs from the hardware's -------------
# It truncates f32 -> bf16 (the GPU rounds to nearest even) and multiplies bf16 dot operands
# as their raw uint16 bit patterns. Both are corrected here, so the interpreter computes what
# the compiled kernel computes on a GPU.


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values):
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    # NaN stays NaN (quiet), whatever rounding did to its payload.
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


_Builder = type(_interp.interpreter_builder)
_orig_cast_impl = _Builder.cast_impl
_orig_fp_to_fp = _Builder.create_fp_to_fp
_orig_dot = _Builder.create_dot


def _cast_impl(self, src, dst_type):
    s, d = src.dtype.scalar, dst_type.scalar
    if s == tl.float32 and d == tl.bfloat16:
        return _interp.TensorHandle(_f32_to_bf16(src.data), d)
    if s == tl.bfloat16 and d == tl.float32:
        return _interp.TensorHandle(_bf16_to_f32(src.data), d)
    return _orig_cast_impl(self, src, dst_type)


def _fp_to_fp(self, src, dst_type, rounding_mode):
    if {src.dtype.scalar, dst_type.scalar} == {tl.float32, tl.bfloat16}:
        return _cast_impl(self, src, dst_type)
    return _orig_fp_to_fp(self, src, dst_type, rounding_mode)


def _dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
        a_data = _bf16_to_f32(a.data) if a.dtype.scalar == tl.bfloat16 else a.data
        b_data = _bf16_to_f32(b.data) if b.dtype.scalar == tl.bfloat16 else b.data
        out = np.matmul(a_data.astype(np.float32), b_data.astype(np.float32), dtype=np.float32)
        return _interp.TensorHandle(out + d.data, d.dtype.scalar)
    return _orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)


# --- Every access checked against the live buffers -----------------------------------------
# On a GPU an access outside its buffer reads garbage or corrupts a neighbour silently; here
# each load and store of a launch (its unmasked lanes) must fall inside a buffer the caller
# registered (``Regions``), so CI catches such a kernel bug as an error naming the kernel.


class OutOfBounds(Exception):
    pass


class Regions:
    """Registered byte ranges ``[start, start + length)``: what a launch may touch."""

    def __init__(self):
        self.starts = np.zeros(0, dtype=np.uint64)
        self.ends = np.zeros(0, dtype=np.uint64)

    def set(self, ranges):
        ranges = sorted((int(a), int(a) + int(n)) for a, n in ranges)
        self.starts = np.array([a for a, _ in ranges], dtype=np.uint64)
        self.ends = np.array([b for _, b in ranges], dtype=np.uint64)

    def check(self, addrs, mask, size, what):
        addrs = addrs[mask] if mask is not None else addrs.ravel()
        if addrs.size == 0:
            return
        i = np.searchsorted(self.starts, addrs, side="right").astype(np.int64) - 1
        ok = (i >= 0) & (addrs + np.uint64(size) <= self.ends[np.maximum(i, 0)])
        if not ok.all():
            bad = int(addrs[~ok][0])
            raise OutOfBounds(f"{what} of {size} bytes at {bad:#x} is outside every buffer")


# The regions of the launch in progress; None runs unchecked.
_regions = None
_orig_masked_load = _Builder.create_masked_load
_orig_masked_store = _Builder.create_masked_store


def _checked_load(self, ptrs, mask, other, cache_policy, is_volatile):
    if _regions is not None:
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        _regions.check(ptrs.data, mask.data.astype(bool), size, "a load")
    return _orig_masked_load(self, ptrs, mask, other, cache_policy, is_volatile)


def _checked_store(self, ptrs, value, mask, cache_policy):
    if _regions is not None:
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        _regions.check(ptrs.data, mask.data.astype(bool), size, "a store")
    return _orig_masked_store(self, ptrs, value, mask, cache_policy)


_Builder.create_masked_load = _checked_load
_Builder.create_masked_store = _checked_store
_Builder.cast_impl = _cast_impl
_Builder.create_fp_trunc = _cast_impl
_Builder.create_fp_ext = _cast_impl
_Builder.create_fp_to_fp = _fp_to_fp
_Builder.create_dot = _dot

# --- triton.language patched once per process ---------------------------------------------
# The interpreter swaps triton.language's builtins for its own at every launch and at every
# nested @jit call, scanning the modules each time (a fifth of a launch's time here), then
# restores them. Every kernel this process runs is interpreted, so the modules are patched the
# first time a kernel sees them and stay patched.

_orig_patch_lang = _interp._patch_lang
_patched_langs = set()


class _NoRestore:
    def restore(self):
        pass


def _patch_lang_once(fn):
    langs = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}
    if not langs <= _patched_langs:
        _orig_patch_lang(fn)
        _patched_langs.update(langs)
    return _NoRestore()


_interp._patch_lang = _patch_lang_once

# The interpreter's numpy dtype of a Triton type, which it rebuilds a table for at every
# call: memoized by the type's name (what a Triton type's equality and hash are).
_orig_np_dtype = _interp._get_np_dtype
_np_dtypes = {}


def _np_dtype_cached(tt_dtype):
    name = tt_dtype.name
    found = _np_dtypes.get(name)
    if found is None:
        found = _np_dtypes[name] = _orig_np_dtype(tt_dtype)
    return found


_interp._get_np_dtype = _np_dtype_cached

_SCALARS = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64,
            "fp32": np.float32}


class Ptr:
    """A typed host address: what a device pointer is on the interpreted device."""

    def __init__(self, addr, ty):
        self.addr = int(addr)
        self.ty = ty  # Triton's name of the element type: "fp32", "bf16", "u32", ...

    def __add__(self, elems):
        return Ptr(self.addr + int(elems) * tl.str_to_ty(self.ty, None).primitive_bitwidth // 8,
                   self.ty)


def arg_value(value, ty):
    """The interpreter's tensor for one argument of Triton type ``ty`` (``*fp32``, ``i32``...)."""
    if ty.startswith("*"):
        if not isinstance(value, Ptr):
            raise TypeError(f"pointer argument of type {ty} got {value!r}")
        pty = tl.pointer_type(tl.str_to_ty(ty[1:], None))
        return tl.tensor(_interp.TensorHandle(np.array([value.addr], dtype=np.uint64), pty), pty)
    sty = tl.str_to_ty(ty, None)
    return tl.tensor(_interp.TensorHandle(np.array([value], dtype=_SCALARS[ty]), sty), sty)


def launch(jit_fn, grid, params, args, constexprs, regions=None):
    """Runs ``jit_fn`` over ``grid`` (up to 3 dims) with ``args`` typed by ``params``
    (``[(name, triton_type)]`` in order) and the ``constexprs`` dict. With ``regions``
    (``Regions``), every load and store must fall inside them (``OutOfBounds`` otherwise)."""
    global _regions
    fn = jit_fn.fn if hasattr(jit_fn, "fn") else jit_fn
    if len(args) != len(params):
        raise TypeError(f"{fn.__name__}: {len(params)} arguments expected, got {len(args)}")
    call = {name: arg_value(v, ty) for (name, ty), v in zip(params, args)}
    call.update({k: tl.constexpr(v) for k, v in constexprs.items()})
    missing = set(inspect.signature(fn).parameters) - set(call)
    if missing:
        raise TypeError(f"{fn.__name__}: no value for {sorted(missing)}")
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    patch_scope = _interp._patch_lang(fn)
    _regions = regions
    try:
        _interp.interpreter_builder.set_grid_dim(*grid)
        for x in range(grid[0]):
            for y in range(grid[1]):
                for z in range(grid[2]):
                    _interp.interpreter_builder.set_grid_idx(x, y, z)
                    fn(**call)
    finally:
        _regions = None
        patch_scope.restore()


def ptr(array, ty=None):
    """The ``Ptr`` of a contiguous numpy array (bf16 arrays are uint16 bit patterns)."""
    if not array.flags["C_CONTIGUOUS"]:
        raise ValueError("arrays passed to kernels must be contiguous")
    if ty is None:
        ty = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16",
              np.dtype(np.uint32): "u32", np.dtype(np.int32): "i32"}[array.dtype]
    return Ptr(array.ctypes.data, ty)
