"""Paged attention for chunks of query tokens (prefill), in tiles on the tensor cores.

Grid ``(num_tiles, num_heads)``: program ``(i, h)`` computes head ``h`` of the up to
``BLOCK_M`` query tokens of tile ``i``. ``tiles`` holds three u32 per tile: the first token
``t0``, the token count ``c`` (1 to ``BLOCK_M``), and the sequence's block-table start. A tile's
tokens are consecutive tokens of one sequence at consecutive positions ``positions[t0] ..
positions[t0] + c - 1`` (a chunk of a prompt); token ``t0 + r`` attends to the keys at
positions ``lo_r ..= positions[t0] + r`` of its sequence (causal; ``lo_r = pos - window + 1``
under a sliding window, else 0), read through the block table as ``paged_attention`` reads them
(``[num_slots, num_kv_heads, head_dim]`` caches in f32, f16 or bf16, the chunk's own K/V
written before this runs; or fp8, the ``_fp8`` entry point, with each row's scale beside it:
keys decoded exactly to f16 beside an f16 ``Q`` and their products times the keys' scales,
``P`` times the values' scales rounded to bf16 against the values decoded exactly to bf16).

FlashAttention-2's loop: the query tile stays in registers; key and value tiles of ``BLOCK_N``
positions stream through; ``S = Q K^T`` and ``O += P V`` are ``tl.dot`` products with an online
softmax in f32 (running maximum and sum per row). With a half-precision cache, ``Q`` and ``P``
are rounded to the cache's type for the tensor cores (as FlashAttention computes a half model),
accumulation in f32; with an f32 cache the products are full f32 (no tf32). Query head ``h``
reads KV head ``h // group`` (GQA); scores are ``q . k * scale``, soft-capped as
``cap * tanh(s / cap)`` when ``softcap > 0``.
"""

import triton
import triton.language as tl

from .fp8 import e4m3_decode


@triton.jit
def _prefill_attention(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                       block_tables_ptr, tiles_ptr, pos_ptr, out_ptr, q_stride, out_stride,
                       group, num_kv_heads, head_dim, block_size, window, scale, softcap,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_BLOCK: tl.constexpr,
                       SCALED: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kvh = (h // group).to(tl.int64)
    t0 = tl.load(tiles_ptr + 3 * i).to(tl.int64)
    count = tl.load(tiles_ptr + 3 * i + 1).to(tl.int32)
    bt = block_tables_ptr + tl.load(tiles_ptr + 3 * i + 2).to(tl.int64)
    r = tl.arange(0, BLOCK_M)
    rmask = r < count
    d = tl.arange(0, D_BLOCK)
    dmask = d < head_dim
    p0 = tl.load(pos_ptr + t0).to(tl.int32)
    qpos = p0 + r
    rows = t0 + r.to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * q_stride + h * head_dim + d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    # Rounded to the cache's type (no change for an f32 cache; f16 for fp8's decoded keys).
    if SCALED:
        q = q.to(tl.float16)
    else:
        q = q.to(k_cache_ptr.dtype.element_ty)
    last = p0 + count - 1
    lo = 0
    if window > 0:
        lo = tl.maximum(p0 - window + 1, 0)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_BLOCK], dtype=tl.float32)
    for start in range(lo, last + 1, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)
        kmask = kpos <= last
        page = tl.load(bt + kpos // block_size, mask=kmask, other=0).to(tl.int64)
        row = (page * block_size + kpos % block_size) * num_kv_heads + kvh
        off = row * head_dim
        tile_mask = kmask[:, None] & dmask[None, :]
        k = tl.load(k_cache_ptr + off[:, None] + d[None, :], mask=tile_mask, other=0.0)
        if SCALED:
            ks = tl.load(k_scale_ptr + row, mask=kmask, other=0.0)
            s = tl.dot(q, tl.trans(e4m3_decode(k).to(tl.float16))) * ks[None, :]
        elif k_cache_ptr.dtype.element_ty == tl.float32:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale
        if softcap > 0:
            # cap * tanh(s / cap), tanh(x) = 2 sigmoid(2x) - 1
            s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s / softcap)) - 1.0)
        valid = (kpos[None, :] <= qpos[:, None]) & kmask[None, :]
        if window > 0:
            valid = valid & (kpos[None, :] > qpos[:, None] - window)
        s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row with no valid key yet keeps a maximum of -inf: subtract 0 instead (no NaN).
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        v = tl.load(v_cache_ptr + off[:, None] + d[None, :], mask=tile_mask, other=0.0)
        if SCALED:
            vs = tl.load(v_scale_ptr + row, mask=kmask, other=0.0)
            pv = tl.dot((p * vs[None, :]).to(tl.bfloat16), e4m3_decode(v).to(tl.bfloat16))
            acc = acc * alpha[:, None] + pv
        elif v_cache_ptr.dtype.element_ty == tl.float32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v_cache_ptr.dtype.element_ty), v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    # Rows past the tile's count (never stored) may have no key under a window.
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + rows[:, None] * out_stride + h * head_dim + d[None, :], out,
             mask=rmask[:, None] & dmask[None, :])


@triton.jit
def prefill_attention(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, tiles_ptr, pos_ptr,
                      out_ptr, q_stride, out_stride, group, num_kv_heads, head_dim, block_size,
                      window, scale, softcap, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      D_BLOCK: tl.constexpr):
    _prefill_attention(q_ptr, k_cache_ptr, v_cache_ptr, k_cache_ptr, v_cache_ptr,
                       block_tables_ptr, tiles_ptr, pos_ptr, out_ptr, q_stride, out_stride,
                       group, num_kv_heads, head_dim, block_size, window, scale, softcap,
                       BLOCK_M, BLOCK_N, D_BLOCK, False)


@triton.jit
def prefill_attention_fp8(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                          block_tables_ptr, tiles_ptr, pos_ptr, out_ptr, q_stride, out_stride,
                          group, num_kv_heads, head_dim, block_size, window, scale, softcap,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_BLOCK: tl.constexpr):
    """``prefill_attention`` over an fp8 cache (its rows' scales beside it)."""
    _prefill_attention(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                       block_tables_ptr, tiles_ptr, pos_ptr, out_ptr, q_stride, out_stride,
                       group, num_kv_heads, head_dim, block_size, window, scale, softcap,
                       BLOCK_M, BLOCK_N, D_BLOCK, True)
