"""Every kernel specialization that ``build.py`` compiles and the ``ferrum`` binary embeds.

A specialization fixes a kernel's pointer element types and constexprs. Its ``name`` is what
the Rust side asks for (``crates/runtime/src/cuda/kernels.rs``); ``params`` lists the
non-constexpr parameters in order with their Triton types, which the compiled ABI follows
(then Triton's two scratch pointers).

``kernels/tuning.json``, when present, is a tuning sweep's choice (``kernels/sweep.py run``
writes it as ``RESULTS/tuning.json``, measured through the engine on a GPU): for each family,
the kernels it names take its constexprs, ``num_warps`` and ``num_stages`` over the defaults
below. Absent, the defaults ship.
"""

import json
import os

# The sweep's choices the build takes (see the docstring).
TUNING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning.json")

# Float element types of weights and KV caches, by the name used in specialization names.
FLOATS = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}

# Element types of KV caches: the floats, and fp8 (e4m3 bytes with a scale per row, fp8.py).
KV_TYPES = dict(FLOATS, fp8="u8")

# GGUF block formats the quantized product decodes, in its FORMAT order (qgemm.py).
QUANTS = ("q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k", "q5_0", "q5_1")

# Head sizes the attention and KV kernels are specialized for (a head of d elements uses the
# smallest block >= d; the Llama family uses 64 and 128, Gemma 3 256).
HEAD_BLOCKS = (32, 64, 128, 256)


# Decode-shaped products (at most DECODE_M activation rows): narrow, deep tiles so a single
# row reads the weights at bandwidth. Chosen by kernels/tune_gpu.py (JIT builds, since retired)
# on an H200 (m = 1, 4096 x 4096): bf16 18.4 us against 63.7 with the prefill tiles, Q4_K 85
# against 237, Q6_K 60 against 148, Q8_0 50 against 130. Pipeline stages per architecture:
# sm_80's 3 keep a bf16 tile's shared memory (96 KiB) within what RTX 30/40 cards (sm_86/89,
# 99 KiB) allow.
DECODE_M = 16
DECODE_STAGES = {"sm80": 3, "sm90": 4}

# Products of many rows with a half-precision weight (prefill chunks above LARGE_M rows): wide,
# pipelined tiles (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages per architecture); sm_80's single
# stage keeps shared memory within the 99 KiB of RTX 30/40 cards (sm_86/89). Measured on an
# H100 (kernels/NOTES.md): 64 x 128 tiles at 64 to 128 rows gave too few programs (32 for 4096
# outputs) and ran 2.3x slower than the 32 x 64 tiles, so fewer rows keep those.
LARGE_M = 512
LARGE_TILES = (128, 128, 64, 8, {"sm80": 1, "sm90": 3})

# One-pass RMSNorm (rms_norm_res*_w{width}): row widths and warps; wider rows take the
# two-pass kernel.
NORM_ONE_PASS = ((256, 1), (1024, 4), (4096, 8), (8192, 16))

# Decode attention (paged_attention, paged_attention_split): one program takes up to
# DECODE_HEADS query heads of one KV head (a GQA group, padded to the tensor cores' 16 rows)
# and reads each tile of DECODE_KEYS[head block] keys once for all of them.
DECODE_HEADS = 16
DECODE_KEYS = {32: 64, 64: 64, 128: 64, 256: 32}

# Prefill attention tiles: BLOCK_M query tokens against BLOCK_N keys per step (tensor cores).
# The key tile narrows as the head widens, so a K and a V tile per stage stay within shared
# memory; f32 caches (the reference path) take one stage.
PREFILL_M = 64
PREFILL_N = {32: 64, 64: 64, 128: 32, 256: 16}


# The aligned variant: beside each generic binary, the build compiles one that may assume every
# pointer 16-byte aligned and these integer parameters multiples of 16, as Triton's JIT
# specializes on the values it sees (``tt.divisibility`` 16). Sizes, strides, head sizes and
# row bytes are multiples of 16 on every real model; row counts, group sizes, windows and
# split counts are not, and stay unhinted. The launcher checks each hinted argument at every
# launch and takes the generic binary when one does not qualify.
ALIGNED_INTS = frozenset({
    "k", "n", "n_cols", "head_dim", "k_per_split", "row_bytes", "block_size", "rot_half",
    "x_stride", "y_stride", "out_stride", "q_stride", "src_stride", "row_stride", "res_stride",
    "gate_stride", "up_stride"})


def dispatch():
    """What the launcher must know of the specializations above to pick among them, written
    into the manifest (``dispatch``) so the Rust side reads these values instead of keeping
    copies: products of at most ``decode_m`` rows take the decode tiles, of more than
    ``large_m`` rows (half-precision weights) the large ones; prefill attention tiles are
    ``prefill_m`` query tokens; attention and KV kernels exist for the ``head_blocks``."""
    return {"decode_m": DECODE_M, "large_m": LARGE_M, "prefill_m": PREFILL_M,
            "head_blocks": list(HEAD_BLOCKS)}


def aligned_hints(spec):
    """The parameters the aligned variant of ``spec`` assumes divisible by 16, in order."""
    return [name for name, ty in spec["params"]
            if ty.startswith("*") or (ty in ("i32", "u32") and name in ALIGNED_INTS)]


def _spec(name, module, function, params, constexprs, num_warps=4, num_stages=None):
    return {
        "name": name,
        "module": module,
        "function": function,
        "params": params,
        "constexprs": constexprs,
        "num_warps": num_warps,
        # None: Triton's default; a dict: per architecture.
        "num_stages": num_stages,
    }


def apply_tuning(specs, path):
    """``specs`` with the choices of the tuning file at ``path`` applied (none when it does not
    exist). A choice that names no kernel, or a constexpr its kernel lacks, is an error: a
    stale file must not be half applied."""
    if not os.path.exists(path):
        return specs
    with open(path) as f:
        tuning = json.load(f)
    by_name = {s["name"]: s for s in specs}
    for family, choice in tuning.get("families", {}).items():
        o = choice.get("overrides", {})
        for name in choice["kernels"]:
            spec = by_name.get(name)
            if spec is None:
                raise ValueError(f"{path}: {family} names no kernel {name}")
            extra = set(o.get("constexprs", {})) - set(spec["constexprs"])
            if extra:
                raise ValueError(f"{path}: {name} has no constexpr {', '.join(sorted(extra))}")
            spec["constexprs"] = dict(spec["constexprs"], **o.get("constexprs", {}))
            spec["num_warps"] = o.get("num_warps", spec["num_warps"])
            spec["num_stages"] = o.get("num_stages", spec["num_stages"])
    return specs


def all_specs(tuning=TUNING):
    """The list of specializations, in a stable order, with ``tuning``'s choices applied."""
    specs = []
    norm_params = [("x_ptr", "*fp32"), ("res_ptr", "*fp32"), ("out_ptr", "*fp32"),
                   ("w_ptr", "*fp32"), ("n_cols", "i32"), ("row_stride", "i32"),
                   ("res_stride", "i32"), ("out_stride", "i32"), ("eps", "fp32")]
    for has_res in (0, 1):
        specs.append(_spec(
            f"rms_norm_res{has_res}", "norm", "rms_norm", norm_params,
            {"HAS_RESIDUAL": has_res, "BLOCK": 1024, "ONE_PASS": 0}))
        # Rows of at most `width` elements in one pass (the backend takes the narrowest that
        # holds the row): per-head norms, then hidden sizes up to 8192.
        for width, warps in NORM_ONE_PASS:
            specs.append(_spec(
                f"rms_norm_res{has_res}_w{width}", "norm", "rms_norm", norm_params,
                {"HAS_RESIDUAL": has_res, "BLOCK": width, "ONE_PASS": 1}, num_warps=warps))
    specs.append(_spec(
        "rope", "rope", "rope",
        [("x_ptr", "*fp32"), ("pos_ptr", "*u32"), ("inv_freq_ptr", "*fp32"),
         ("row_stride", "i32"), ("head_dim", "i32"), ("rot_half", "i32"), ("scale", "fp32")],
        {"HALF_BLOCK": 128}, num_warps=1))
    specs.append(_spec(
        "add_rows", "elementwise", "add_rows",
        [("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("n_cols", "i32"), ("x_stride", "i32"),
         ("y_stride", "i32")],
        {"BLOCK": 1024}))
    for act, act_name in ((0, "silu"), (1, "gelu_tanh")):
        specs.append(_spec(
            f"gated_{act_name}", "activation", "gated_act",
            [("gate_ptr", "*fp32"), ("up_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"),
             ("gate_stride", "i32"), ("up_stride", "i32"), ("out_stride", "i32")],
            {"ACT": act, "BLOCK": 1024}))
    # The inputs of vendor products (cuBLASLt) of a half-precision weight: activations rounded
    # to the weight's type, as the product kernels round their tiles.
    for short in ("f16", "bf16"):
        ty = FLOATS[short]
        specs.append(_spec(
            f"cast_rows_{short}", "elementwise", "cast_rows",
            [("x_ptr", "*fp32"), ("y_ptr", f"*{ty}"), ("n_cols", "i32"), ("x_stride", "i32"),
             ("y_stride", "i32")],
            {"BLOCK": 1024}))
        for act, act_name in ((0, "silu"), (1, "gelu_tanh")):
            specs.append(_spec(
                f"gated_{act_name}_{short}", "activation", "gated_act",
                [("gate_ptr", "*fp32"), ("up_ptr", "*fp32"), ("out_ptr", f"*{ty}"),
                 ("n", "i32"), ("gate_stride", "i32"), ("up_stride", "i32"),
                 ("out_stride", "i32")],
                {"ACT": act, "BLOCK": 1024}))
    for short, ty in FLOATS.items():
        specs.append(_spec(
            f"gather_rows_{short}", "embedding", "gather_rows",
            [("table_ptr", f"*{ty}"), ("ids_ptr", "*u32"), ("out_ptr", "*fp32"),
             ("n_cols", "i32"), ("table_stride", "i32"), ("out_stride", "i32"),
             ("scale", "fp32")],
            {"BLOCK": 1024}))
    for short, ty in FLOATS.items():
        params = [("x_ptr", "*fp32"), ("w_ptr", f"*{ty}"), ("bias_ptr", "*fp32"),
                  ("y_ptr", "*fp32"), ("m", "i32"), ("n", "i32"), ("k", "i32"),
                  ("x_stride", "i32"), ("y_stride", "i32")]
        for has_bias in (0, 1):
            specs.append(_spec(
                f"gemm_{short}_bias{has_bias}", "gemm", "gemm", params,
                {"HAS_BIAS": has_bias, "BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32}))
        specs.append(_spec(
            f"gemm_{short}_decode", "gemm", "gemm", params,
            {"HAS_BIAS": 0, "BLOCK_M": DECODE_M, "BLOCK_N": 32, "BLOCK_K": 256},
            num_stages=DECODE_STAGES))
        for gated, suffix in ((0, ""), (1, "_silu"), (2, "_gelu")):
            specs.append(_spec(
                f"gemm_{short}_split{suffix}", "gemm", "gemm_split",
                [("x_ptr", "*fp32"), ("up_ptr", "*fp32"), ("w_ptr", f"*{ty}"),
                 ("part_ptr", "*fp32"), ("y_ptr", "*fp32"), ("count_ptr", "*i32"),
                 ("m", "i32"), ("n", "i32"), ("k", "i32"), ("x_stride", "i32"),
                 ("k_per_split", "i32"), ("y_stride", "i32"), ("splits", "i32")],
                {"GATED": gated, "BLOCK_M": DECODE_M, "BLOCK_N": 32, "BLOCK_K": 256},
                num_stages=DECODE_STAGES))
        if short != "f32":
            bm, bn, bk, warps, stages = LARGE_TILES
            specs.append(_spec(
                f"gemm_{short}_large", "gemm", "gemm", params,
                {"HAS_BIAS": 0, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
                num_warps=warps, num_stages=stages))
    for fmt, name in enumerate(QUANTS):
        params = [("x_ptr", "*fp32"), ("w_ptr", "*u8"), ("y_ptr", "*fp32"), ("m", "i32"),
                  ("n", "i32"), ("k", "i32"), ("row_bytes", "i32"), ("x_stride", "i32"),
                  ("y_stride", "i32")]
        specs.append(_spec(
            f"qgemm_{name}", "qgemm", "qgemm", params,
            {"FORMAT": fmt, "BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32}))
        specs.append(_spec(
            f"qgemm_{name}_decode", "qgemm", "qgemm", params,
            {"FORMAT": fmt, "BLOCK_M": DECODE_M, "BLOCK_N": 16, "BLOCK_K": 256},
            num_stages=DECODE_STAGES))
        for gated, suffix in ((0, ""), (1, "_silu"), (2, "_gelu")):
            specs.append(_spec(
                f"qgemm_{name}_split{suffix}", "qgemm", "qgemm_split",
                [("x_ptr", "*fp32"), ("up_ptr", "*fp32"), ("w_ptr", "*u8"),
                 ("part_ptr", "*fp32"), ("y_ptr", "*fp32"), ("count_ptr", "*i32"),
                 ("m", "i32"), ("n", "i32"), ("k", "i32"), ("row_bytes", "i32"),
                 ("x_stride", "i32"), ("k_per_split", "i32"), ("y_stride", "i32"),
                 ("splits", "i32")],
                {"FORMAT": fmt, "GATED": gated, "BLOCK_M": DECODE_M, "BLOCK_N": 16,
                 "BLOCK_K": 256},
                num_stages=DECODE_STAGES))
        specs.append(_spec(
            f"qgather_rows_{name}", "qgemm", "qgather_rows",
            [("table_ptr", "*u8"), ("ids_ptr", "*u32"), ("out_ptr", "*fp32"),
             ("n_cols", "i32"), ("row_bytes", "i32"), ("out_stride", "i32"), ("scale", "fp32")],
            {"FORMAT": fmt, "BLOCK": 256}))
    specs.append(_spec(
        "argmax_rows", "sampling", "argmax_rows",
        [("logits_ptr", "*fp32"), ("out_ptr", "*u32"), ("n_cols", "i32"), ("row_stride", "i32")],
        {"BLOCK": 2048}, num_warps=8))
    specs.append(_spec(
        "resolve_ids", "embedding", "resolve_ids",
        [("ids_ptr", "*u32"), ("pending_ptr", "*u32"), ("prev_ptr", "*u32"), ("n", "i32")],
        {"BLOCK": 256}))
    specs.append(_spec(
        "sample_prepare", "sampling", "sample_prepare",
        [("logits_ptr", "*fp32"), ("work_ptr", "*fp32"), ("mask_ptr", "*u32"),
         ("mask_off_ptr", "*i32"), ("n_cols", "i32"), ("row_stride", "i32")],
        {"BLOCK": 1024}))
    specs.append(_spec(
        "logit_edits", "sampling", "logit_edits",
        [("work_ptr", "*fp32"), ("edit_off_ptr", "*i32"), ("tok_ptr", "*u32"),
         ("rep_ptr", "*fp32"), ("sub_ptr", "*fp32"), ("bias_ptr", "*fp32"), ("mask_ptr", "*u32"),
         ("mask_off_ptr", "*i32"), ("n_cols", "i32"), ("row_stride", "i32")],
        {"BLOCK": 256}))
    specs.append(_spec(
        "sample_rows", "sampling", "sample_rows",
        [("src_ptr", "*fp32"), ("inv_t_ptr", "*fp32"), ("ln_min_p_ptr", "*fp32"),
         ("top_k_ptr", "*i32"), ("top_p_ptr", "*fp32"), ("u_ptr", "*fp64"), ("out_ptr", "*u32"),
         ("n_cols", "i32"), ("row_stride", "i32")],
        {"BLOCK": 2048}, num_warps=8))
    specs.append(_spec(
        "row_logprobs", "sampling", "row_logprobs",
        [("logits_ptr", "*fp32"), ("tok_ptr", "*u32"), ("n_ptr", "*i32"), ("lp_ptr", "*fp32"),
         ("top_id_ptr", "*u32"), ("top_val_ptr", "*fp32"), ("n_cols", "i32"),
         ("row_stride", "i32"), ("max_n", "i32")],
        {"BLOCK": 2048}, num_warps=8))
    for short, ty in KV_TYPES.items():
        # An fp8 cache's kernels (``*_fp8`` functions) take each buffer's row scales after it.
        fp8 = short == "fp8"
        fn = "_fp8" if fp8 else ""

        def cache(*before, after=()):
            scales = [("k_scale_ptr", "*fp32"), ("v_scale_ptr", "*fp32")] if fp8 else []
            return (list(before) + [("k_cache_ptr", f"*{ty}"), ("v_cache_ptr", f"*{ty}")]
                    + scales + list(after))

        for d in HEAD_BLOCKS:
            specs.append(_spec(
                f"kv_write_{short}_d{d}", "kv_write", f"kv_write{fn}",
                cache(("k_ptr", "*fp32"), ("v_ptr", "*fp32"))
                + [("slot_ptr", "*u32"), ("src_stride", "i32"), ("num_kv_heads", "i32"),
                   ("head_dim", "i32")],
                {"D_BLOCK": d}, num_warps=1))
            specs.append(_spec(
                f"rope_kv_write_{short}_d{d}", "kv_write", f"rope_kv_write{fn}",
                cache(("k_ptr", "*fp32"), ("v_ptr", "*fp32"))
                + [("slot_ptr", "*u32"), ("pos_ptr", "*u32"), ("inv_freq_ptr", "*fp32"),
                   ("src_stride", "i32"), ("num_kv_heads", "i32"), ("head_dim", "i32"),
                   ("rot_half", "i32"), ("scale", "fp32")],
                {"D_BLOCK": d}, num_warps=1))
            specs.append(_spec(
                f"paged_attention_{short}_d{d}", "attention", f"paged_attention{fn}",
                cache(("q_ptr", "*fp32")) + [
                 ("block_tables_ptr", "*u32"), ("bt_start_ptr", "*u32"), ("pos_ptr", "*u32"),
                 ("tok_ptr", "*u32"), ("out_ptr", "*fp32"), ("q_stride", "i32"), ("out_stride", "i32"),
                 ("group", "i32"), ("num_kv_heads", "i32"), ("head_dim", "i32"),
                 ("block_size", "i32"), ("window", "i32"), ("scale", "fp32"),
                 ("softcap", "fp32")],
                {"BLOCK_N": DECODE_KEYS[d], "D_BLOCK": d, "G_BLOCK": DECODE_HEADS}))
            specs.append(_spec(
                f"paged_attention_split_{short}_d{d}", "attention", f"paged_attention_split{fn}",
                cache(("q_ptr", "*fp32")) + [
                 ("block_tables_ptr", "*u32"), ("bt_start_ptr", "*u32"), ("pos_ptr", "*u32"),
                 ("tok_ptr", "*u32"), ("out_ptr", "*fp32"), ("part_ptr", "*fp32"),
                 ("q_stride", "i32"), ("out_stride", "i32"), ("group", "i32"),
                 ("num_kv_heads", "i32"), ("head_dim", "i32"), ("block_size", "i32"),
                 ("window", "i32"), ("scale", "fp32"), ("softcap", "fp32"),
                 ("split_keys", "i32"), ("max_ranges", "i32"), ("max_splits", "i32")],
                {"BLOCK_N": DECODE_KEYS[d], "D_BLOCK": d, "G_BLOCK": DECODE_HEADS}))
            specs.append(_spec(
                f"prefill_attention_{short}_d{d}", "prefill_attention", f"prefill_attention{fn}",
                cache(("q_ptr", "*fp32")) + [
                 ("block_tables_ptr", "*u32"), ("tiles_ptr", "*u32"), ("pos_ptr", "*u32"),
                 ("out_ptr", "*fp32"), ("q_stride", "i32"), ("out_stride", "i32"),
                 ("group", "i32"), ("num_kv_heads", "i32"), ("head_dim", "i32"),
                 ("block_size", "i32"), ("window", "i32"), ("scale", "fp32"),
                 ("softcap", "fp32")],
                {"BLOCK_M": PREFILL_M, "BLOCK_N": PREFILL_N[d], "D_BLOCK": d},
                num_warps=8 if d == 256 else 4,
                num_stages={"sm80": 1, "sm90": 1} if short == "f32" else None))
    for d in HEAD_BLOCKS:
        specs.append(_spec(
            f"attention_combine_d{d}", "attention", "attention_combine",
            [("part_ptr", "*fp32"), ("pos_ptr", "*u32"), ("tok_ptr", "*u32"),
             ("out_ptr", "*fp32"), ("out_stride", "i32"), ("head_dim", "i32"),
             ("window", "i32"), ("split_keys", "i32"), ("max_ranges", "i32"),
             ("max_splits", "i32")],
            {"D_BLOCK": d}, num_warps=1))
    return apply_tuning(specs, tuning)
