"""Row-wise addition in place: ``x[r] += y[r]`` (the residual stream), or with ``y_stride`` 0,
``x[r] += y`` for every row (a bias); and ``cast_rows``: ``y[r] = x[r]`` rounded from f32 to
``y``'s type (to nearest even), the input of a vendor product, rounded as the product kernels
round their input tiles.

Grid ``(num_rows, cdiv(n_cols, BLOCK))``.
"""

import triton
import triton.language as tl


@triton.jit
def add_rows(x_ptr, y_ptr, n_cols, x_stride, y_stride, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + r * x_stride + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + r * y_stride + offs, mask=mask, other=0.0)
    tl.store(x_ptr + r * x_stride + offs, x + y, mask=mask)


@triton.jit
def cast_rows(x_ptr, y_ptr, n_cols, x_stride, y_stride, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + r * x_stride + offs, mask=mask, other=0.0)
    tl.store(y_ptr + r * y_stride + offs, x.to(y_ptr.dtype.element_ty), mask=mask)
