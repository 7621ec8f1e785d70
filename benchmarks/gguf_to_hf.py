"""Writes a GGUF Llama model as a bf16 Hugging Face folder (model.safetensors, config.json and
the tokenizer files of tests/fixtures/smollm2-135m), for engines that need one (vLLM) and for
Ferrum's own safetensors path.

Weights are dequantized by the `gguf` package (gguf-py, llama.cpp's reference reader) and
rounded to bf16; the q and k rows that llama.cpp's converter interleaves are put back in
Hugging Face order.

    python benchmarks/gguf_to_hf.py models/SmolLM2-135M-Instruct.Q4_1.gguf target/bench/smollm2-bf16
"""

import json
import pathlib
import shutil
import sys

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k permutation: within a head, GGUF row 2i+p is HF row p*hd/2+i."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def main() -> None:
    src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    root = pathlib.Path(__file__).resolve().parent.parent
    fixture = root / "tests/fixtures/smollm2-135m"
    config = json.loads((fixture / "config.json").read_text())
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    reader = GGUFReader(str(src))
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
    }
    parts = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    tensors = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape.tolist())]
        w = w.reshape(shape)
        name = t.name
        if name.startswith("blk."):
            _, i, part, kind = name.split(".")
            if part == "attn_q":
                w = unpermute(w, n_head)
            elif part == "attn_k":
                w = unpermute(w, n_kv)
            hf = f"model.layers.{i}.{parts[part]}.{kind}"
        elif name in names:
            hf = names[name]
        else:
            raise SystemExit(f"unexpected tensor {name}")
        tensors[hf] = torch.from_numpy(np.ascontiguousarray(w)).to(torch.bfloat16)
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    # Both spellings (transformers 5 reads `dtype`, older code `torch_dtype`): the fixture's
    # config says float32, and a stale `dtype` would describe these bf16 weights wrongly.
    config["dtype"] = config["torch_dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        shutil.copy(fixture / f, dst / f)
    print(f"wrote {len(tensors)} tensors to {dst}")


if __name__ == "__main__":
    main()
