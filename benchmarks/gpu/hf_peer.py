"""The peer: transformers' own generation on the same GPU and model folder (bf16 weights and
compute, SDPA attention, its default dynamic KV cache, greedy), measured as `ferrum bench
latency` measures: prefill tok/s of one prompt, and decode tok/s of a batch advancing together
(generate's time for `output_len` tokens less its prefill, over `output_len - 1` steps).
Prints one JSON object per line.

    python3 benchmarks/gpu/hf_peer.py MODEL_DIR --batch-size 1,64 --input-len 128 \
        --output-len 32 --prefill-len 2048
"""

import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def sync_time(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch-size", default="1")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--prefill-len", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    load_s = time.time() - t0
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for b in [int(x) for x in a.batch_size.split(",")]:
            ids = torch.randint(0, vocab, (b, a.input_len), generator=g).cuda()
            mask = torch.ones_like(ids)
            gen = lambda: model.generate(  # noqa: E731
                input_ids=ids, attention_mask=mask, max_new_tokens=a.output_len,
                min_new_tokens=a.output_len, do_sample=False, pad_token_id=0)
            gen()
            prefill = statistics.median(sync_time(lambda: model(ids)) for _ in range(a.repeats))
            total = statistics.median(sync_time(gen) for _ in range(a.repeats))
            decode_s = max(total - prefill, 1e-9)
            print(json.dumps({
                "engine": "transformers", "model": a.model, "batch_size": b,
                "input_len": a.input_len, "output_len": a.output_len, "load_s": load_s,
                "prefill_tok_s": b * a.input_len / prefill,
                "decode_tok_s": b * (a.output_len - 1) / decode_s,
            }), flush=True)
        if a.prefill_len:
            ids = torch.randint(0, vocab, (1, a.prefill_len), generator=g).cuda()
            model(ids)
            t = statistics.median(sync_time(lambda: model(ids)) for _ in range(3))
            print(json.dumps({
                "engine": "transformers", "model": a.model, "batch_size": 1,
                "input_len": a.prefill_len, "prefill_only": True,
                "prefill_tok_s": a.prefill_len / t,
            }), flush=True)


if __name__ == "__main__":
    main()
