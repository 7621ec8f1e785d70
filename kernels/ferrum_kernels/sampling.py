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
