"""Writes a Llama-shaped Hugging Face folder (config.json, model.safetensors) with seeded random
bf16 weights made on the GPU: the shapes of Llama-3.1-8B (`8b`) or Llama-3.2-1B (`1b`, tied
embeddings). Weights have a trained model's scale (rows of norm 1), so activations and logits
stay in range; no tokenizer (the latency benchmark feeds token ids).

    python3 benchmarks/gpu/make_model.py OUT_DIR 8b|1b
"""

import json
import os
import sys
import time

import torch
from safetensors.torch import save_file

SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               tie_word_embeddings=False),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64,
               tie_word_embeddings=True),
}


def main(out, shape):
    t0 = time.time()
    s = SHAPES[shape]
    config = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        bos_token_id=128000, eos_token_id=128001, hidden_act="silu", torch_dtype="bfloat16",
        attention_bias=False, mlp_bias=False, **s)
    os.makedirs(out, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    h, i, hd = s["hidden_size"], s["intermediate_size"], s["head_dim"]
    q, kv = s["num_attention_heads"] * hd, s["num_key_value_heads"] * hd

    def mat(rows, cols):
        w = torch.randn(rows, cols, device="cuda", generator=g) / cols**0.5
        return w.to(torch.bfloat16).cpu()

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(torch.bfloat16).cpu()

    t = {"model.embed_tokens.weight": mat(config["vocab_size"], h), "model.norm.weight": norm(h)}
    if not s["tie_word_embeddings"]:
        t["lm_head.weight"] = mat(config["vocab_size"], h)
    for l in range(s["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = mat(q, h)
        t[p + "self_attn.k_proj.weight"] = mat(kv, h)
        t[p + "self_attn.v_proj.weight"] = mat(kv, h)
        t[p + "self_attn.o_proj.weight"] = mat(h, q)
        t[p + "mlp.gate_proj.weight"] = mat(i, h)
        t[p + "mlp.up_proj.weight"] = mat(i, h)
        t[p + "mlp.down_proj.weight"] = mat(h, i)
    save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    params = sum(v.numel() for v in t.values())
    print(f"{shape}: {params / 1e9:.2f} B parameters written to {out} in {time.time() - t0:.1f} s",
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
