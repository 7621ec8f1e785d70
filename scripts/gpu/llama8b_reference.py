"""Makes a Llama-3.1-8B-shaped model with seeded random bf16 weights on the GPU with
transformers, saves it as a Hugging Face folder, and writes its reference outputs in the
fixtures' format (reference.json: prompt_ids and 16 greedy_ids per case; reference.safetensors:
logits_<i> of shape [len(prompt), vocab]): transformers on the same GPU, bf16 weights, f32
compute (the model upcast), eager attention. Also writes logits_bf16_<i> from bf16 compute,
for the note.

    python scripts/gpu/llama8b_reference.py OUT_DIR

Needs torch, transformers and safetensors (the lent GPU machines have them) and ~50 GB of GPU
memory; used by scripts/test-gpu.sh --llama8b.
"""

import json
import os
import sys
import time

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM


def main(out):
    t0 = time.time()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
    )
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    # Weights of a trained model's scale, so logits are not all near zero.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    print(f"model made and saved in {time.time() - t0:.1f} s", flush=True)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=g).tolist()
               for n in (1, 7, 19, 33)]
    tensors, cases = {}, []
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], device="cuda")
            tensors[f"logits_bf16_{i}"] = model(ids).logits[0].float().cpu()
        model = model.float()
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], device="cuda")
            tensors[f"logits_{i}"] = model(ids).logits[0].float().cpu().contiguous()
            seq, greedy = ids, []
            for _ in range(16):
                nxt = int(model(seq).logits[0, -1].argmax())
                greedy.append(nxt)
                seq = torch.cat([seq, torch.tensor([[nxt]], device="cuda")], 1)
            cases.append({"index": i, "prompt_ids": prompt, "greedy_ids": greedy})
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"about": "transformers, bf16 weights, f32 compute",
                   "cases": cases}, f)
    for i in range(len(prompts)):
        a, b = tensors[f"logits_{i}"], tensors[f"logits_bf16_{i}"]
        print(f"case {i}: transformers bf16 compute vs f32 compute: max |err| / max |logit| "
              f"{((a - b).abs().max() / a.abs().max()).item():.3e}")
    print(f"references written in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
