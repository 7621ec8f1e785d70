"""llama.cpp's greedy continuation of a prompt given as token ids, with the gap between the
two largest logits at every step: the reference Ferrum's greedy output is compared against on
GGUF files (where the two part, a small gap says it is a near-tie, not an error).

Prints one JSON object: {"token_ids": [...], "top2_gaps": [...]}, one entry per generated token.
"""

import argparse
import json

import llama_cpp as lc
import numpy as np


def greedy(model, vocab, prompt, max_tokens, threads):
    """llama.cpp's greedy continuation of `prompt` (token ids) on a fresh context: the ids, the
    top-2 logit gap at each step, and the logits (float64) at the last prompt position."""
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = len(prompt) + max_tokens + 16
    cparams.n_batch = cparams.n_ubatch = max(len(prompt), 1)
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    batch = lc.llama_batch_init(len(prompt), 0, 1)

    def decode(tokens, start):
        batch.n_tokens = len(tokens)
        for j, t in enumerate(tokens):
            batch.token[j], batch.pos[j], batch.n_seq_id[j] = t, start + j, 1
            batch.seq_id[j][0] = 0
            batch.logits[j] = j == len(tokens) - 1
        if lc.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        return np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(vocab,)).astype(np.float64)

    ids, gaps = [], []
    logits, pos = decode(prompt, 0), len(prompt)
    first = logits
    for _ in range(max_tokens):
        top = np.argsort(logits)[-2:]
        ids.append(int(top[1]))
        gaps.append(float(logits[top[1]] - logits[top[0]]))
        logits, pos = decode([ids[-1]], pos), pos + 1
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    return ids, gaps, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",")]

    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(args.model.encode(), lc.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    ids, gaps, _ = greedy(model, vocab, prompt, args.max_tokens, args.threads)
    print(json.dumps({"token_ids": ids, "top2_gaps": gaps}))


if __name__ == "__main__":
    main()
