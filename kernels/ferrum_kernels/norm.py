"""RMSNorm, optionally fused with the residual add that precedes it.

Grid ``(num_rows, num_groups)``: program ``(r, g)`` normalizes the ``n_cols`` elements at
``x + r * row_stride + g * n_cols`` (a group is a head for per-head q/k norms; 1 otherwise).

With ``HAS_RESIDUAL`` the sum ``x + residual`` is written back to ``residual`` (the stream the
next layer adds to) and normalized; otherwise ``x`` is normalized. ``out`` may alias ``x``.
The weight is f32 (Gemma's ``1 + w`` is folded in at upload). With ``ONE_PASS`` (rows of at
most ``BLOCK`` elements) the row is read once and kept in registers; otherwise it is read in
``BLOCK``-wide steps twice (the sum of squares, then the scaling).
"""

import triton
import triton.language as tl


@triton.jit
def rms_norm(x_ptr, res_ptr, out_ptr, w_ptr, n_cols, row_stride, res_stride, out_stride, eps,
             HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1).to(tl.int64)
    x_row = x_ptr + row * row_stride + grp * n_cols
    r_row = res_ptr + row * res_stride + grp * n_cols
    o_row = out_ptr + row * out_stride + grp * n_cols
    if ONE_PASS:
        # The whole row in registers (the launcher takes this only when n_cols <= BLOCK):
        # one read of x (and the residual), one write.
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            v += tl.load(r_row + offs, mask=mask, other=0.0)
            tl.store(r_row + offs, v, mask=mask)
        rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        tl.store(o_row + offs, v * rstd * w, mask=mask)
        return
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_cols
        v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            v += tl.load(r_row + offs, mask=mask, other=0.0)
            tl.store(r_row + offs, v, mask=mask)
        acc += v * v
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_cols
        if HAS_RESIDUAL:
            v = tl.load(r_row + offs, mask=mask, other=0.0)
        else:
            v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        tl.store(o_row + offs, v * rstd * w, mask=mask)
