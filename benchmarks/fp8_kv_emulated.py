"""What the fp8 KV cache's rounding does to a real model, measured where no GPU is: transformers
runs the model (f32, weights dequantized from the GGUF file) with its keys and values rounded
as Ferrum's caches store them, and the figures compare an fp8 cache against an f16 cache on the
protocol of `ferrum bench perplexity --reference-kv-cache-dtype f16` (chunks of 512 tokens,
second halves scored, KL divergence, argmax agreement, last-position logits, greedy
continuations of 128 tokens).

The fp8 rounding is the kernels' (`kernels/ferrum_kernels/fp8.py`, whose bytes and scales
`kernels/tests/test_fp8.py` checks exactly against a table-search encoder): each (token, KV
head) row of keys (after RoPE) or values is multiplied by `448 / amax` (f32, correctly
rounded), rounded to e4m3 to nearest even (`torch.float8_e4m3fn`), and read back times
`amax / 448`. The f16 cache rounds each value to f16. Attention over the rounded rows runs in
f32 here; the GPU kernels add their own rounding of the query and probabilities (within 1e-4
of f32 in decode, 1e-2 in prefill attention, relative to the largest output; test_kernels).
So this measures the cache format on a real model, not Ferrum's GPU path: that needs a GPU and
a real model on it.

    python3 -m venv v && v/bin/pip install torch transformers gguf numpy
    v/bin/python benchmarks/fp8_kv_emulated.py models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf \
        benchmarks/texts/heldout.md [--json out.json]
"""

import argparse
import json
import math
import os
import sys
import time

import torch
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

FP8_MAX = 448.0


def fp8_rows(x):
    """Each row of the last axis as the fp8 cache reads it back (f32)."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    inv = torch.where(amax > 0, FP8_MAX / safe, torch.zeros_like(amax))
    q = (x * inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return q * (amax / FP8_MAX)


def f16_rows(x):
    return x.half().float()


def f32_rows(x):
    return x.float()


# Each setting: how keys and values are rounded. `--diagnose` adds the partial ones.
SETTINGS = {
    "f16": (f16_rows, f16_rows),
    "fp8": (fp8_rows, fp8_rows),
    "f32": (f32_rows, f32_rows),
    "fp8-keys": (fp8_rows, f16_rows),
    "fp8-values": (f16_rows, fp8_rows),
}


class Cache:
    """Which rounding the attention below applies to keys and values."""
    keys = staticmethod(f16_rows)
    values = staticmethod(f16_rows)

    @classmethod
    def use(cls, setting):
        k, v = SETTINGS[setting]
        cls.keys, cls.values = staticmethod(k), staticmethod(v)


def cached_attention(module, query, key, value, attention_mask, **kwargs):
    # key, value: [batch, kv_heads, seq, head_dim], keys after RoPE: what the cache stores.
    # Rounding is per row, so rounding the past rows again on each call gives the same values.
    key = Cache.keys(key).to(query.dtype)
    value = Cache.values(value).to(query.dtype)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register("ferrum_cache", cached_attention)


def log_softmax64(logits):
    return torch.log_softmax(logits.double(), dim=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--greedy-prompts", type=int, default=4)
    ap.add_argument("--greedy-tokens", type=int, default=128)
    ap.add_argument("--json")
    ap.add_argument("--diagnose", action="store_true",
                    help="also score f32 keys and values, and fp8 keys or values alone")
    a = ap.parse_args()
    torch.manual_seed(0)
    d, name = os.path.split(os.path.abspath(a.gguf))
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="ferrum_cache")
    model.eval()
    with open(a.text, encoding="utf-8") as f:
        ids = tok(f.read(), add_special_tokens=False)["input_ids"]
    chunks = min(a.chunks, len(ids) // a.ctx)
    print(f"{name}: {len(ids)} tokens, {chunks} chunks of {a.ctx} "
          f"(loaded in {time.time() - t0:.0f} s)", file=sys.stderr)
    half = a.ctx // 2
    settings = list(SETTINGS) if a.diagnose else ["f16", "fp8"]
    nll = {s: 0.0 for s in settings}
    kl_sum, kl_max, agree, scored, last_err = 0.0, 0.0, 0, 0, 0.0
    with torch.inference_mode():
        for c in range(chunks):
            x = torch.tensor([ids[c * a.ctx:(c + 1) * a.ctx]])
            out = {}
            for mode in settings:
                Cache.use(mode)
                out[mode] = model(x).logits[0].float()
            targets = x[0, half:]
            for mode in out:
                lp = log_softmax64(out[mode][half - 1:-1])
                nll[mode] -= lp.gather(1, targets[:, None]).sum().item()
            p_ref = log_softmax64(out["f16"][half - 1:-1])
            p_mod = log_softmax64(out["fp8"][half - 1:-1])
            kl = (p_ref.exp() * (p_ref - p_mod)).sum(-1)
            kl_sum += kl.sum().item()
            kl_max = max(kl_max, kl.max().item())
            agree += (p_ref.argmax(-1) == p_mod.argmax(-1)).sum().item()
            scored += targets.numel()
            r, m = out["f16"][-1], out["fp8"][-1]
            last_err = max(last_err, ((r - m).abs().max() / r.abs().max()).item())
            ppl = ", ".join(f"{m} {math.exp(nll[m] / scored):.4f}" for m in settings)
            print(f"chunks 0-{c}: perplexity {ppl} ({time.time() - t0:.0f} s)", file=sys.stderr)
        greedy = []
        for g in range(min(a.greedy_prompts, chunks)):
            prompt = torch.tensor([ids[g * a.ctx:g * a.ctx + half]])
            seqs = {}
            for mode in ("f16", "fp8"):
                Cache.use(mode)
                gen = model.generate(prompt, max_new_tokens=a.greedy_tokens, do_sample=False,
                                     min_new_tokens=a.greedy_tokens)
                seqs[mode] = gen[0, half:].tolist()
            f, q = seqs["f16"], seqs["fp8"]
            first = next((i for i, (u, v) in enumerate(zip(f, q)) if u != v), len(f))
            equal = sum(u == v for u, v in zip(f, q))
            greedy.append({"first_difference": first, "equal": equal, "tokens": len(f)})
            print(f"greedy {g}: {equal} equal, first difference at {first}", file=sys.stderr)
    result = {
        "model": name,
        "text": os.path.basename(a.text),
        "tokens": len(ids),
        "ctx": a.ctx,
        "chunks": chunks,
        "scored_tokens": scored,
        "perplexity": {m: math.exp(nll[m] / scored) for m in settings},
        "mean_kl": kl_sum / scored,
        "max_kl": kl_max,
        "top1_agreement": agree / scored,
        "last_logit_err": last_err,
        "greedy": greedy,
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
