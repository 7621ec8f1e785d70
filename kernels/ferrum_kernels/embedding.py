"""Row gather: ``out[t] = table[ids[t]]`` widened to f32.

Grid ``(num_tokens, cdiv(n_cols, BLOCK))``. With an f16/bf16/f32 embedding table this is the
token embedding; with an f32 activation table it gathers the rows whose logits are wanted. The
caller has checked every id against the table's row count.
"""

import triton
import triton.language as tl


@triton.jit
def gather_rows(table_ptr, ids_ptr, out_ptr, n_cols, table_stride, out_stride, scale,
                BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    row = tl.load(ids_ptr + t).to(tl.int64)
    v = tl.load(table_ptr + row * table_stride + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * out_stride + offs, v * scale, mask=mask)


@triton.jit
def resolve_ids(ids_ptr, pending_ptr, prev_ptr, n, BLOCK: tl.constexpr):
    """``ids[pending[2i]] = prev[pending[2i + 1]]`` for ``i < n``: the decode inputs whose
    tokens the previous step sampled, taken where that step left them on the device (an
    overlapped step is enqueued before the host has seen them). Grid ``(cdiv(n, BLOCK),)``.
    The previous step's tokens are rows of the same vocabulary, so they index the table."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    at = tl.load(pending_ptr + 2 * i, mask=m, other=0)
    row = tl.load(pending_ptr + 2 * i + 1, mask=m, other=0)
    tok = tl.load(prev_ptr + row, mask=m, other=0)
    tl.store(ids_ptr + at, tok, mask=m)
