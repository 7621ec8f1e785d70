"""Dense product with a GGUF block-quantized weight, decoded in registers:
``y = x @ dequant(w).T``.

``w`` is ``[n, k]`` in ggml's block layout (rows of ``row_bytes`` bytes, read as bytes); each
tile of weights is decoded from its blocks as ggml's reference dequantizer does (the same f16
scales, nibbles, high bits and 6-bit K-quant scales), in f32, and multiplied with the f32
activations on the tensor cores at tf32 precision (f32 range, 10-bit mantissa operands, f32
accumulation). ``FORMAT`` picks the layout:

    0 Q8_0  (32 per block, 34 bytes)      3 Q4_K (256 per super-block, 144 bytes)
    1 Q4_0  (32, 18)                      4 Q5_K (256, 176)
    2 Q4_1  (32, 20)                      5 Q6_K (256, 210)
    6 Q5_0  (32, 22)                      7 Q5_1 (32, 24)

Grid ``(cdiv(m, BLOCK_M), cdiv(n, BLOCK_N))``; ``k`` is a whole number of blocks.
``qgemm_split`` is the split-K form for few rows (``gemm.gemm_split``'s). ``qgather_rows``
decodes whole rows instead (a quantized embedding table), grid
``(num_tokens, cdiv(n_cols, BLOCK))``.
"""

import triton
import triton.language as tl

from .gemm import finish_split, gated_left


@triton.jit
def _f16_at(p):
    """The little-endian f16 at byte pointers ``p``, as f32."""
    lo = tl.load(p).to(tl.uint16)
    hi = tl.load(p + 1).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _decode(row, kk, FORMAT: tl.constexpr):
    """Weights at element indices ``kk`` of the rows starting at byte pointers ``row``."""
    if FORMAT == 0:
        base = row + (kk // 32) * 34
        q = tl.load(base + 2 + kk % 32).to(tl.int8, bitcast=True).to(tl.float32)
        w = q * _f16_at(base)
    elif FORMAT == 1 or FORMAT == 2:
        bb: tl.constexpr = 18 if FORMAT == 1 else 20
        qs: tl.constexpr = 2 if FORMAT == 1 else 4
        base = row + (kk // 32) * bb
        j = kk % 32
        byte = tl.load(base + qs + j % 16).to(tl.int32)
        nib = tl.where(j < 16, byte & 15, byte >> 4).to(tl.float32)
        if FORMAT == 1:
            w = (nib - 8.0) * _f16_at(base)
        else:
            w = nib * _f16_at(base) + _f16_at(base + 2)
    elif FORMAT == 6 or FORMAT == 7:
        bb: tl.constexpr = 22 if FORMAT == 6 else 24
        qh_at: tl.constexpr = 2 if FORMAT == 6 else 4
        base = row + (kk // 32) * bb
        j = kk % 32
        byte = tl.load(base + qh_at + 4 + j % 16).to(tl.int32)
        nib = tl.where(j < 16, byte & 15, byte >> 4)
        h = (tl.load(base + qh_at + j // 8).to(tl.int32) >> (j % 8)) & 1
        q = (nib | (h << 4)).to(tl.float32)
        if FORMAT == 6:
            w = (q - 16.0) * _f16_at(base)
        else:
            w = q * _f16_at(base) + _f16_at(base + 2)
    elif FORMAT == 3 or FORMAT == 4:
        bb: tl.constexpr = 144 if FORMAT == 3 else 176
        qs: tl.constexpr = 16 if FORMAT == 3 else 48
        base = row + (kk // 256) * bb
        e = kk % 256
        chunk = e // 64
        hi = (e % 64) >= 32
        l = e % 32
        sub = 2 * chunk + hi.to(tl.int32)
        sc_ptr = base + 4
        # 6-bit scale and min of sub-block `sub`, as ggml's get_scale_min_k4.
        a = tl.load(sc_ptr + tl.where(sub < 4, sub, sub + 4)).to(tl.int32)
        b = tl.load(sc_ptr + tl.where(sub < 4, sub + 4, sub - 4)).to(tl.int32)
        c = tl.load(sc_ptr + sub).to(tl.int32)
        sc = tl.where(sub < 4, a & 63, (a & 15) | ((b >> 6) << 4)).to(tl.float32)
        mn = tl.where(sub < 4, b & 63, (a >> 4) | ((c >> 6) << 4)).to(tl.float32)
        byte = tl.load(base + qs + 32 * chunk + l).to(tl.int32)
        q = tl.where(hi, byte >> 4, byte & 15)
        if FORMAT == 4:
            h = tl.load(base + 16 + l).to(tl.int32)
            q += ((h >> sub) & 1) * 16
        d1 = _f16_at(base) * sc
        m1 = _f16_at(base + 2) * mn
        w = d1 * q.to(tl.float32) - m1
    else:
        base = row + (kk // 256) * 210
        e = kk % 256
        half = e // 128
        r = e % 128
        quarter = r // 32
        l = r % 32
        ql = tl.load(base + 64 * half + l + 32 * (quarter & 1)).to(tl.int32)
        qh = tl.load(base + 128 + 32 * half + l).to(tl.int32)
        q = ((ql >> (4 * (quarter >> 1))) & 15) | (((qh >> (2 * quarter)) & 3) << 4)
        s = tl.load(base + 192 + 8 * half + l // 16 + 2 * quarter).to(tl.int8, bitcast=True)
        w = (_f16_at(base + 208) * s.to(tl.float32)) * (q - 32).to(tl.float32)
    return w


@triton.jit
def _repeat(t, R: tl.constexpr):
    """``t`` (``[G, BN]``) with each row repeated ``R`` times in place: ``[G * R, BN]``, a
    (sub-)block's scale beside each of its elements."""
    g: tl.constexpr = t.shape[0]
    bn: tl.constexpr = t.shape[1]
    return tl.reshape(tl.broadcast_to(t[:, None, :], (g, R, bn)), (g * R, bn))


@triton.jit
def _k_scale_min(sc_ptr, sub):
    """The 6-bit scales and mins of sub-blocks ``sub`` of K-quant super-blocks whose 12 scale
    bytes start at ``sc_ptr``, as ggml's get_scale_min_k4."""
    a = tl.load(sc_ptr + tl.where(sub < 4, sub, sub + 4)).to(tl.int32)
    b = tl.load(sc_ptr + tl.where(sub < 4, sub + 4, sub - 4)).to(tl.int32)
    c = tl.load(sc_ptr + sub).to(tl.int32)
    sc = tl.where(sub < 4, a & 63, (a & 15) | ((b >> 6) << 4)).to(tl.float32)
    mn = tl.where(sub < 4, b & 63, (a >> 4) | ((c >> 6) << 4)).to(tl.float32)
    return sc, mn


@triton.jit
def _left(x_ptr, up_ptr, rm, m, kx, k_hi, x_stride, GATED: tl.constexpr):
    """The left operand at columns ``kx`` (zero from ``k_hi`` on): ``gated_left``'s."""
    mask = (rm[:, None] < m) & (kx[None, :] < k_hi)
    return gated_left(x_ptr, up_ptr, rm, kx, mask, x_stride, GATED)


@triton.jit
def _wide_dot(acc, x_ptr, up_ptr, rm, m, k, k_hi, x_stride, rows, k0, FORMAT: tl.constexpr,
              GATED: tl.constexpr):
    """``acc`` plus the product of the 256 columns from ``k0`` (one K-quant super-block, or
    eight 32-element blocks) of the rows at byte pointers ``rows`` (``[1, BN]``), every
    ``FORMAT``. Each row's quants are read as whole runs of bytes (the
    compiler's vector loads where the layout is 16-byte aligned: Q4_K, Q5_K) and each scale
    once per (sub-)block, where ``_decode`` loads every element's bytes and scales on their
    own. The columns go in the order the bytes hold them (Q4_K's low nibbles of a 64-element
    chunk, then its high ones), the activations loaded in the same order; each weight is the
    value ``_decode`` gives, bit for bit. Columns from ``k`` on read no byte and weigh 0."""
    if FORMAT == 3 or FORMAT == 4:
        # Chunk c of 64 elements: byte i = 32c + l of qs holds element 64c + l in its low
        # nibble (sub-block 2c) and 64c + 32 + l in its high one (sub-block 2c + 1).
        bb: tl.constexpr = 144 if FORMAT == 3 else 176
        qs_at: tl.constexpr = 16 if FORMAT == 3 else 48
        blk = rows + (k0 // 256) * bb
        i = tl.arange(0, 128)
        c = i // 32
        qs = tl.load(blk + qs_at + i[:, None]).to(tl.int32)
        q_lo = qs & 15
        q_hi = qs >> 4
        if FORMAT == 4:
            qh = tl.load(blk + 16 + (i % 32)[:, None]).to(tl.int32)
            q_lo += ((qh >> (2 * c)[:, None]) & 1) * 16
            q_hi += ((qh >> (2 * c + 1)[:, None]) & 1) * 16
        sub = 2 * tl.arange(0, 4)[:, None]
        sc_lo, mn_lo = _k_scale_min(blk + 4, sub)
        sc_hi, mn_hi = _k_scale_min(blk + 4, sub + 1)
        d = _f16_at(blk)
        dmin = _f16_at(blk + 2)
        w_lo = _repeat(d * sc_lo, 32) * q_lo.to(tl.float32) - _repeat(dmin * mn_lo, 32)
        w_hi = _repeat(d * sc_hi, 32) * q_hi.to(tl.float32) - _repeat(dmin * mn_hi, 32)
        kx = k0 + 64 * c + i % 32
        acc += tl.dot(_left(x_ptr, up_ptr, rm, m, kx, k_hi, x_stride, GATED), w_lo,
                      input_precision="tf32")
        acc += tl.dot(_left(x_ptr, up_ptr, rm, m, kx + 32, k_hi, x_stride, GATED), w_hi,
                      input_precision="tf32")
    elif FORMAT == 5:
        # Half h (128 elements): ql byte 64h + j holds element 128h + j in its low nibble and
        # 128h + 64 + j in its high one; qh byte 128 + 32h + j % 32 their two high bits; an
        # int8 scale per 16 elements at 192 + 8h.
        blk = rows + (k0 // 256) * 210
        j = tl.arange(0, 64)
        g = tl.arange(0, 4)[:, None]
        d = _f16_at(blk + 208)
        for h in tl.static_range(2):
            ql = tl.load(blk + 64 * h + j[:, None]).to(tl.int32)
            qh = tl.load(blk + 128 + 32 * h + (j % 32)[:, None]).to(tl.int32)
            for part in tl.static_range(2):
                hi_bits = (qh >> (2 * (2 * part + j // 32))[:, None]) & 3
                q = ((ql >> (4 * part)) & 15) | (hi_bits << 4)
                s = tl.load(blk + 192 + 8 * h + 4 * part + g).to(tl.int8, bitcast=True)
                w = _repeat(d * s.to(tl.float32), 16) * (q - 32).to(tl.float32)
                kx = k0 + 128 * h + 64 * part + j
                acc += tl.dot(_left(x_ptr, up_ptr, rm, m, kx, k_hi, x_stride, GATED), w,
                              input_precision="tf32")
    elif FORMAT == 0:
        # Eight blocks of 34 bytes: an f16 scale, then 32 int8 quants in order.
        blk = rows + (k0 // 32) * 34
        i = tl.arange(0, 256)
        b = tl.arange(0, 8)[:, None]
        live = (k0 + i < k)[:, None]
        q = tl.load(blk + ((i // 32) * 34 + 2 + i % 32)[:, None], mask=live, other=0)
        d = tl.where(k0 + 32 * b < k, _f16_at(blk + tl.where(k0 + 32 * b < k, 34 * b, 0)), 0.0)
        w = q.to(tl.int8, bitcast=True).to(tl.float32) * _repeat(d, 32)
        acc += tl.dot(_left(x_ptr, up_ptr, rm, m, k0 + i, k_hi, x_stride, GATED), w,
                      input_precision="tf32")
    else:
        # Q4_0, Q4_1, Q5_0, Q5_1: eight blocks of 32 elements, an f16 scale (and an f16 min:
        # Q4_1, Q5_1; 32 fifth bits: Q5_0, Q5_1), then 16 bytes whose low nibbles are elements
        # 0-15 and high nibbles 16-31.
        bb: tl.constexpr = 18 if FORMAT == 1 else (20 if FORMAT == 2 else (22 if FORMAT == 6
                                                                         else 24))
        qh_at: tl.constexpr = 2 if FORMAT == 6 else 4
        qs_at: tl.constexpr = bb - 16
        blk = rows + (k0 // 32) * bb
        i = tl.arange(0, 128)
        j = i % 16
        at = (i // 16) * bb
        b = tl.arange(0, 8)[:, None]
        live = (k0 + 32 * (i // 16) < k)[:, None]
        qs = tl.load(blk + (at + qs_at + j)[:, None], mask=live, other=0).to(tl.int32)
        q_lo = qs & 15
        q_hi = qs >> 4
        if FORMAT == 6 or FORMAT == 7:
            # Element e's fifth bit is bit e % 8 of byte e // 8 of qh.
            h_lo = tl.load(blk + (at + qh_at + j // 8)[:, None], mask=live, other=0)
            h_hi = tl.load(blk + (at + qh_at + 2 + j // 8)[:, None], mask=live, other=0)
            q_lo = q_lo | (((h_lo.to(tl.int32) >> (j % 8)[:, None]) & 1) << 4)
            q_hi = q_hi | (((h_hi.to(tl.int32) >> (j % 8)[:, None]) & 1) << 4)
        in_row = k0 + 32 * b < k
        d = tl.where(in_row, _f16_at(blk + tl.where(in_row, bb * b, 0)), 0.0)
        ds = _repeat(d, 16)
        if FORMAT == 1:
            w_lo = (q_lo.to(tl.float32) - 8.0) * ds
            w_hi = (q_hi.to(tl.float32) - 8.0) * ds
        elif FORMAT == 6:
            w_lo = (q_lo.to(tl.float32) - 16.0) * ds
            w_hi = (q_hi.to(tl.float32) - 16.0) * ds
        else:
            mn = tl.where(in_row, _f16_at(blk + tl.where(in_row, bb * b, 0) + 2), 0.0)
            ms = _repeat(mn, 16)
            w_lo = q_lo.to(tl.float32) * ds + ms
            w_hi = q_hi.to(tl.float32) * ds + ms
        kx = k0 + 32 * (i // 16) + j
        acc += tl.dot(_left(x_ptr, up_ptr, rm, m, kx, k_hi, x_stride, GATED), w_lo,
                      input_precision="tf32")
        acc += tl.dot(_left(x_ptr, up_ptr, rm, m, kx + 16, k_hi, x_stride, GATED), w_hi,
                      input_precision="tf32")
    return acc


@triton.jit
def qgemm(x_ptr, w_ptr, y_ptr, m, n, k, row_bytes, x_stride, y_stride,
          FORMAT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    # Rows past n read row 0 (always there); their products are never stored.
    rows = w_ptr + tl.where(rn < n, rn, 0)[None, :] * row_bytes
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        if BLOCK_K == 256:
            # Decode tiles: whole runs of bytes.
            acc = _wide_dot(acc, x_ptr, x_ptr, rm, m, k, k, x_stride, rows, k0, FORMAT, 0)
        else:
            kk = k0 + rk
            a = tl.load(x_ptr + rm[:, None] * x_stride + kk[None, :],
                        mask=(rm[:, None] < m) & (kk[None, :] < k), other=0.0)
            # k is a whole number of blocks and BLOCK_K divides the block (or the reverse), so
            # a tile past k decodes no byte outside the row: clamp the index, zero the value.
            kc = tl.where(kk < k, kk, 0)[:, None]
            b = tl.where(kk[:, None] < k, _decode(rows, kc, FORMAT), 0.0)
            acc += tl.dot(a, b, input_precision="tf32")
    tl.store(y_ptr + rm[:, None] * y_stride + rn[None, :], acc,
             mask=(rm[:, None] < m) & (rn[None, :] < n))


@triton.jit
def qgemm_split(x_ptr, up_ptr, w_ptr, part_ptr, y_ptr, count_ptr, m, n, k, row_bytes,
                x_stride, k_per_split, y_stride, splits, FORMAT: tl.constexpr,
                GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """``gemm_split`` (grid, ranges, the sum folded into the last range, ``GATED``) for a
    block-format weight, with ``qgemm``'s tile arithmetic: program ``(i, j, z)`` multiplies
    the columns ``z * k_per_split ..``. ``k_per_split`` is a multiple of the format's block,
    so a range decodes whole blocks (indices past the range are clamped and their values
    zeroed, as ``qgemm`` does past ``k``); with one range the result is ``qgemm``'s at the
    same tiles, bit for bit."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    z = tl.program_id(2)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    rows = w_ptr + tl.where(rn < n, rn, 0)[None, :] * row_bytes
    k_lo = z * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, k)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if BLOCK_K == 256:
            acc = _wide_dot(acc, x_ptr, up_ptr, rm, m, k, k_hi, x_stride, rows, k0, FORMAT,
                            GATED)
        else:
            kk = k0 + rk
            a = gated_left(x_ptr, up_ptr, rm, kk, (rm[:, None] < m) & (kk[None, :] < k_hi),
                           x_stride, GATED)
            kc = tl.where(kk < k_hi, kk, 0)[:, None]
            b = tl.where(kk[:, None] < k_hi, _decode(rows, kc, FORMAT), 0.0)
            acc += tl.dot(a, b, input_precision="tf32")
    finish_split(acc, part_ptr, y_ptr, count_ptr, rm, rn, m, n, y_stride, splits)


@triton.jit
def qgather_rows(table_ptr, ids_ptr, out_ptr, n_cols, row_bytes, out_stride, scale,
                 FORMAT: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    row = table_ptr + tl.load(ids_ptr + t).to(tl.int64) * row_bytes
    v = _decode(row, tl.where(mask, offs, 0), FORMAT)
    tl.store(out_ptr + t * out_stride + offs, v * scale, mask=mask)
