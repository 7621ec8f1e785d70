"""KV write through the slot mapping.

Grid ``(num_tokens, num_kv_heads)``: program ``(t, h)`` copies head ``h`` of token ``t``'s
keys and values (f32, at ``k + t * src_stride + h * head_dim``, likewise ``v``) into slot
``slot_mapping[t]`` of the layer's caches, ``[num_slots, num_kv_heads, head_dim]``, converting
to the cache's element type (f32, f16 or bf16, round to nearest even).
"""

import triton
import triton.language as tl


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
