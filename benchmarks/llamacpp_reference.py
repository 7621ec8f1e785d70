"""llama.cpp's reference for a GGUF model: its tokenization of varied strings, and for raw text
prompts its greedy continuation (with the top-2 logit gap at every step) and the top-5
log-probabilities at the first generated position. The tests compare Ferrum against this file
(`tests/fixtures/<model>/llamacpp.json`); run it again after changing the prompts:

    target/bench/venv-llamacpp/bin/python benchmarks/llamacpp_reference.py \
        --model models/gemma-3-270m-q4_k_m.gguf --about "..." > tests/fixtures/gemma3-270m/llamacpp.json

Tokenization is llama.cpp's `llama_tokenize` with its special tokens added as the file says
(Gemma: BOS) and special-token text parsed as those tokens (as Hugging Face tokenizers and
Ferrum do). The
continuations decode the prompt ids in one batch, then one token at a time, on 2 threads with
llama.cpp's defaults (f16 KV cache).
"""

import argparse
import json

import llama_cpp as lc
import numpy as np

from llamacpp_greedy import greedy

STRINGS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\n\n",
    "Ünïcödé àccents: café, naïve, São Paulo",
    "中文分词测试：你好，世界！",
    "emoji 🙂🚀 and symbols © ™ €",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "numbers 1234567890 3.14159 -42",
    "<start_of_turn>user text that looks special<end_of_turn>",
]

PROMPTS = [
    ("capital", "The capital of France is"),
    ("story", "Once upon a time, in a small village by the sea,"),
    ("code", "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n"),
    ("list", "Three primary colors are red,"),
    ("science", "Water boils at a temperature of"),
]


def tokenize(vocab, text):
    raw = text.encode()
    n = len(raw) + 16
    buf = (lc.llama_token * n)()
    got = lc.llama_tokenize(vocab, raw, len(raw), buf, n, True, True)
    if got < 0:
        raise SystemExit(f"llama_tokenize needs {-got} tokens")
    return [int(buf[i]) for i in range(got)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--about", default="")
    args = ap.parse_args()

    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(args.model.encode(), lc.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    vocab_h = lc.llama_model_get_vocab(model)
    vocab = lc.llama_vocab_n_tokens(vocab_h)

    tokenization = [{"text": s, "ids": tokenize(vocab_h, s)} for s in STRINGS]

    cases = []
    for name, text in PROMPTS:
        prompt = tokenize(vocab_h, text)
        ids, gaps, logits = greedy(model, vocab, prompt, args.max_tokens, args.threads)
        shifted = logits - logits.max()
        logprobs = shifted - np.log(np.exp(shifted).sum())
        top5 = np.argsort(logprobs)[::-1][:5]
        first_top5 = [[int(t), float(logprobs[t])] for t in top5]
        cases.append({
            "name": name,
            "prompt": text,
            "prompt_ids": prompt,
            "generated_ids": ids,
            "top2_gaps": gaps,
            "first_top5_logprobs": first_top5,
        })
    print(json.dumps({
        "about": args.about,
        "llama_cpp_python": lc.__version__,
        "tokenization": tokenization,
        "cases": cases,
    }, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
