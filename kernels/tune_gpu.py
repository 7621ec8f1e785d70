"""Times the product kernels at the decode shape (one row of activations) over a grid
of tile sizes, warps and pipeline stages, on a GPU through Triton's JIT, and prints the
fastest configuration per kernel: how `specs.py`'s decode specializations were chosen.

    python kernels/tune_gpu.py

Weights are random (random bytes for the block formats, which times the same as real data:
the kernels do the same work whatever the values); each case rotates over 8 weight copies so
the L2 cache does not hold them.
"""

import itertools
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferrum_kernels import gemm, qgemm  # noqa: E402

N, K = 4096, 4096
COPIES = 8
# The current (first) configuration, then the candidates.
CURRENT = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3)
CONFIGS = [CURRENT] + [dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s)
                       for bn, bk, w, s in itertools.product((16, 32, 64), (128, 256), (4,),
                                                             (3, 4))]
QFORMATS = {"q8_0": (0, 34, 32), "q4_k": (3, 144, 256), "q6_k": (5, 210, 256)}


def time_it(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def run(kind, m):
    x = torch.randn(m, K, device="cuda")
    y = torch.empty(m, N, device="cuda")
    if kind == "bf16":
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        wbytes = N * K * 2
    else:
        fmt, bb, bs = QFORMATS[kind]
        row_bytes = K // bs * bb
        ws = [torch.randint(0, 256, (N, row_bytes), device="cuda", dtype=torch.uint8)
              for _ in range(COPIES)]
        for w in ws:  # small, finite f16 scales
            w.view(N, K // bs, bb)[:, :, (208 if kind == "q6_k" else 0)] = 0
            w.view(N, K // bs, bb)[:, :, (209 if kind == "q6_k" else 1)] = 0x20
        wbytes = N * row_bytes
    best, current = None, None
    for c in CONFIGS:
        bm = c["BLOCK_M"]
        grid = (triton.cdiv(m, bm), triton.cdiv(N, c["BLOCK_N"]))
        i = [0]

        def call():
            w = ws[i[0] % COPIES]
            i[0] += 1
            if kind == "bf16":
                gemm.gemm[grid](x, w, y, y, m, N, K, K, N, HAS_BIAS=0, BLOCK_M=bm,
                                BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"],
                                num_warps=c["num_warps"], num_stages=c["num_stages"])
            else:
                qgemm.qgemm[grid](x, w, y, m, N, K, w.shape[1], K, N,
                                  FORMAT=QFORMATS[kind][0], BLOCK_M=bm, BLOCK_N=c["BLOCK_N"],
                                  BLOCK_K=c["BLOCK_K"], num_warps=c["num_warps"],
                                  num_stages=c["num_stages"])
        try:
            t = time_it(call)
        except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
            print(f"  {kind} {c}: {type(e).__name__}", flush=True)
            continue
        if c is CURRENT:
            current = t
        if best is None or t < best[0]:
            best = (t, c)
    t, c = best
    print(f"{kind} m={m}: current {current * 1e3:.1f} us ({wbytes / current / 1e6:.0f} GB/s); "
          f"best {t * 1e3:.1f} us ({wbytes / t / 1e6:.0f} GB/s, {current / t:.2f}x) with {c}",
          flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), "triton", triton.__version__, flush=True)
    for kind in ("bf16", "q4_k", "q6_k", "q8_0"):
        run(kind, 1)
