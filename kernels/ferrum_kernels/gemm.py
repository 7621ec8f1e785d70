"""Dense product with a float weight: ``y = x @ w.T (+ bias)``.

``x`` is ``[m, k]`` f32 (row stride ``x_stride``), ``w`` is ``[n, k]`` in f32, f16 or bf16 as
stored (rows contiguous, stride ``k``), ``y`` is ``[m, n]`` f32 (row stride ``y_stride``),
``bias`` ``[n]`` f32. Grid ``(cdiv(m, BLOCK_M), cdiv(n, BLOCK_N))``.

With an f32 weight the product runs in full f32 (``ieee``: no tf32), so the f32 fixtures stay
within 1e-4 of the reference. With an f16 or bf16 weight, each tile of ``x`` is rounded to the
weight's type and the products accumulate in f32 on the tensor cores, as transformers computes
a bf16 model.
"""

import triton
import triton.language as tl


@triton.jit
def gemm(x_ptr, w_ptr, bias_ptr, y_ptr, m, n, k, x_stride, y_stride,
         HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        kk = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * x_stride + kk[None, :],
                    mask=(rm[:, None] < m) & (kk[None, :] < k), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * k + kk[:, None],
                    mask=(rn[None, :] < n) & (kk[:, None] < k), other=0.0)
        if w_ptr.dtype.element_ty == tl.float32:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a.to(w_ptr.dtype.element_ty), b)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < n, other=0.0)[None, :]
    tl.store(y_ptr + rm[:, None] * y_stride + rn[None, :], acc,
             mask=(rm[:, None] < m) & (rn[None, :] < n))


@triton.jit
def gated_left(x_ptr, up_ptr, rm, kk, mask, x_stride, GATED: tl.constexpr):
    """A split product's left tile, rows ``rm`` and columns ``kk`` of ``x``; with ``GATED``
    1 (SiLU) or 2 (GELU, tanh form), ``act(x) * up`` (``up`` at ``x``'s stride), computed as
    ``gated_act`` computes it."""
    a = tl.load(x_ptr + rm[:, None] * x_stride + kk[None, :], mask=mask, other=0.0)
    if GATED != 0:
        u = tl.load(up_ptr + rm[:, None] * x_stride + kk[None, :], mask=mask, other=0.0)
        if GATED == 1:
            a = a / (1.0 + tl.exp(-a))
        else:
            zz = 0.7978845608028654 * (a + 0.044715 * a * a * a)
            a = a / (1.0 + tl.exp(-2.0 * zz))
        a = a * u
    return a


@triton.jit
def finish_split(acc, part_ptr, y_ptr, count_ptr, rm, rn, m, n, y_stride, splits):
    """Ends a split-K program with its ``[BLOCK_M, BLOCK_N]`` tile ``acc``. With one range,
    ``acc`` is the product: stored to ``y`` (row stride ``y_stride``). With more, ``acc`` goes
    to ``part[z, m, n]`` (f32) and the last range of the tile to arrive, counted by an atomic
    per output tile in ``count`` (``[cdiv(m, BLOCK_M) * cdiv(n, BLOCK_N)]`` i32, zero before
    the launch), adds the partials in ``z`` order, stores the sum to ``y`` and sets the count
    back to zero for the next launch. Which range arrives last does not change the sum: the
    result is deterministic, and the same bits as a separate sum kernel's."""
    mask = (rm[:, None] < m) & (rn[None, :] < n)
    if splits == 1:
        tl.store(y_ptr + rm[:, None] * y_stride + rn[None, :], acc, mask=mask)
    else:
        at = rm[:, None] * n + rn[None, :]
        tl.store(part_ptr + tl.program_id(2).to(tl.int64) * m * n + at, acc, mask=mask)
        # Every warp's stores before the count moves; the atomic's release publishes them
        # (cumulatively, after the barrier) and its acquire, in the last program, orders them
        # before that program's reads, which go to L2 (.cg: the L1 caches are not coherent).
        tl.debug_barrier()
        tile = count_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        arrived = tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            total = tl.zeros_like(acc)
            for z in range(0, splits):
                total += tl.load(part_ptr + (z * m).to(tl.int64) * n + at, mask=mask,
                                 other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + rm[:, None] * y_stride + rn[None, :], total, mask=mask)
            tl.atomic_xchg(tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def gemm_split(x_ptr, up_ptr, w_ptr, part_ptr, y_ptr, count_ptr, m, n, k, x_stride,
               k_per_split, y_stride, splits, GATED: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Split-K product for few rows: grid ``(cdiv(m, BLOCK_M), cdiv(n, BLOCK_N), splits)``;
    program ``(i, j, z)`` multiplies the columns ``z * k_per_split ..`` (``k_per_split`` of
    them, the last range cut at ``k``), and ``finish_split`` stores the tile (one range) or
    its partial, the last range of the tile adding them in ``z`` order into ``y``: one launch,
    deterministic. The tile arithmetic is ``gemm``'s. ``GATED`` 1 (SiLU) or 2 (GELU, tanh
    form) makes the left operand ``act(x) * up`` (``up`` at ``x``'s stride), ``gated_act``'s
    arithmetic in registers: the MLP's down product without the gated rows written and read
    back."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    z = tl.program_id(2)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    k_lo = z * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, k)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + rk
        amask = (rm[:, None] < m) & (kk[None, :] < k_hi)
        a = gated_left(x_ptr, up_ptr, rm, kk, amask, x_stride, GATED)
        b = tl.load(w_ptr + rn[None, :] * k + kk[:, None],
                    mask=(rn[None, :] < n) & (kk[:, None] < k_hi), other=0.0)
        if w_ptr.dtype.element_ty == tl.float32:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a.to(w_ptr.dtype.element_ty), b)
    finish_split(acc, part_ptr, y_ptr, count_ptr, rm, rn, m, n, y_stride, splits)
