"""Times the kernels on a GPU against PyTorch's (cuBLAS, SDPA) at model shapes: the baseline
that the CUDA speed work starts from. Needs torch and Triton on a CUDA machine.

    python kernels/bench_gpu.py

Prints one line per case: the median time (``triton.testing.do_bench``), the achieved
bandwidth or TFLOP/s, and the ratio to the PyTorch reference. Inputs are random, never zeros.
"""

import math
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferrum_kernels import attention, gemm  # noqa: E402


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def gemm_cases():
    for m, n, k in ((1, 4096, 4096), (16, 4096, 4096), (128, 14336, 4096), (2048, 4096, 4096)):
        x = torch.randn(m, k, device="cuda")
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, n, device="cuda")
        grid = (triton.cdiv(m, 32), triton.cdiv(n, 64))

        def ours():
            gemm.gemm[grid](x, w, y, y, m, n, k, k, n, HAS_BIAS=0, BLOCK_M=32, BLOCK_N=64,
                            BLOCK_K=32, num_warps=4)

        def ref():
            torch.matmul(x.to(torch.bfloat16), w.T)

        ours()
        want = x.to(torch.bfloat16).float() @ w.float().T
        err = ((y - want).norm() / want.norm()).item()
        t_ours, t_ref = bench(ours), bench(ref)
        flops = 2 * m * n * k
        bytes_ = n * k * 2 + m * k * 4 + m * n * 4
        print(f"gemm bf16 {m}x{n}x{k}: {t_ours * 1e3:8.1f} us  {flops / t_ours / 1e9:7.1f} "
              f"TFLOP/s  {bytes_ / t_ours / 1e6:7.0f} GB/s  torch {t_ref * 1e3:8.1f} us  "
              f"ratio {t_ref / t_ours:5.2f}  rel err {err:.1e}")


def attention_cases():
    # Decode: 32 sequences, Llama-3-8B heads (32 q, 8 kv, 128), bf16 cache, 16-token blocks.
    for num_seqs, ctx in ((32, 1024), (8, 8192)):
        nh, nkv, hd, bs = 32, 8, 128, 16
        blocks_per = ctx // bs
        num_blocks = num_seqs * blocks_per
        k_cache = torch.randn(num_blocks * bs, nkv, hd, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        perm = torch.randperm(num_blocks, device="cuda").to(torch.int32)
        bt_start = torch.arange(num_seqs, device="cuda", dtype=torch.int32) * blocks_per
        pos = torch.full((num_seqs,), ctx - 1, device="cuda", dtype=torch.int32)
        q = torch.randn(num_seqs, nh * hd, device="cuda")
        out = torch.empty_like(q)
        scale = 1 / math.sqrt(hd)

        def ours():
            attention.paged_attention[(num_seqs, nh)](
                q, k_cache, v_cache, perm, bt_start, pos, out, nh * hd, nh * hd, nh // nkv, nkv,
                hd, bs, 0, scale, 0.0, BLOCK_N=32, D_BLOCK=128, num_warps=4)

        kk = k_cache[(perm.view(num_seqs, blocks_per, 1).long() * bs
                      + torch.arange(bs, device="cuda")).view(num_seqs, ctx)]
        vv = v_cache[(perm.view(num_seqs, blocks_per, 1).long() * bs
                      + torch.arange(bs, device="cuda")).view(num_seqs, ctx)]
        qq = q.view(num_seqs, nh, 1, hd).to(torch.bfloat16)
        kt = kk.permute(0, 2, 1, 3).repeat_interleave(nh // nkv, 1)
        vt = vv.permute(0, 2, 1, 3).repeat_interleave(nh // nkv, 1)

        def ref():
            torch.nn.functional.scaled_dot_product_attention(qq, kt, vt)

        ours()
        want = torch.nn.functional.scaled_dot_product_attention(
            qq.float(), kt.float(), vt.float()).view(num_seqs, nh * hd)
        err = ((out - want).norm() / want.norm()).item()
        t_ours, t_ref = bench(ours), bench(ref)
        bytes_ = 2 * num_seqs * ctx * nkv * hd * 2
        print(f"decode attention {num_seqs} seqs x {ctx}: {t_ours * 1e3:8.1f} us  "
              f"{bytes_ / t_ours / 1e6:7.0f} GB/s  torch sdpa (contiguous, no paging) "
              f"{t_ref * 1e3:8.1f} us  ratio {t_ref / t_ours:5.2f}  rel err {err:.1e}")


if __name__ == "__main__":
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    gemm_cases()
    attention_cases()
