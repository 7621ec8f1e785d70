"""Greedy decisions on the device: the argmax of each logits row, so only token ids come back.

Grid ``(rows,)``: program ``r`` scans row ``r`` of ``logits`` (``n_cols`` f32 at
``r * row_stride``) in chunks of ``BLOCK`` and writes the index of its largest value to
``out[r]`` (u32): the first among equals, NaN never winning, 0 when no value beats minus
infinity. These are the host sampler's rules (``ferrum_models::argmax``), so a greedy request
gets the same token either way.
"""

import triton
import triton.language as tl


@triton.jit
def argmax_rows(logits_ptr, out_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    best = tl.full([], -float("inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        v = tl.load(logits_ptr + r * row_stride + c, mask=c < n_cols, other=-float("inf"))
        v = tl.where(v != v, -float("inf"), v)
        m = tl.max(v, axis=0)
        # The first column holding this chunk's maximum.
        i = tl.min(tl.where(v == m, c, n_cols), axis=0)
        # Strictly greater: an equal value in a later chunk does not displace the first.
        take = m > best
        best_idx = tl.where(take, i, best_idx)
        best = tl.where(take, m, best)
    tl.store(out_ptr + r, best_idx.to(tl.uint32))


# --- Sampling on the device: the rules of ``ferrum_models::sampling`` -----------------------
# A step's rows go through up to four launches: ``sample_prepare`` copies the rows that have
# edits or a mask into a work buffer with the mask applied, ``logit_edits`` applies each row's
# sparse edits (penalties, bias) there, ``sample_rows`` picks each row's token, and
# ``row_logprobs`` computes the raw logprobs the rows asked for. Per-row inputs are arrays
# indexed by row; the host's draw for the row is ``u_ptr[r]`` (f64).

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _key(v):
    """The f32 logit's order-preserving u32 key (``-0.0`` as ``+0.0``): larger logit, larger key."""
    v = tl.where(v == 0.0, 0.0, v)
    b = v.to(tl.uint32, bitcast=True)
    sign = tl.full(b.shape, 0x80000000, tl.uint32)
    return tl.where((b & sign) == 0, b | sign, ~b)


@triton.jit
def sample_prepare(logits_ptr, work_ptr, mask_ptr, mask_off_ptr, n_cols, row_stride,
                   BLOCK: tl.constexpr):
    """Grid ``(rows, cdiv(n_cols, BLOCK))``: ``work[r] = logits[r]`` with the tokens row ``r``'s
    mask (``mask_off[r] >= 0``: ``ceil(n_cols / 32)`` u32 words at ``mask_ptr + mask_off[r]``,
    bit ``t % 32`` of word ``t / 32`` allows ``t``) does not allow set to minus infinity."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = c < n_cols
    v = tl.load(logits_ptr + r * row_stride + c, mask=inside, other=NEG_INF)
    off = tl.load(mask_off_ptr + r)
    if off >= 0:
        words = tl.load(mask_ptr + off + c // 32, mask=inside, other=0)
        allowed = ((words >> (c % 32).to(tl.uint32)) & 1) != 0
        v = tl.where(allowed, v, NEG_INF)
    tl.store(work_ptr + r * row_stride + c, v, mask=inside)


@triton.jit
def logit_edits(work_ptr, edit_off_ptr, tok_ptr, rep_ptr, sub_ptr, bias_ptr, mask_ptr,
                mask_off_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """Grid ``(rows,)``: row ``r``'s edits ``edit_off[r] .. edit_off[r + 1]`` (distinct tokens)
    applied in place: the repetition penalty (``l / rep`` when ``l > 0``, else ``l * rep``;
    none when ``rep == 1``), then ``- sub``, then ``+ bias``. Tokens the row's mask (as
    ``sample_prepare`` reads it) does not allow keep their minus infinity: the host edits
    first and masks after."""
    r = tl.program_id(0).to(tl.int64)
    start = tl.load(edit_off_ptr + r)
    end = tl.load(edit_off_ptr + r + 1)
    off = tl.load(mask_off_ptr + r)
    for e0 in range(start, end, BLOCK):
        e = e0 + tl.arange(0, BLOCK)
        m = e < end
        t = tl.load(tok_ptr + e, mask=m, other=0)
        m = m & (t < n_cols)
        if off >= 0:
            words = tl.load(mask_ptr + off + t // 32, mask=m, other=0)
            m = m & (((words >> (t % 32)) & 1) != 0)
        rep = tl.load(rep_ptr + e, mask=m, other=1.0)
        sub = tl.load(sub_ptr + e, mask=m, other=0.0)
        bias = tl.load(bias_ptr + e, mask=m, other=0.0)
        at = work_ptr + r * row_stride + t
        l = tl.load(at, mask=m, other=0.0)
        pen = tl.where(l > 0.0, tl.math.div_rn(l, rep), l * rep)
        l = tl.where(rep == 1.0, l, pen)
        l = (l - sub) + bias
        tl.store(at, l, mask=m)


@triton.jit
def _tempered(row, c, n_cols, scale):
    v = tl.load(row + c, mask=c < n_cols, other=NEG_INF)
    return tl.where(v != v, NEG_INF, v) * scale


@triton.jit
def _kept(v, floor, kth, cut):
    """The tempered values that are candidates (finite, at least ``floor``) whose key is at
    least ``kth`` (top-k) and above ``cut`` (top-p)."""
    key = _key(v)
    return (v >= floor) & (v > NEG_INF) & (key >= kth) & (key > cut)


@triton.jit
def _count(row, n_cols, scale, floor, kth, BLOCK: tl.constexpr):
    """How many of the row's tempered values ``_kept`` keeps (no top-p cut)."""
    n = tl.full([], 0, tl.int32)
    for start in range(0, n_cols, BLOCK):
        v = _tempered(row, start + tl.arange(0, BLOCK), n_cols, scale)
        n += tl.sum(_kept(v, floor, kth, 0).to(tl.int32), axis=0)
    return n


@triton.jit
def _mass(row, n_cols, scale, mx, floor, kth, cut, BLOCK: tl.constexpr):
    """The f64 sum of ``exp(v - mx)`` over the values ``_kept`` keeps, in chunk order."""
    total = tl.full([], 0.0, tl.float64)
    for start in range(0, n_cols, BLOCK):
        v = _tempered(row, start + tl.arange(0, BLOCK), n_cols, scale)
        p = tl.where(_kept(v, floor, kth, cut), tl.exp(v - mx), 0.0)
        total += tl.sum(p.to(tl.float64), axis=0)
    return total


@triton.jit
def sample_rows(src_ptr, inv_t_ptr, ln_min_p_ptr, top_k_ptr, top_p_ptr, u_ptr, out_ptr, n_cols,
                row_stride, BLOCK: tl.constexpr):
    """Grid ``(rows,)``: row ``r`` of ``src`` (edited and masked already) to a token, as
    ``ferrum_models::sampling`` says. ``inv_t[r] == 0`` is greedy: the argmax. Otherwise the
    row times ``inv_t``; candidates are the finite values of at least ``max + ln_min_p[r]``;
    ``top_k[r] > 0`` keeps those of at least the k-th largest; ``top_p[r] < 1`` keeps each value
    whose larger candidates hold less than ``top_p`` of the mass (``exp(l - max)``, f64 sums);
    then ``x = u[r] * kept mass`` and the token is the first kept one, in index order, whose
    running mass passes ``x``. The thresholds are found by bisecting the values' u32 keys,
    32 counting (or summing) passes over the row each."""
    r = tl.program_id(0).to(tl.int64)
    row = src_ptr + r * row_stride
    cols = tl.arange(0, BLOCK)
    inv_t = tl.load(inv_t_ptr + r)
    scale = tl.where(inv_t == 0.0, 1.0, inv_t)
    # The maximum of the tempered row and its first index (argmax's rules).
    best = tl.full([], NEG_INF, tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        v = _tempered(row, c, n_cols, scale)
        m = tl.max(v, axis=0)
        i = tl.min(tl.where(v == m, c, n_cols), axis=0)
        take = m > best
        best_idx = tl.where(take, i, best_idx)
        best = tl.where(take, m, best)
    token = best_idx
    if inv_t != 0.0:
        mx = best
        ln_min_p = tl.load(ln_min_p_ptr + r)
        floor = tl.where(ln_min_p == NEG_INF, NEG_INF, mx + ln_min_p)
        count = _count(row, n_cols, scale, floor, 0, BLOCK)
        if count > 0:
            k = tl.load(top_k_ptr + r)
            # Every candidate's key is above 0: a floor of 0 keeps them all.
            kth = tl.full([], 0, tl.uint32)
            if (k > 0) & (k < count):
                for bit in range(0, 32):
                    trial = kth | (tl.full([], 0x80000000, tl.uint32) >> bit)
                    n = _count(row, n_cols, scale, floor, trial, BLOCK)
                    kth = tl.where(n >= k, trial, kth)
            total = _mass(row, n_cols, scale, mx, floor, kth, 0, BLOCK)
            top_p = tl.load(top_p_ptr + r)
            # Kept: candidates of key >= kth and key > cut.
            cut = tl.full([], 0, tl.uint32)
            if top_p < 1.0:
                target = top_p.to(tl.float64) * total
                for bit in range(0, 32):
                    trial = cut | (tl.full([], 0x80000000, tl.uint32) >> bit)
                    above = _mass(row, n_cols, scale, mx, floor, kth, trial, BLOCK)
                    cut = tl.where(above >= target, trial, cut)
                total = _mass(row, n_cols, scale, mx, floor, kth, cut, BLOCK)
            x = tl.load(u_ptr + r) * total
            running = tl.full([], 0.0, tl.float64)
            found = tl.full([], n_cols, tl.int32)
            last = tl.full([], 0, tl.int32)
            for start in range(0, n_cols, BLOCK):
                c = start + cols
                v = _tempered(row, c, n_cols, scale)
                kept = _kept(v, floor, kth, cut)
                p = tl.where(kept, tl.exp(v - mx), 0.0).to(tl.float64)
                cum = running + tl.cumsum(p, axis=0)
                hit = kept & (cum > x)
                found = tl.minimum(found, tl.min(tl.where(hit, c, n_cols), axis=0))
                last = tl.maximum(last, tl.max(tl.where(kept, c, 0), axis=0))
                running += tl.sum(p, axis=0)
            token = tl.where(found < n_cols, found, last)
    tl.store(out_ptr + r, token.to(tl.uint32))


@triton.jit
def row_logprobs(logits_ptr, tok_ptr, n_ptr, lp_ptr, top_id_ptr, top_val_ptr, n_cols, row_stride,
                 max_n, BLOCK: tl.constexpr):
    """Grid ``(rows,)``: for a row with ``n[r] >= 0``, the raw logprob of its token
    (``tok[r]``) into ``lp[r]``, and its ``n[r]`` largest logprobs, the lower index first among
    equals, into ``top_id``/``top_val`` at ``r * max_n``; NaN counts as minus infinity."""
    r = tl.program_id(0).to(tl.int64)
    n = tl.load(n_ptr + r)
    if n >= 0:
        row = logits_ptr + r * row_stride
        cols = tl.arange(0, BLOCK)
        mx = tl.full([], NEG_INF, tl.float32)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mx = tl.maximum(mx, tl.max(_tempered(row, c, n_cols, 1.0), axis=0))
        s = tl.full([], 0.0, tl.float64)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            v = _tempered(row, c, n_cols, 1.0)
            s += tl.sum(tl.exp((v - mx).to(tl.float64)), axis=0)
        lse = mx + tl.log(s).to(tl.float32)
        t = tl.load(tok_ptr + r)
        lt = tl.load(row + t)
        tl.store(lp_ptr + r, tl.where(lt != lt, NEG_INF, lt) - lse)
        pv = tl.full([], float("inf"), tl.float32)
        pi = tl.full([], -1, tl.int32)
        for j in range(0, n):
            bv = tl.full([], NEG_INF, tl.float32)
            bi = tl.full([], n_cols, tl.int32)
            for start in range(0, n_cols, BLOCK):
                c = start + cols
                v = _tempered(row, c, n_cols, 1.0)
                after = ((v < pv) | ((v == pv) & (c > pi))) & (c < n_cols)
                cv = tl.where(after, v, NEG_INF)
                m = tl.max(cv, axis=0)
                i = tl.min(tl.where(after & (cv == m), c, n_cols), axis=0)
                better = (m > bv) | ((m == bv) & (i < bi))
                bi = tl.where(better, i, bi)
                bv = tl.where(better, m, bv)
            tl.store(top_id_ptr + r * max_n + j, bi.to(tl.uint32))
            tl.store(top_val_ptr + r * max_n + j, bv - lse)
            pv = bv
            pi = bi
