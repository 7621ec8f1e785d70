"""Paged attention over block tables, for any mix of prefill chunks and decodes.

Grid ``(n, num_heads)``: program ``(i, h)`` computes the attention output of query token
``t = tokens[i]``, head ``h`` (the batch's decode tokens when prompt chunks in the same batch
take ``prefill_attention``; every token otherwise). The token sits at position ``positions[t]`` of its sequence, whose
block table starts at ``block_tables[bt_start[t]]``; it attends to the keys at positions
``lo ..= positions[t]`` of the same sequence (causal), with ``lo = positions[t] - window + 1``
under a sliding window (``window > 0``) and 0 otherwise. Keys of position ``p`` live in slot
``block_tables[bt_start[t] + p // block_size] * block_size + p % block_size`` of the caches,
``[num_slots, num_kv_heads, head_dim]`` in f32, f16 or bf16. The KV of the batch's own tokens
is written before this runs, so prior context and the chunk itself are read the same way.

Query head ``h`` reads KV head ``h // group`` (GQA). Scores are ``q . k * scale``, soft-capped
as ``cap * tanh(s / cap)`` when ``softcap > 0``; the softmax is the online (flash) form in
f32, over tiles of ``BLOCK_N`` keys.
"""

import triton
import triton.language as tl


@triton.jit
def _attend_keys(q, k_cache_ptr, v_cache_ptr, bt, kvh, first, end, num_kv_heads, head_dim,
                 block_size, scale, softcap, BLOCK_N: tl.constexpr, D_BLOCK: tl.constexpr):
    """The online softmax of ``q`` over the keys at positions ``first .. end`` of the block
    table ``bt``: ``(max, sum, acc)``, unnormalized (``acc / sum`` is the output)."""
    d = tl.arange(0, D_BLOCK)
    dmask = d < head_dim
    m_i = tl.full([], -float("inf"), tl.float32)
    l_i = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([D_BLOCK], dtype=tl.float32)
    for start in range(first, end, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)
        kmask = kpos < end
        page = tl.load(bt + kpos // block_size, mask=kmask, other=0).to(tl.int64)
        slot = page * block_size + (kpos % block_size)
        off = (slot * num_kv_heads + kvh) * head_dim
        tile_mask = kmask[:, None] & dmask[None, :]
        k = tl.load(k_cache_ptr + off[:, None] + d[None, :], mask=tile_mask, other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale
        if softcap > 0:
            # cap * tanh(s / cap), tanh(x) = 2 sigmoid(2x) - 1
            s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s / softcap)) - 1.0)
        s = tl.where(kmask, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_cache_ptr + off[:, None] + d[None, :], mask=tile_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def paged_attention(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, bt_start_ptr, pos_ptr,
                    tok_ptr, out_ptr, q_stride, out_stride, group, num_kv_heads, head_dim,
                    block_size, window, scale, softcap, BLOCK_N: tl.constexpr,
                    D_BLOCK: tl.constexpr):
    t = tl.load(tok_ptr + tl.program_id(0)).to(tl.int64)
    h = tl.program_id(1)
    kvh = (h // group).to(tl.int64)
    d = tl.arange(0, D_BLOCK)
    dmask = d < head_dim
    q = tl.load(q_ptr + t * q_stride + h * head_dim + d, mask=dmask, other=0.0)
    pos = tl.load(pos_ptr + t).to(tl.int32)
    bt = block_tables_ptr + tl.load(bt_start_ptr + t).to(tl.int64)
    lo = 0
    if window > 0:
        lo = tl.maximum(pos - window + 1, 0)
    m_i, l_i, acc = _attend_keys(q, k_cache_ptr, v_cache_ptr, bt, kvh, lo, pos + 1,
                                 num_kv_heads, head_dim, block_size, scale, softcap, BLOCK_N,
                                 D_BLOCK)
    tl.store(out_ptr + t * out_stride + h * head_dim + d, acc / l_i, mask=dmask)


@triton.jit
def paged_attention_split(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, bt_start_ptr,
                          pos_ptr, tok_ptr, out_ptr, part_ptr, q_stride, out_stride, group,
                          num_kv_heads, head_dim, block_size, window, scale, softcap,
                          split_keys, max_ranges, max_splits, BLOCK_N: tl.constexpr,
                          D_BLOCK: tl.constexpr):
    """Split-K decode attention (flash-decoding). Grid ``(n, num_heads, max_splits)``: a token
    whose context (``lo ..= pos``) holds ``ctx`` keys is cut into ``splits = min(cdiv(ctx,
    split_keys), max_ranges)`` ranges of ``cdiv(ctx, splits)`` keys (the last may be shorter
    or empty), program ``(i, h, s)`` taking range ``s`` (programs past a token's ranges do
    nothing). With one range the program writes the output, computed exactly as
    ``paged_attention`` does; with more, each writes its partial ``(acc[D_BLOCK], max, sum)``
    to ``part[((i * num_heads + h) * max_splits + s) * (D_BLOCK + 2)]`` and
    ``attention_combine`` merges them. A token's result depends on its own context only, never
    on the batch."""
    i = tl.program_id(0)
    t = tl.load(tok_ptr + i).to(tl.int64)
    h = tl.program_id(1)
    s = tl.program_id(2)
    kvh = (h // group).to(tl.int64)
    d = tl.arange(0, D_BLOCK)
    dmask = d < head_dim
    pos = tl.load(pos_ptr + t).to(tl.int32)
    lo = 0
    if window > 0:
        lo = tl.maximum(pos - window + 1, 0)
    splits = tl.minimum(tl.cdiv(pos + 1 - lo, split_keys), max_ranges)
    if s < splits:
        q = tl.load(q_ptr + t * q_stride + h * head_dim + d, mask=dmask, other=0.0)
        bt = block_tables_ptr + tl.load(bt_start_ptr + t).to(tl.int64)
        per = tl.cdiv(pos + 1 - lo, splits)
        first = lo + s * per
        end = tl.minimum(first + per, pos + 1)
        m_i, l_i, acc = _attend_keys(q, k_cache_ptr, v_cache_ptr, bt, kvh, first, end,
                                     num_kv_heads, head_dim, block_size, scale, softcap,
                                     BLOCK_N, D_BLOCK)
        if splits == 1:
            tl.store(out_ptr + t * out_stride + h * head_dim + d, acc / l_i, mask=dmask)
        else:
            nh = tl.num_programs(1)
            part = part_ptr + ((i.to(tl.int64) * nh + h) * max_splits + s) * (D_BLOCK + 2)
            tl.store(part + d, acc)
            tl.store(part + D_BLOCK, m_i)
            tl.store(part + D_BLOCK + 1, l_i)


@triton.jit
def attention_combine(part_ptr, pos_ptr, tok_ptr, out_ptr, out_stride, head_dim, window,
                      split_keys, max_ranges, max_splits, D_BLOCK: tl.constexpr):
    """Grid ``(n, num_heads)``: merges the partials ``paged_attention_split`` wrote for a token
    of more than one range (in range order, rescaled to the running maximum), and writes its
    output; tokens of one range were written already."""
    i = tl.program_id(0)
    t = tl.load(tok_ptr + i).to(tl.int64)
    h = tl.program_id(1)
    nh = tl.num_programs(1)
    d = tl.arange(0, D_BLOCK)
    pos = tl.load(pos_ptr + t).to(tl.int32)
    lo = 0
    if window > 0:
        lo = tl.maximum(pos - window + 1, 0)
    splits = tl.minimum(tl.cdiv(pos + 1 - lo, split_keys), max_ranges)
    if splits > 1:
        base = part_ptr + (i.to(tl.int64) * nh + h) * max_splits * (D_BLOCK + 2)
        m = tl.full([], -float("inf"), tl.float32)
        l = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([D_BLOCK], dtype=tl.float32)
        for s in range(0, splits):
            part = base + s * (D_BLOCK + 2)
            m_s = tl.load(part + D_BLOCK)
            l_s = tl.load(part + D_BLOCK + 1)
            m_new = tl.maximum(m, m_s)
            a = tl.exp(m - m_new)
            b = tl.exp(m_s - m_new)
            acc = acc * a + tl.load(part + d) * b
            l = l * a + l_s * b
            m = m_new
        tl.store(out_ptr + t * out_stride + h * head_dim + d, acc / l, mask=d < head_dim)
