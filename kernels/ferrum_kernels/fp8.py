"""E4M3 (fp8) KV rows: encoding and decoding by integer arithmetic.

A KV cache of ``--kv-cache-dtype fp8`` stores each (slot, KV head) row ``x`` of ``head_dim``
keys or values as bytes ``q = e4m3(x * 448 / amax)`` (``amax`` the row's largest magnitude) and
beside it, in its own buffer ``[num_slots, num_kv_heads]`` f32, the row's scale
``amax / 448``: ``decode(q) * scale`` is the value attention reads. E4M3 (OCP FP8, as
``torch.float8_e4m3fn``): sign, 4 exponent bits of bias 7, 3 mantissa bits, subnormals below
2^-6, largest finite 448, no infinities. Rounding is to nearest, ties to even, so a value's
error is at most 2^-4 of its magnitude (2^-10 of ``amax`` absolute below 2^-6 * amax / 448),
and a row keeps its relative precision across more than four decades below its largest value,
which is why one scale per row suffices where int8 needs groups.

The arithmetic is integer, not the hardware's conversion instructions: the same code runs on
every architecture Ferrum ships (sm_80 has no fp8 conversions) and in the interpreter.
A row with a non-finite value gets a NaN scale, so attention over it is poisoned as over an
f16 cache that overflowed, never silently clipped.
"""

import triton
import triton.language as tl

# Largest finite e4m3 magnitude: a row's largest value is stored as this.
FP8_MAX = tl.constexpr(448.0)


@triton.jit
def e4m3_encode(y):
    """``y`` (f32, scaled so ``|y| <= 448``) as e4m3 bytes (u8), round to nearest even;
    magnitudes past 448, and NaN, saturate to 448 (the scale carries non-finite rows)."""
    a = tl.abs(y)
    a = tl.where(a < 448.0, a, 448.0)
    # Normal range (a >= 2^-6): round the f32 mantissa to 3 bits in the integer domain; the
    # carry moves into the exponent as it should. E4M3's exponent bias is 7, f32's 127.
    bits = a.to(tl.int32, bitcast=True)
    r = bits + 0x7FFFF + ((bits >> 20) & 1)
    normal = (r >> 20) - (120 << 3)
    # Subnormals (a < 2^-6): multiples of 2^-9, rounded to nearest even (a * 512 is exact).
    t = a * 512.0
    f = tl.floor(t)
    frac = t - f
    fi = f.to(tl.int32)
    up = (frac > 0.5) | ((frac == 0.5) & ((fi & 1) == 1))
    sub = fi + up.to(tl.int32)
    code = tl.where(a >= 0.015625, normal, sub)
    sign = tl.where(y < 0.0, 128, 0)
    return (code | sign).to(tl.uint8)


@triton.jit
def e4m3_decode(q):
    """E4M3 bytes (u8) as f32, exactly: the byte's bits placed in an f16 (whose exponent bias
    is 8 more, subnormals included) and scaled by 2^8."""
    b = q.to(tl.int32)
    h = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
    return h.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0


@triton.jit
def store_row_fp8(x, cache_ptr, scale_ptr, dst, scale_at, mask):
    """Stores the row ``x`` (f32, masked lanes 0) as e4m3 bytes at ``cache_ptr + dst`` and its
    scale at ``scale_ptr + scale_at``."""
    finite = tl.abs(x) < float("inf")
    bad = tl.max(tl.where(finite | ~mask, 0, 1), axis=0)
    amax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=0)
    # Correctly rounded divisions (Triton's `/` is approximate on a GPU): the bytes are a
    # function of the row, the same on every device and in the interpreter.
    inv = tl.where(amax > 0.0, tl.math.div_rn(FP8_MAX + tl.zeros_like(amax), amax), 0.0)
    scale = tl.where(bad > 0, float("nan"), tl.math.div_rn(amax, FP8_MAX + tl.zeros_like(amax)))
    tl.store(cache_ptr + dst, e4m3_encode(x * inv), mask=mask)
    tl.store(scale_ptr + scale_at, scale)
