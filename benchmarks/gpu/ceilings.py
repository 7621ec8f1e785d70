"""The GPU's two ceilings, measured: device-to-device copy bandwidth (bytes read + written) and
a large bf16 matrix product's rate (cuBLAS through PyTorch), each the median of timed repeats
on random data after a warm-up. Prints one JSON object.

    python3 benchmarks/gpu/ceilings.py
"""

import json
import statistics

import torch


def timed(fn, repeats=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main():
    dev = torch.cuda.get_device_properties(0)
    n = 1 << 29  # 1 GiB of bf16 per buffer: far past the L2 cache
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    copy_s = timed(lambda: b.copy_(a))
    copy_gb_s = 2 * a.numel() * a.element_size() / copy_s / 1e9
    del a, b
    m = 8192
    x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    mm_s = timed(lambda: x @ y)
    print(json.dumps({
        "device": torch.cuda.get_device_name(0),
        "sms": dev.multi_processor_count,
        "memory_gib": dev.total_memory / 2**30,
        "torch": torch.__version__,
        "copy_gb_s": copy_gb_s,
        "bf16_tflop_s": 2 * m**3 / mm_s / 1e12,
    }))


if __name__ == "__main__":
    main()
