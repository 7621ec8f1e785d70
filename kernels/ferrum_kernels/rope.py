"""Rotary position embedding, in place, in the rotate-half (GPT-NeoX / Hugging Face) layout.

Grid ``(num_tokens, num_heads)``: program ``(t, h)`` rotates the head at
``x + t * row_stride + h * head_dim`` by the angles ``positions[t] * inv_freq[i]`` (f32, as the
CPU path and transformers compute them): element ``i < rot_half`` pairs with ``i + rot_half``.
Elements from ``2 * rot_half`` to ``head_dim`` are left alone (partial rotary). The rotated
elements are multiplied by ``scale`` (LongRoPE's attention factor; 1 otherwise). q and k heads
that sit side by side in one fused row are rotated by one launch.
"""

import triton
import triton.language as tl


@triton.jit
def rope(x_ptr, pos_ptr, inv_freq_ptr, row_stride, head_dim, rot_half, scale,
         HALF_BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    base = x_ptr + t * row_stride + h * head_dim
    i = tl.arange(0, HALF_BLOCK)
    mask = i < rot_half
    pos = tl.load(pos_ptr + t).to(tl.float32)
    angle = pos * tl.load(inv_freq_ptr + i, mask=mask, other=0.0)
    c = tl.cos(angle) * scale
    s = tl.sin(angle) * scale
    x1 = tl.load(base + i, mask=mask, other=0.0)
    x2 = tl.load(base + rot_half + i, mask=mask, other=0.0)
    tl.store(base + i, x1 * c - x2 * s, mask=mask)
    tl.store(base + rot_half + i, x2 * c + x1 * s, mask=mask)
