"""The KV write and the attention kernels (decode, split-K decode with its combine, prefill tiles)
against a numpy reference: every float type and head block, GQA ratios 1 to 20, sliding
windows, soft-capping, block tables with scattered blocks of several sizes, and the fp8 KV cache
(e4m3 bytes and f32 row scales, exact against test_fp8's reference encoder, then attention over
the decoded rows). Outputs are poisoned with NaN before each launch.

    TRITON_INTERPRET=1 python -m unittest test_attention     (the interpreter; from kernels/tests)
    FERRUM_KERNEL_RUNNER=cuda python -m unittest test_attention   (a GPU, torch)

Bounds: as ``test_kernels``'s ``TOL``; over an fp8 cache, 1e-4 in decode attention (the query
and the probabilities times the values' scales are split in two f16/bf16 parts against the
decoded rows) and 1e-2 in prefill attention (one part each).
"""

import math
import unittest

import numpy as np

from harness import SPECS, KernelCase, assert_close, e4m3_decode, fp8_rows, round_to
from test_kernels import FLOATS, TOL, cdiv


class Attention(KernelCase):
    def attention_case(self, short, d_block, hd, group, block_size, window, softcap,
                       fine_splits=False):
        """Three sequences (prefill with prior context, decode, fresh prefill) over scattered
        blocks: KV written through the slot mapping, then attention."""
        r = self.r
        nkv = 2
        nh = nkv * group
        seq_positions = [(21, 30), (45, 46), (0, 6)]
        num_blocks = sum(cdiv(hi, block_size) for _, hi in seq_positions) + 7
        perm = self.rng.permutation(num_blocks)
        tables, tokens, start = [], [], 0
        for s, (lo, hi) in enumerate(seq_positions):
            nb = cdiv(hi, block_size)
            tables.append(perm[start:start + nb].astype(np.uint32))
            start += nb
            tokens += [(s, p) for p in range(lo, hi)]
        assert start <= num_blocks
        bt_flat = np.concatenate(tables)
        offsets = np.cumsum([0] + [len(t) for t in tables])[:-1]
        t = len(tokens)
        slots = num_blocks * block_size
        k_cache = self.rand(slots, nkv, hd)
        v_cache = self.rand(slots, nkv, hd)
        stride = (nh + 2 * nkv) * hd
        qkv = self.rand(t, stride)
        slot_map = np.array([tables[s][p // block_size] * block_size + p % block_size
                             for s, p in tokens], np.uint32)
        pos = np.array([p for _, p in tokens], np.uint32)
        bt_start = np.array([offsets[s] for s, _ in tokens], np.uint32)
        dqkv = r.dev(qkv)
        if short == "fp8":
            # Bytes and row scales; the caches' pointers are followed by the scales'.
            (kq, ks), (vq, vs) = fp8_rows(k_cache), fp8_rows(v_cache)
            dk, dv = r.dev(kq, "u8"), r.dev(vq, "u8")
            dks, dvs = r.dev(ks), r.dev(vs)
            caches = [r.ptr(dk), r.ptr(dv), r.ptr(dks), r.ptr(dvs)]
        else:
            dk, dv = r.dev(k_cache, FLOATS[short]), r.dev(v_cache, FLOATS[short])
            caches = [r.ptr(dk), r.ptr(dv)]
        r.launch(f"kv_write_{short}_d{d_block}", (t, nkv),
                 [r.ptr(dqkv, nh * hd), r.ptr(dqkv, (nh + nkv) * hd)] + caches
                 + [r.ptr(r.dev(slot_map, "u32")), stride, nkv, hd])
        k_cache[slot_map] = qkv[:, nh * hd:(nh + nkv) * hd].reshape(t, nkv, hd)
        v_cache[slot_map] = qkv[:, (nh + nkv) * hd:].reshape(t, nkv, hd)
        if short == "fp8":
            (kq, ks), (vq, vs) = fp8_rows(k_cache), fp8_rows(v_cache)
            np.testing.assert_array_equal(r.host(dk), kq, "kv_write k")
            np.testing.assert_array_equal(r.host(dv), vq, "kv_write v")
            np.testing.assert_array_equal(r.host(dks), ks, "kv_write k scales")
            np.testing.assert_array_equal(r.host(dvs), vs, "kv_write v scales")
            kr, vr = e4m3_decode(kq) * ks[..., None], e4m3_decode(vq) * vs[..., None]
        else:
            kr, vr = round_to(k_cache, short), round_to(v_cache, short)
            assert_close(self, "kv_write k", r.host(dk), kr, TOL)
            assert_close(self, "kv_write v", r.host(dv), vr, TOL)
        # Decode attention: q (and p) split in two parts for the tensor cores; fp8's p times
        # the values' scales in bf16 parts.
        dtol = 1e-4 if short == "fp8" else TOL
        out = self.nan(t, nh * hd)
        scale = 1 / math.sqrt(hd)
        # Every token, listed in reverse: the program's token comes from the list.
        toks = np.arange(t - 1, -1, -1, dtype=np.uint32)
        # One program per token and KV head (and chunk of G_BLOCK of its query heads).
        g_block = SPECS[f"paged_attention_{short}_d{d_block}"]["constexprs"]["G_BLOCK"]
        head_programs = nkv * cdiv(group, g_block)
        r.launch(f"paged_attention_{short}_d{d_block}", (t, head_programs),
                 [r.ptr(dqkv)] + caches + [r.ptr(r.dev(bt_flat, "u32")),
                  r.ptr(r.dev(bt_start, "u32")), r.ptr(r.dev(pos, "u32")),
                  r.ptr(r.dev(toks, "u32")), r.ptr(out), stride, nh * hd, group, nkv, hd,
                  block_size, window, scale, softcap])
        want = np.zeros((t, nh, hd))
        for i, (s, p) in enumerate(tokens):
            lo = max(0, p - window + 1) if window > 0 else 0
            keys = np.arange(lo, p + 1)
            sl = tables[s][keys // block_size].astype(np.int64) * block_size + keys % block_size
            for h in range(nh):
                q = qkv[i, h * hd:(h + 1) * hd].astype(np.float64)
                sc = kr[sl, h // group].astype(np.float64) @ q * scale
                if softcap > 0:
                    sc = softcap * np.tanh(sc / softcap)
                e = np.exp(sc - sc.max())
                want[i, h] = (e / e.sum()) @ vr[sl, h // group].astype(np.float64)
        what = (f"attention {short} d{d_block} hd={hd} group={group} bs={block_size} "
                f"window={window} softcap={softcap}")
        assert_close(self, what, r.host(out).reshape(t, nh, hd), want, dtol)
        single = r.host(out).copy()
        # Split-K (flash-decoding): ranges of split_keys keys, partials merged by
        # attention_combine; tokens of one range equal paged_attention's bit for bit.
        # (keys per range at least, ranges at most): 5 keys capped at 3 ranges makes longer,
        # uneven ranges (and an empty last one for some contexts).
        for split_keys, max_ranges in (((5, 3), (5, 64), (16, 64)) if fine_splits
                                       else ((16, 64),)):
            ctx = [p + 1 - (max(0, p - window + 1) if window > 0 else 0) for _, p in tokens]
            max_splits = max(min(cdiv(c, split_keys), max_ranges) for c in ctx)
            part = r.dev(np.full(t * nh * max_splits * (d_block + 2), np.nan, np.float32))
            out = self.nan(t, nh * hd)
            r.launch(f"paged_attention_split_{short}_d{d_block}", (t, head_programs, max_splits),
                     [r.ptr(dqkv)] + caches + [r.ptr(r.dev(bt_flat, "u32")),
                      r.ptr(r.dev(bt_start, "u32")), r.ptr(r.dev(pos, "u32")),
                      r.ptr(r.dev(toks, "u32")), r.ptr(out), r.ptr(part), stride, nh * hd,
                      group, nkv, hd, block_size, window, scale, softcap, split_keys,
                      max_ranges, max_splits])
            r.launch(f"attention_combine_d{d_block}", (t, nh),
                     [r.ptr(part), r.ptr(r.dev(pos, "u32")), r.ptr(r.dev(toks, "u32")),
                      r.ptr(out), nh * hd, hd, window, split_keys, max_ranges, max_splits])
            got = r.host(out)
            assert_close(self, f"{what} split {split_keys}/{max_ranges}", got.reshape(t, nh, hd),
                         want, dtol)
            one = np.array([c <= split_keys for c in ctx])
            np.testing.assert_array_equal(got[one], single[one], f"{what} split {split_keys}")
        # The prefill kernel over the same tokens in tiles of at most BLOCK_M tokens of one
        # sequence (tile_m smaller than the kernel's BLOCK_M exercises partial tiles).
        name = f"prefill_attention_{short}_d{d_block}"
        block_m = SPECS[name]["constexprs"]["BLOCK_M"]
        for tile_m in (block_m, 5):
            tiles = []
            for i, (s, p) in enumerate(tokens):
                if tiles and tokens[tiles[-1][0]][0] == s and tiles[-1][1] < tile_m:
                    tiles[-1][1] += 1
                else:
                    tiles.append([i, 1, offsets[s]])
            out = self.nan(t, nh * hd)
            r.launch(name, (len(tiles), nh),
                     [r.ptr(dqkv)] + caches + [r.ptr(r.dev(bt_flat, "u32")),
                      r.ptr(r.dev(np.array(tiles, np.uint32).ravel(), "u32")),
                      r.ptr(r.dev(pos, "u32")), r.ptr(out), stride, nh * hd, group, nkv, hd,
                      block_size, window, scale, softcap])
            # Half caches: Q and P are rounded to the cache's type for the tensor cores (fp8:
            # Q to f16, P times the values' scales to bf16).
            tol = {"f32": TOL, "f16": 2e-3, "bf16": 1e-2, "fp8": 1e-2}[short]
            assert_close(self, f"prefill {what} tiles of {tile_m}",
                         r.host(out).reshape(t, nh, hd), want, tol)

    def test_attention_every_head_block_and_type(self):
        for short in list(FLOATS) + ["fp8"]:
            for d_block, hd in ((32, 32), (64, 64), (128, 128), (256, 256), (128, 80)):
                self.attention_case(short, d_block, hd, group=2, block_size=16, window=0,
                                    softcap=0.0)

    def test_attention_gqa_windows_blocks_softcap(self):
        for group in (1, 4):
            for block_size in (1, 8, 32):
                self.attention_case("f32", 64, 64, group, block_size, window=0, softcap=0.0)
        for window in (1, 5, 16, 100):
            self.attention_case("bf16", 64, 64, 2, 16, window=window, softcap=0.0,
                                fine_splits=window == 16)
        self.attention_case("f16", 128, 128, 2, 16, window=0, softcap=30.0, fine_splits=True)
        self.attention_case("fp8", 64, 64, 4, 8, window=5, softcap=30.0, fine_splits=True)
        self.attention_case("f32", 32, 32, 2, 8, window=4, softcap=2.0)
        # Groups that do not fill a program's heads (Qwen2.5-0.5B's 7) and that take two
        # programs per KV head, the second partly filled (20 > G_BLOCK).
        for group in (7, 20):
            self.attention_case("bf16", 64, 64, group, 16, window=0, softcap=0.0,
                                fine_splits=group == 20)


if __name__ == "__main__":
    unittest.main()
