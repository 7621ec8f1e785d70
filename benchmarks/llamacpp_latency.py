"""llama.cpp's raw prefill and decode speed, measured like `ferrum bench latency`.

Runs llama.cpp (through llama-cpp-python's bindings) on the same GGUF with the same token ids:
`--batch-size` sequences each prefill `--input-len` tokens (one llama_decode per prompt), then
decode `--output-len` steps with all sequences in one batch. Prints one JSON object with
`prefill_tok_s` and `decode_tok_s` (medians over `--num-iters` after one warm-up).
"""

import argparse
import ctypes
import json
import statistics
import time

import llama_cpp as lc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--num-iters", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    b = args.batch_size
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = b * (args.input_len + args.output_len) + 64
    cparams.n_batch = max(args.input_len, b)
    cparams.n_ubatch = max(args.input_len, b)
    cparams.n_seq_max = b
    cparams.n_threads = args.threads
    cparams.n_threads_batch = args.threads
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    prompt = [(i * 7919 + 13) % vocab for i in range(args.input_len)]
    batch = lc.llama_batch_init(max(args.input_len, b), 0, b)

    def fill(entries):
        batch.n_tokens = len(entries)
        for j, (tok, pos, seq, logits) in enumerate(entries):
            batch.token[j] = tok
            batch.pos[j] = pos
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = seq
            batch.logits[j] = logits

    def iteration():
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        for s in range(b):
            n = len(prompt)
            fill([(tok, p, s, p == n - 1) for p, tok in enumerate(prompt)])
            if lc.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed (prefill)")
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        nxt = [1] * b
        for step in range(args.output_len):
            fill([(nxt[s], args.input_len + step, s, True) for s in range(b)])
            if lc.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed (decode)")
            for s in range(b):
                row = lc.llama_get_logits_ith(ctx, s)
                arr = (ctypes.c_float * vocab).from_address(ctypes.addressof(row.contents))
                nxt[s] = max(range(vocab), key=arr.__getitem__) if step == 0 else nxt[s]
        decode = time.perf_counter() - t0
        return prefill, decode

    iteration()
    runs = [iteration() for _ in range(args.num_iters)]
    prefill = statistics.median(b * args.input_len / p for p, _ in runs)
    decode = statistics.median(b * args.output_len / d for _, d in runs)
    print(json.dumps({
        "engine": "llama.cpp",
        "version": lc.__version__,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "batch_size": b,
        "threads": args.threads,
        "prefill_tok_s": round(prefill, 2),
        "decode_tok_s": round(decode, 2),
    }))
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)


if __name__ == "__main__":
    main()
