"""KV write through the slot mapping.

Grid ``(num_tokens, num_kv_heads)``: program ``(t, h)`` copies head ``h`` of token ``t``'s
keys and values (f32, at ``k + t * src_stride + h * head_dim``, likewise ``v``) into slot
``slot_mapping[t]`` of the layer's caches, ``[num_slots, num_kv_heads, head_dim]``, converting
to the cache's element type (f32, f16 or bf16, round to nearest even). The ``_fp8`` entry points
write an fp8 cache: e4m3 bytes and, per (slot, KV head) row, a scale in
``[num_slots, num_kv_heads]`` f32 buffers (``fp8.py``).
"""

import triton
import triton.language as tl

from .fp8 import store_row_fp8


@triton.jit
def _rotated_keys(k_ptr, src, d, mask, pos_ptr, inv_freq_ptr, t, head_dim, rot_half, scale):
    """Head ``src`` of token ``t``'s keys rotated by ``positions[t] * inv_freq`` (the
    rotate-half layout, the first ``2 * rot_half`` elements, times ``scale``; ``rope``'s
    arithmetic)."""
    k = tl.load(k_ptr + src + d, mask=mask, other=0.0)
    first = d < rot_half
    rotated = d < 2 * rot_half
    i = tl.where(first, d, d - rot_half)
    partner = tl.load(k_ptr + src + tl.where(first, d + rot_half, d - rot_half), mask=rotated,
                      other=0.0)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    angle = pos * tl.load(inv_freq_ptr + i, mask=rotated, other=0.0)
    c = tl.cos(angle) * scale
    s = tl.sin(angle) * scale
    return tl.where(first, k * c - partner * s, tl.where(rotated, k * c + partner * s, k))


@triton.jit
def kv_write(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, src_stride, num_kv_heads,
             head_dim, D_BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, D_BLOCK)
    mask = d < head_dim
    slot = tl.load(slot_ptr + t).to(tl.int64)
    src = t * src_stride + h * head_dim + d
    dst = (slot * num_kv_heads + h) * head_dim + d
    k = tl.load(k_ptr + src, mask=mask, other=0.0)
    v = tl.load(v_ptr + src, mask=mask, other=0.0)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope_kv_write(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, pos_ptr, inv_freq_ptr,
                  src_stride, num_kv_heads, head_dim, rot_half, scale, D_BLOCK: tl.constexpr):
    """``rope`` of the keys fused with ``kv_write``: grid ``(num_tokens, num_kv_heads)``;
    program ``(t, h)`` rotates head ``h`` of token ``t``'s keys (``_rotated_keys``) and writes
    it, and the head's values, into slot ``slot_mapping[t]`` of the caches. The keys' buffer is
    left as it was."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, D_BLOCK)
    mask = d < head_dim
    slot = tl.load(slot_ptr + t).to(tl.int64)
    src = t * src_stride + h * head_dim
    dst = (slot * num_kv_heads + h) * head_dim + d
    k = _rotated_keys(k_ptr, src, d, mask, pos_ptr, inv_freq_ptr, t, head_dim, rot_half, scale)
    v = tl.load(v_ptr + src + d, mask=mask, other=0.0)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def kv_write_fp8(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr,
                 src_stride, num_kv_heads, head_dim, D_BLOCK: tl.constexpr):
    """``kv_write`` into an fp8 cache: each row's bytes and scale."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, D_BLOCK)
    mask = d < head_dim
    slot = tl.load(slot_ptr + t).to(tl.int64)
    src = t * src_stride + h * head_dim + d
    row = slot * num_kv_heads + h
    dst = row * head_dim + d
    k = tl.load(k_ptr + src, mask=mask, other=0.0)
    v = tl.load(v_ptr + src, mask=mask, other=0.0)
    store_row_fp8(k, k_cache_ptr, k_scale_ptr, dst, row, mask)
    store_row_fp8(v, v_cache_ptr, v_scale_ptr, dst, row, mask)


@triton.jit
def rope_kv_write_fp8(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                      slot_ptr, pos_ptr, inv_freq_ptr, src_stride, num_kv_heads, head_dim,
                      rot_half, scale, D_BLOCK: tl.constexpr):
    """``rope_kv_write`` into an fp8 cache: the rotated keys' row is scaled as stored."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, D_BLOCK)
    mask = d < head_dim
    slot = tl.load(slot_ptr + t).to(tl.int64)
    src = t * src_stride + h * head_dim
    row = slot * num_kv_heads + h
    dst = row * head_dim + d
    k = _rotated_keys(k_ptr, src, d, mask, pos_ptr, inv_freq_ptr, t, head_dim, rot_half, scale)
    v = tl.load(v_ptr + src + d, mask=mask, other=0.0)
    store_row_fp8(k, k_cache_ptr, k_scale_ptr, dst, row, mask)
    store_row_fp8(v, v_cache_ptr, v_scale_ptr, dst, row, mask)
