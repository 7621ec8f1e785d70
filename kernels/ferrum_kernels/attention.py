"""Paged attention over block tables, for any mix of prefill chunks and decodes.

Grid ``(n, num_kv_heads * cdiv(group, G_BLOCK))``: program ``(i, j)`` computes the attention
output of query token ``t = tokens[i]`` for up to ``G_BLOCK`` query heads of one KV head
(``_heads``), reading each key and value tile once for all of them (the batch's decode
tokens when prompt chunks in the same batch take ``prefill_attention``; every token
otherwise). The token sits at position ``positions[t]`` of its sequence, whose block table
starts at ``block_tables[bt_start[t]]``; it attends to the keys at positions
``lo ..= positions[t]`` of the same sequence (causal), with ``lo = positions[t] - window + 1``
under a sliding window (``window > 0``) and 0 otherwise. Keys of position ``p`` live in slot
``block_tables[bt_start[t] + p // block_size] * block_size + p % block_size`` of the caches,
``[num_slots, num_kv_heads, head_dim]`` in f32, f16, bf16 or fp8 (the ``_fp8`` entry points,
with each row's scale beside it, ``fp8.py``). The KV of the batch's own tokens
is written before this runs, so prior context and the chunk itself are read the same way.

Query head ``h`` reads KV head ``h // group`` (GQA). Scores are ``q . k * scale``, soft-capped
as ``cap * tanh(s / cap)`` when ``softcap > 0``; the softmax is the online (flash) form in
f32, over tiles of ``BLOCK_N`` keys; the products run as ``tl.dot`` (``_attend_keys``).
"""

import triton
import triton.language as tl

from .fp8 import e4m3_decode


@triton.jit
def _heads(j, group, G_BLOCK: tl.constexpr):
    """Program ``j`` of axis 1 takes the KV head ``kvh`` and up to ``G_BLOCK`` of its query
    heads: ``(kvh, heads[G_BLOCK], valid[G_BLOCK])``."""
    chunks = tl.cdiv(group, G_BLOCK)
    kvh = j // chunks
    g = (j % chunks) * G_BLOCK + tl.arange(0, G_BLOCK)
    return kvh.to(tl.int64), kvh * group + g, g < group


@triton.jit
def _split(x, ty):
    """``x`` (f32) as two values of type ``ty`` whose sum is ``x`` to about twice ``ty``'s
    precision: the tensor cores' products of both parts with a ``ty`` operand carry x's
    value nearly as an f32 product would."""
    hi = x.to(ty)
    return hi, (x - hi.to(tl.float32)).to(ty)


@triton.jit
def _attend_keys(q, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, bt, kvh, first, end,
                 num_kv_heads, head_dim, block_size, scale, softcap, BLOCK_N: tl.constexpr,
                 D_BLOCK: tl.constexpr, G_BLOCK: tl.constexpr, SCALED: tl.constexpr):
    """The online softmax of the query rows ``q`` (``[G_BLOCK, D_BLOCK]`` f32: the heads of
    one KV head) over the keys at positions ``first .. end`` of the block table ``bt``:
    ``(max[G], sum[G], acc[G, D])``, unnormalized (``acc / sum`` is the output). Each key tile
    is read once for all the heads. Half caches: ``q . k`` and ``p . v`` run on the tensor
    cores with ``q`` and ``p`` split in two parts of the cache's type (``_split``), so the
    products keep about 16 bits of ``q`` and ``p``; f32 caches: full f32 products. fp8 caches
    (``SCALED``; the scale pointers are read only then): keys and values decoded exactly to
    f16 and bf16, ``q . k`` (``q`` split in f16) times each key's scale, and ``p`` times each
    value's scale split in bf16 (whose range holds any scale) for ``p . v``."""
    cache_ty = k_cache_ptr.dtype.element_ty
    d = tl.arange(0, D_BLOCK)
    dmask = d < head_dim
    m_i = tl.full([G_BLOCK], -float("inf"), tl.float32)
    l_i = tl.zeros([G_BLOCK], dtype=tl.float32)
    acc = tl.zeros([G_BLOCK, D_BLOCK], dtype=tl.float32)
    if SCALED:
        q_hi, q_lo = _split(q, tl.float16)
    elif cache_ty != tl.float32:
        q_hi, q_lo = _split(q, cache_ty)
    for start in range(first, end, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)
        kmask = kpos < end
        page = tl.load(bt + kpos // block_size, mask=kmask, other=0).to(tl.int64)
        slot = page * block_size + (kpos % block_size)
        row = slot * num_kv_heads + kvh
        off = row * head_dim
        tile_mask = kmask[:, None] & dmask[None, :]
        k = tl.load(k_cache_ptr + off[:, None] + d[None, :], mask=tile_mask, other=0.0)
        if SCALED:
            kt = tl.trans(e4m3_decode(k).to(tl.float16))
            ks = tl.load(k_scale_ptr + row, mask=kmask, other=0.0)
            s = (tl.dot(q_hi, kt) + tl.dot(q_lo, kt)) * ks[None, :]
        elif cache_ty == tl.float32:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            kt = tl.trans(k)
            s = tl.dot(q_hi, kt) + tl.dot(q_lo, kt)
        s = s * scale
        if softcap > 0:
            # cap * tanh(s / cap), tanh(x) = 2 sigmoid(2x) - 1
            s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s / softcap)) - 1.0)
        s = tl.where(kmask[None, :], s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(v_cache_ptr + off[:, None] + d[None, :], mask=tile_mask, other=0.0)
        if SCALED:
            vs = tl.load(v_scale_ptr + row, mask=kmask, other=0.0)
            p_hi, p_lo = _split(p * vs[None, :], tl.bfloat16)
            v16 = e4m3_decode(v).to(tl.bfloat16)
            pv = tl.dot(p_hi, v16) + tl.dot(p_lo, v16)
        elif cache_ty == tl.float32:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            p_hi, p_lo = _split(p, cache_ty)
            pv = tl.dot(p_hi, v) + tl.dot(p_lo, v)
        acc = acc * alpha[:, None] + pv
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _paged_attention(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                     block_tables_ptr, bt_start_ptr, pos_ptr, tok_ptr, out_ptr, q_stride,
                     out_stride, group, num_kv_heads, head_dim, block_size, window, scale,
                     softcap, BLOCK_N: tl.constexpr, D_BLOCK: tl.constexpr,
                     G_BLOCK: tl.constexpr, SCALED: tl.constexpr):
    t = tl.load(tok_ptr + tl.program_id(0)).to(tl.int64)
    kvh, h, valid = _heads(tl.program_id(1), group, G_BLOCK)
    d = tl.arange(0, D_BLOCK)
    dmask = d < head_dim
    rows = t * q_stride + h[:, None] * head_dim + d[None, :]
    q = tl.load(q_ptr + rows, mask=valid[:, None] & dmask[None, :], other=0.0)
    pos = tl.load(pos_ptr + t).to(tl.int32)
    bt = block_tables_ptr + tl.load(bt_start_ptr + t).to(tl.int64)
    lo = 0
    if window > 0:
        lo = tl.maximum(pos - window + 1, 0)
    m_i, l_i, acc = _attend_keys(q, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, bt,
                                 kvh, lo, pos + 1, num_kv_heads, head_dim, block_size, scale,
                                 softcap, BLOCK_N, D_BLOCK, G_BLOCK, SCALED)
    out = out_ptr + t * out_stride + h[:, None] * head_dim + d[None, :]
    tl.store(out, acc / l_i[:, None], mask=valid[:, None] & dmask[None, :])


@triton.jit
def paged_attention(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, bt_start_ptr, pos_ptr,
                    tok_ptr, out_ptr, q_stride, out_stride, group, num_kv_heads, head_dim,
                    block_size, window, scale, softcap, BLOCK_N: tl.constexpr,
                    D_BLOCK: tl.constexpr, G_BLOCK: tl.constexpr):
    _paged_attention(q_ptr, k_cache_ptr, v_cache_ptr, k_cache_ptr, v_cache_ptr,
                     block_tables_ptr, bt_start_ptr, pos_ptr, tok_ptr, out_ptr, q_stride,
                     out_stride, group, num_kv_heads, head_dim, block_size, window, scale,
                     softcap, BLOCK_N, D_BLOCK, G_BLOCK, False)


@triton.jit
def paged_attention_fp8(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                        block_tables_ptr, bt_start_ptr, pos_ptr, tok_ptr, out_ptr, q_stride,
                        out_stride, group, num_kv_heads, head_dim, block_size, window, scale,
                        softcap, BLOCK_N: tl.constexpr, D_BLOCK: tl.constexpr,
                        G_BLOCK: tl.constexpr):
    """``paged_attention`` over an fp8 cache (its rows' scales beside it)."""
    _paged_attention(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                     block_tables_ptr, bt_start_ptr, pos_ptr, tok_ptr, out_ptr, q_stride,
                     out_stride, group, num_kv_heads, head_dim, block_size, window, scale,
                     softcap, BLOCK_N, D_BLOCK, G_BLOCK, True)


@triton.jit
def _paged_attention_split(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                           block_tables_ptr, bt_start_ptr, pos_ptr, tok_ptr, out_ptr, part_ptr,
                           q_stride, out_stride, group, num_kv_heads, head_dim, block_size,
                           window, scale, softcap, split_keys, max_ranges, max_splits,
                           BLOCK_N: tl.constexpr, D_BLOCK: tl.constexpr, G_BLOCK: tl.constexpr,
                           SCALED: tl.constexpr):
    """Split-K decode attention (flash-decoding). Grid ``(n, num_kv_heads * cdiv(group,
    G_BLOCK), max_splits)``: a token whose context (``lo ..= pos``) holds ``ctx`` keys is cut
    into ``splits = min(cdiv(ctx, split_keys), max_ranges)`` ranges of ``cdiv(ctx, splits)``
    keys (the last may be shorter or empty), program ``(i, j, s)`` taking range ``s`` for the
    query heads ``_heads(j)`` (programs past a token's ranges do nothing). With one range the
    program writes the output, computed exactly as ``paged_attention`` does; with more, each
    writes its partial ``(acc[D_BLOCK], max, sum)`` per head ``h`` to
    ``part[((i * num_heads + h) * max_splits + s) * (D_BLOCK + 2)]`` and
    ``attention_combine`` merges them. A token's result depends on its own context only, never
    on the batch."""
    i = tl.program_id(0)
    t = tl.load(tok_ptr + i).to(tl.int64)
    kvh, h, valid = _heads(tl.program_id(1), group, G_BLOCK)
    s = tl.program_id(2)
    d = tl.arange(0, D_BLOCK)
    dmask = d < head_dim
    pos = tl.load(pos_ptr + t).to(tl.int32)
    lo = 0
    if window > 0:
        lo = tl.maximum(pos - window + 1, 0)
    splits = tl.minimum(tl.cdiv(pos + 1 - lo, split_keys), max_ranges)
    if s < splits:
        rows = t * q_stride + h[:, None] * head_dim + d[None, :]
        q = tl.load(q_ptr + rows, mask=valid[:, None] & dmask[None, :], other=0.0)
        bt = block_tables_ptr + tl.load(bt_start_ptr + t).to(tl.int64)
        per = tl.cdiv(pos + 1 - lo, splits)
        first = lo + s * per
        end = tl.minimum(first + per, pos + 1)
        m_i, l_i, acc = _attend_keys(q, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                                     bt, kvh, first, end, num_kv_heads, head_dim, block_size,
                                     scale, softcap, BLOCK_N, D_BLOCK, G_BLOCK, SCALED)
        if splits == 1:
            out = out_ptr + t * out_stride + h[:, None] * head_dim + d[None, :]
            tl.store(out, acc / l_i[:, None], mask=valid[:, None] & dmask[None, :])
        else:
            nh = num_kv_heads * group
            part = part_ptr + ((i.to(tl.int64) * nh + h) * max_splits + s) * (D_BLOCK + 2)
            tl.store(part[:, None] + d[None, :], acc, mask=valid[:, None])
            tl.store(part + D_BLOCK, m_i, mask=valid)
            tl.store(part + D_BLOCK + 1, l_i, mask=valid)


@triton.jit
def paged_attention_split(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, bt_start_ptr,
                          pos_ptr, tok_ptr, out_ptr, part_ptr, q_stride, out_stride, group,
                          num_kv_heads, head_dim, block_size, window, scale, softcap,
                          split_keys, max_ranges, max_splits, BLOCK_N: tl.constexpr,
                          D_BLOCK: tl.constexpr, G_BLOCK: tl.constexpr):
    _paged_attention_split(q_ptr, k_cache_ptr, v_cache_ptr, k_cache_ptr, v_cache_ptr,
                           block_tables_ptr, bt_start_ptr, pos_ptr, tok_ptr, out_ptr, part_ptr,
                           q_stride, out_stride, group, num_kv_heads, head_dim, block_size,
                           window, scale, softcap, split_keys, max_ranges, max_splits, BLOCK_N,
                           D_BLOCK, G_BLOCK, False)


@triton.jit
def paged_attention_split_fp8(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                              block_tables_ptr, bt_start_ptr, pos_ptr, tok_ptr, out_ptr,
                              part_ptr, q_stride, out_stride, group, num_kv_heads, head_dim,
                              block_size, window, scale, softcap, split_keys, max_ranges,
                              max_splits, BLOCK_N: tl.constexpr, D_BLOCK: tl.constexpr,
                              G_BLOCK: tl.constexpr):
    """``paged_attention_split`` over an fp8 cache (its rows' scales beside it)."""
    _paged_attention_split(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                           block_tables_ptr, bt_start_ptr, pos_ptr, tok_ptr, out_ptr, part_ptr,
                           q_stride, out_stride, group, num_kv_heads, head_dim, block_size,
                           window, scale, softcap, split_keys, max_ranges, max_splits, BLOCK_N,
                           D_BLOCK, G_BLOCK, True)


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
