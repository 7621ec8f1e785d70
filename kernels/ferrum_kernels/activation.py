"""Gated activations: ``out = act(gate) * up``.

Grid ``(num_tokens, cdiv(n, BLOCK))``. ``gate`` and ``up`` are rows of ``n`` elements at their
own row strides (both may point into one fused gate/up product). ``out`` is f32, or bf16/f16
for a vendor product's input: the f32 result rounded to nearest even, as the product kernels
round their input tiles. ``ACT`` 0 is SiLU (Llama,
Qwen, Mistral, Phi-3), 1 is GELU with the tanh approximation (Gemma).
"""

import triton
import triton.language as tl


@triton.jit
def gated_act(gate_ptr, up_ptr, out_ptr, n, gate_stride, up_stride, out_stride,
              ACT: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gate_ptr + t * gate_stride + offs, mask=mask, other=0.0)
    u = tl.load(up_ptr + t * up_stride + offs, mask=mask, other=0.0)
    if ACT == 0:
        a = g / (1.0 + tl.exp(-g))
    else:
        # 0.5 g (1 + tanh(z)) = g * sigmoid(2 z), z = sqrt(2/pi) (g + 0.044715 g^3)
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = g / (1.0 + tl.exp(-2.0 * z))
    tl.store(out_ptr + t * out_stride + offs, (a * u).to(out_ptr.dtype.element_ty), mask=mask)
