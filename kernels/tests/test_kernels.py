"""Every kernel specialization but attention's (``test_attention``) against a numpy reference, on
shapes that reach the edges: partial blocks, strided and fused rows, every float type, every
block format. Outputs are poisoned with NaN before each launch.

    TRITON_INTERPRET=1 python -m unittest discover -s kernels/tests     (the interpreter)
    FERRUM_KERNEL_RUNNER=cuda python -m unittest discover -s kernels/tests   (a GPU, torch)

Bound: ``TOL`` x max |reference| per element (f32 arithmetic in another order; operands rounded
to f16/bf16 on the host exactly as the kernels round them); over an fp8 cache, 1e-4 in decode
attention (the query and the probabilities times the values' scales are split in two f16/bf16
parts against the decoded rows) and 1e-2 in prefill attention (one part each).
"""

import math
import os
import unittest

import numpy as np

from harness import SPECS, KernelCase, assert_close, round_to, specs

TOL = 2e-5
# Quantized products run at tf32 on a GPU (10-bit mantissa operands, f32 accumulation): about
# 2^-11 relative per operand, grown by sqrt(k) over a row; the interpreter computes in f32.
QTOL = 2e-3
QUANT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                         "fixtures", "quant")
QUANTS = ("q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k", "q5_0", "q5_1")


def read_safetensors(path):
    """The tensors of a safetensors file, as numpy arrays (U8 and F32 only)."""
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = {"U8": np.uint8, "F32": np.float32}[meta["dtype"]]
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dtype).reshape(meta["shape"])
    return out
FLOATS = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}


def cdiv(a, b):
    return -(-a // b)


class Kernels(KernelCase):

    def test_argmax_rows(self):
        """First index of the maximum, NaN never winning, 0 for a row of minus infinity; ties
        within and across chunks; a row shorter than one chunk and one of several."""
        r = self.r
        block = SPECS["argmax_rows"]["constexprs"]["BLOCK"]
        for n in (7, block + 3, 3 * block):
            rows = self.rand(6, n + 5)
            rows[1, n // 2] = rows[1, n - 1] = 1e9          # a tie: the first wins
            rows[2, :] = -np.inf                            # nothing beats -inf: 0
            rows[3, 0] = np.nan
            rows[3, n - 1] = 50.0                           # NaN never wins
            rows[4, :] = 3.0                                # all equal: 0
            rows[5, n:] = 1e9                               # past n_cols: never read
            out = r.dev(np.full(6, 0xFFFFFFFF, np.uint32), "u32")
            r.launch("argmax_rows", (6,), [r.ptr(r.dev(rows)), r.ptr(out), n, n + 5])
            got = r.host(out)
            for i in range(6):
                v = np.where(np.isnan(rows[i, :n]), -np.inf, rows[i, :n])
                want = 0 if v.max() == -np.inf else int(np.argmax(v))
                self.assertEqual(int(got[i]), want, f"argmax_rows n={n} row {i}")

    def test_resolve_ids(self):
        """Each pending input takes its row of the previous step's tokens; the other inputs
        and everything past ``n`` are left alone; more pending inputs than one block."""
        r = self.r
        block = SPECS["resolve_ids"]["constexprs"]["BLOCK"]
        for n in (0, 1, 5, block + 7):
            size = n + 9
            ids = np.arange(1000, 1000 + size, dtype=np.uint32)
            prev = self.rng.integers(0, 50000, n + 3).astype(np.uint32)
            at = self.rng.permutation(size)[:n].astype(np.uint32)
            rows = self.rng.integers(0, n + 3, n).astype(np.uint32)
            pairs = np.stack([at, rows], axis=1).reshape(-1) if n else np.zeros(2, np.uint32)
            # A pair past n (a stale one) must not be applied.
            pairs = np.concatenate([pairs, np.array([size - 1, 0], np.uint32)])
            dids = r.dev(ids, "u32")
            grid = (max(1, -(-n // block)),)
            r.launch("resolve_ids", grid,
                     [r.ptr(dids), r.ptr(r.dev(pairs, "u32")), r.ptr(r.dev(prev, "u32")), n])
            want = ids.copy()
            want[at] = prev[rows]
            np.testing.assert_array_equal(r.host(dids), want, f"resolve_ids n={n}")

    def test_rms_norm(self):
        r = self.r
        for has_res in (0, 1):
            for n in (64, 256, 1024, 1100, 3000, 8192):
                rows, stride = 3, n + 8
                x, res, w = self.rand(rows, stride), self.rand(rows, stride), self.rand(n)
                dx, dres, dw, out = r.dev(x), r.dev(res), r.dev(w), self.nan(rows, n)
                s = (x + res if has_res else x)[:, :n].astype(np.float64)
                want = s / np.sqrt((s * s).mean(1, keepdims=True) + 1e-6) * w
                # The two-pass kernel, and every one-pass width that holds the row.
                names = [f"rms_norm_res{has_res}"] + [
                    f"rms_norm_res{has_res}_w{width}" for width, _ in specs.NORM_ONE_PASS
                    if width >= n]
                for name in names:
                    dres = r.dev(res)
                    out = self.nan(rows, n)
                    r.launch(name, (rows, 1), [r.ptr(dx), r.ptr(dres), r.ptr(out), r.ptr(dw), n,
                                               stride, stride, n, 1e-6])
                    assert_close(self, f"{name} n={n}", r.host(out), want, TOL)
                    if has_res:
                        got_res = r.host(dres)[:, :n]
                        assert_close(self, f"{name} residual", got_res, s, TOL)

    def test_rope(self):
        r = self.r
        for hd, rot_half, scale in ((128, 64, 1.0), (64, 32, 1.0), (256, 128, 1.0), (32, 8, 1.0),
                                    (16, 6, 1.2247)):
            t, heads = 7, 5
            stride = heads * hd + hd
            x = self.rand(t, stride)
            pos = self.rng.integers(0, 32768, t).astype(np.uint32)
            inv = (1.0 / 1e6 ** (np.arange(rot_half) * 2 / (2 * rot_half))).astype(np.float32)
            dx = r.dev(x)
            r.launch("rope", (t, heads), [r.ptr(dx), r.ptr(r.dev(pos, "u32")), r.ptr(r.dev(inv)),
                                         stride, hd, rot_half, scale])
            want = x.astype(np.float64).copy()
            ang = (pos[:, None].astype(np.float32) * inv[None, :]).astype(np.float64)
            for h in range(heads):
                o = h * hd
                x1 = x[:, o:o + rot_half].astype(np.float64)
                x2 = x[:, o + rot_half:o + 2 * rot_half].astype(np.float64)
                c, sn = np.cos(ang) * scale, np.sin(ang) * scale
                want[:, o:o + rot_half] = x1 * c - x2 * sn
                want[:, o + rot_half:o + 2 * rot_half] = x2 * c + x1 * sn
            # Large positions: the f32 angle's own rounding dominates; same bound scaled.
            assert_close(self, f"rope hd={hd} rot={rot_half} scale={scale}", r.host(dx), want, 2e-4)

    def test_gated_act(self):
        r = self.r
        for name in ("gated_silu", "gated_gelu_tanh"):
            for n in (100, 1024, 2500):
                t = 3
                gu = self.rand(t, 2 * n, scale=3.0)
                dgu, out = r.dev(gu), self.nan(t, n)
                grid = (t, cdiv(n, SPECS[name]["constexprs"]["BLOCK"]))
                r.launch(name, grid, [r.ptr(dgu), r.ptr(dgu, n), r.ptr(out), n, 2 * n, 2 * n, n])
                g, u = gu[:, :n].astype(np.float64), gu[:, n:].astype(np.float64)
                if name == "gated_silu":
                    a = g / (1 + np.exp(-g))
                else:
                    a = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
                assert_close(self, f"{name} n={n}", r.host(out), a * u, TOL)

    def test_half_inputs_of_vendor_products(self):
        """``cast_rows_*`` rounds each f32 to the half type to nearest even, bit for bit as the
        host rounds it; ``gated_*_{f16,bf16}`` writes act(gate) * up rounded once (the f32
        result within 1e-6 of the f64 one, then one rounding: half an ulp of the type)."""
        r = self.r
        for short, ty in (("f16", "fp16"), ("bf16", "bf16")):
            rows, n = 3, 1500
            x = self.rand(rows, n + 8, scale=4.0)
            out = r.dev(np.full((rows, n), np.nan, np.float32), ty)
            name = f"cast_rows_{short}"
            grid = (rows, cdiv(n, SPECS[name]["constexprs"]["BLOCK"]))
            r.launch(name, grid, [r.ptr(r.dev(x)), r.ptr(out), n, n + 8, n])
            np.testing.assert_array_equal(r.host(out), round_to(x[:, :n], short), name)
            ulp = 2.0 ** -8 if short == "bf16" else 2.0 ** -11
            for act in ("silu", "gelu_tanh"):
                name = f"gated_{act}_{short}"
                gu = self.rand(rows, 2 * n, scale=3.0)
                out = r.dev(np.full((rows, n), np.nan, np.float32), ty)
                dgu = r.dev(gu)
                r.launch(name, grid, [r.ptr(dgu), r.ptr(dgu, n), r.ptr(out), n, 2 * n, 2 * n, n])
                g, u = gu[:, :n].astype(np.float64), gu[:, n:].astype(np.float64)
                if act == "silu":
                    a = g / (1 + np.exp(-g))
                else:
                    a = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
                want = a * u
                err = np.abs(r.host(out).astype(np.float64) - want)
                bound = np.abs(want) * ulp + 1e-6 * np.abs(want).max()
                self.assertTrue((err <= bound).all(), f"{name}: {err.max()}")

    def test_out_of_bounds_access_is_caught(self):
        """The interpreter's bounds check (a GPU would corrupt memory silently): a row stride
        that runs past the buffer is an error, not a read of whatever lies beyond."""
        if self.r.name != "interpreter":
            self.skipTest("the bounds check is the interpreter's")
        from ferrum_kernels import interp
        r = self.r
        x = r.dev(self.rand(2, 64))
        out = self.nan(2, 64)
        w = r.dev(self.rand(64))
        with self.assertRaises(interp.OutOfBounds):
            r.launch("rms_norm_res0", (2, 1),
                     [r.ptr(x), r.ptr(x), r.ptr(out), r.ptr(w), 64, 100, 100, 64, 1e-6])

    def test_add_rows(self):
        r = self.r
        for n in (64, 1500):
            rows = 4
            x, y, b = self.rand(rows, n + 4), self.rand(rows, n), self.rand(n)
            dx = r.dev(x)
            grid = (rows, cdiv(n, SPECS["add_rows"]["constexprs"]["BLOCK"]))
            r.launch("add_rows", grid, [r.ptr(dx), r.ptr(r.dev(y)), n, n + 4, n])
            want = x.astype(np.float64).copy()
            want[:, :n] += y
            assert_close(self, f"add_rows n={n}", r.host(dx), want, TOL)
            # A bias: y_stride 0.
            r.launch("add_rows", grid, [r.ptr(dx), r.ptr(r.dev(b)), n, n + 4, 0])
            want[:, :n] += b
            assert_close(self, f"add_rows bias n={n}", r.host(dx), want, TOL)

    def test_gather_rows(self):
        r = self.r
        for short, ty in FLOATS.items():
            vocab, n, t = 97, 1500, 6
            table = self.rand(vocab, n)
            ids = self.rng.integers(0, vocab, t).astype(np.uint32)
            out = self.nan(t, n)
            name = f"gather_rows_{short}"
            grid = (t, cdiv(n, SPECS[name]["constexprs"]["BLOCK"]))
            r.launch(name, grid, [r.ptr(r.dev(table, ty)), r.ptr(r.dev(ids, "u32")), r.ptr(out),
                                  n, n, n, 0.5])
            want = round_to(table, short)[ids].astype(np.float64) * 0.5
            assert_close(self, name, r.host(out), want, TOL)

    def test_gemm(self):
        r = self.r
        for short, ty in FLOATS.items():
            variants = [(f"gemm_{short}_bias0", 0), (f"gemm_{short}_bias1", 1),
                        (f"gemm_{short}_decode", 0)]
            # The wide tiles of half-precision weights (long prefill chunks).
            if f"gemm_{short}_large" in SPECS:
                variants.append((f"gemm_{short}_large", 0))
            for name, has_bias in variants:
                for m, n, k in ((1, 200, 96), (16, 64, 64), (45, 130, 257), (3, 70, 600),
                                (130, 140, 70)):
                    c = SPECS[name]["constexprs"]
                    xs = k + 3
                    x, w, b = self.rand(m, xs), self.rand(n, k), self.rand(n)
                    y = self.nan(m, n)
                    db = r.dev(b)
                    r.launch(name, (cdiv(m, c["BLOCK_M"]), cdiv(n, c["BLOCK_N"])),
                             [r.ptr(r.dev(x)), r.ptr(r.dev(w, ty)), r.ptr(db), r.ptr(y),
                              m, n, k, xs, n])
                    want = (round_to(x[:, :k], short).astype(np.float64)
                            @ round_to(w, short).astype(np.float64).T)
                    if has_bias:
                        want += b
                    assert_close(self, f"{name} {m}x{n}x{k}", r.host(y), want, TOL)

    def test_rope_kv_write_equals_rope_then_kv_write(self):
        """The fused kernel against ``rope`` then ``kv_write`` on the same keys: equal caches
        (every type, full and partial rotary, LongRoPE's scale), the keys' buffer untouched."""
        r = self.r
        for short in FLOATS:
            for hd, d_block, rot_half, scale in ((64, 64, 32, 1.0), (80, 128, 16, 1.19),
                                                 (128, 128, 64, 1.0)):
                t, nkv, slots = 5, 3, 11
                stride = nkv * hd + 7
                k, v = self.rand(t, stride), self.rand(t, stride)
                pos = self.rng.integers(0, 5000, t).astype(np.uint32)
                slot_map = self.rng.permutation(slots)[:t].astype(np.uint32)
                inv = (1.0 / 1e4 ** (np.arange(rot_half) * 2 / (2 * rot_half))).astype(np.float32)
                ty = FLOATS[short]
                caches = []
                dk = r.dev(k)
                dpos, dslots, dinv = r.dev(pos, "u32"), r.dev(slot_map, "u32"), r.dev(inv)
                for fused in (False, True):
                    kc = r.dev(np.zeros((slots, nkv, hd), np.float32), ty)
                    vc = r.dev(np.zeros((slots, nkv, hd), np.float32), ty)
                    if fused:
                        r.launch(f"rope_kv_write_{short}_d{d_block}", (t, nkv),
                                 [r.ptr(dk), r.ptr(r.dev(v)), r.ptr(kc), r.ptr(vc),
                                  r.ptr(dslots), r.ptr(dpos), r.ptr(dinv), stride, nkv, hd,
                                  rot_half, scale])
                        np.testing.assert_array_equal(r.host(dk), k, "keys untouched")
                    else:
                        rk = r.dev(k)
                        r.launch("rope", (t, nkv), [r.ptr(rk), r.ptr(dpos), r.ptr(dinv), stride,
                                                    hd, rot_half, scale])
                        r.launch(f"kv_write_{short}_d{d_block}", (t, nkv),
                                 [r.ptr(rk), r.ptr(r.dev(v)), r.ptr(kc), r.ptr(vc),
                                  r.ptr(dslots), stride, nkv, hd])
                    caches.append((r.host(kc), r.host(vc)))
                what = f"rope_kv_write {short} hd={hd} rot_half={rot_half}"
                np.testing.assert_array_equal(caches[1][0], caches[0][0], what)
                np.testing.assert_array_equal(caches[1][1], caches[0][1], what)

    def split(self, kernel, grid, args, m, n, splits):
        """One split-K launch (``args``: the operands before ``part``, then the sizes between
        ``k`` and ``k_per_split`` inclusive): partials, ``y`` at row stride ``n + 2`` and
        zeroed per-tile counts made here. Checks that the counts are back at zero and the two
        columns past ``n`` untouched; returns ``y[:, :n]``."""
        r = self.r
        tiles = grid[0] * grid[1]
        part, y = self.nan(splits * m * n), self.nan(m, n + 2)
        count = r.dev(np.zeros(tiles, np.int32), "i32")
        ops, sizes = args
        r.launch(kernel, grid, ops + [r.ptr(part), r.ptr(y), r.ptr(count)] + sizes
                 + [n + 2, splits])
        np.testing.assert_array_equal(r.host(count), np.zeros(tiles, np.int32),
                                      f"{kernel}: the tile counts go back to zero")
        got = r.host(y)
        self.assertTrue(np.isnan(got[:, n:]).all(), f"{kernel}: wrote past its row")
        return got[:, :n]

    def test_gemm_split_k(self):
        """Split-K decode products: ranges of k_per_split columns (some not a multiple of the
        tile, the last cut short), the partials added in order by each tile's last range into
        y at its row stride, one launch; one range equals the unsplit decode product bit for
        bit."""
        r = self.r
        for short, ty in FLOATS.items():
            name = f"gemm_{short}_split"
            c = SPECS[name]["constexprs"]
            for m, n, k, kps in ((1, 200, 600, 256), (3, 70, 600, 100), (16, 64, 64, 16),
                                 (5, 33, 1000, 1000)):
                splits = cdiv(k, kps)
                xs = k + 3
                x, w, b = self.rand(m, xs), self.rand(n, k), self.rand(n)
                dx, dw = r.dev(x), r.dev(w, ty)
                grid = (cdiv(m, c["BLOCK_M"]), cdiv(n, c["BLOCK_N"]), splits)
                sizes = [m, n, k, xs, kps]
                got = self.split(name, grid, ([r.ptr(dx), r.ptr(dx), r.ptr(dw)], sizes), m, n,
                                 splits)
                want = (round_to(x[:, :k], short).astype(np.float64)
                        @ round_to(w, short).astype(np.float64).T)
                assert_close(self, f"{name} {m}x{n}x{k} by {kps}", got, want, TOL)
                # The gated forms: act(x) * up as the left operand, equal to gated_act's rows
                # multiplied by the plain form.
                up = self.rand(m, xs)
                dup = r.dev(up)
                for act, suffix in ((0, "_silu"), (1, "_gelu")):
                    gated = self.nan(m, xs)
                    r.launch(f"gated_{'silu' if act == 0 else 'gelu_tanh'}", (m, cdiv(xs, 1024)),
                             [r.ptr(dx), r.ptr(dup), r.ptr(gated), xs, xs, xs, xs])
                    want_g = self.split(name, grid, ([r.ptr(gated), r.ptr(gated), r.ptr(dw)],
                                                     sizes), m, n, splits)
                    got_g = self.split(name + suffix, grid, ([r.ptr(dx), r.ptr(dup), r.ptr(dw)],
                                                             sizes), m, n, splits)
                    np.testing.assert_array_equal(got_g, want_g, name + suffix)
                if splits == 1:
                    y1 = self.nan(m, n)
                    d = SPECS[f"gemm_{short}_decode"]["constexprs"]
                    r.launch(f"gemm_{short}_decode", (cdiv(m, d["BLOCK_M"]), cdiv(n, d["BLOCK_N"])),
                             [r.ptr(dx), r.ptr(dw), r.ptr(r.dev(b)), r.ptr(y1), m, n, k, xs, n])
                    np.testing.assert_array_equal(got, r.host(y1))

    def test_qgemm_every_block_format(self):
        """Raw blocks of every format (tests/fixtures/quant, written by llama.cpp and gguf-py)
        against their gguf-py dequantization: rows repeated and shuffled to 70, so tiles are
        partial; m of 1 (decode) and 37; the 32-element formats also with rows of 9 blocks,
        shorter than a decode tile."""
        r = self.r
        blocks = read_safetensors(os.path.join(QUANT_DIR, "blocks.safetensors"))
        for fmt in QUANTS:
            raw = blocks[f"{fmt.upper()}.raw"]
            deq = blocks[f"{fmt.upper()}.dequant"]
            order = self.rng.integers(0, raw.shape[0], 70)
            raw, deq = np.ascontiguousarray(raw[order]), deq[order]
            n, k = deq.shape
            for name, m in ((f"qgemm_{fmt}", 1), (f"qgemm_{fmt}", 37), (f"qgemm_{fmt}_decode", 1),
                            (f"qgemm_{fmt}_decode", 16)):
                c = SPECS[name]["constexprs"]
                x = self.rand(m, k + 5)
                y = self.nan(m, n)
                r.launch(name, (cdiv(m, c["BLOCK_M"]), cdiv(n, c["BLOCK_N"])),
                         [r.ptr(r.dev(x)), r.ptr(r.dev(raw, "u8")), r.ptr(y), m, n, k,
                          raw.shape[1], k + 5, n])
                want = x[:, :k].astype(np.float64) @ deq.astype(np.float64).T
                assert_close(self, f"{name} m={m}", r.host(y), want, QTOL)
            if not fmt.endswith("_k"):
                # Rows of 9 blocks (288 columns): the decode tile of 256 runs past the row,
                # which must read no byte there (the interpreter checks every access).
                bb = raw.shape[1] // (k // 32)
                cut_raw = np.ascontiguousarray(raw[:, :9 * bb])
                cut = deq[:, :288]
                name = f"qgemm_{fmt}_decode"
                c = SPECS[name]["constexprs"]
                x = self.rand(3, 288)
                y = self.nan(3, n)
                r.launch(name, (1, cdiv(n, c["BLOCK_N"])),
                         [r.ptr(r.dev(x)), r.ptr(r.dev(cut_raw, "u8")), r.ptr(y), 3, n, 288,
                          cut_raw.shape[1], 288, n])
                want = x.astype(np.float64) @ cut.astype(np.float64).T
                assert_close(self, f"{name} k=288", r.host(y), want, QTOL)
            # Whole rows decoded (a quantized embedding table): exact, as gguf-py decodes.
            ids = self.rng.integers(0, n, 5).astype(np.uint32)
            out = self.nan(5, k)
            gname = f"qgather_rows_{fmt}"
            r.launch(gname, (5, cdiv(k, SPECS[gname]["constexprs"]["BLOCK"])),
                     [r.ptr(r.dev(raw, "u8")), r.ptr(r.dev(ids, "u32")), r.ptr(out), k,
                      raw.shape[1], k, 2.0])
            assert_close(self, gname, r.host(out), deq[ids].astype(np.float64) * 2.0, 1e-7)

    def test_qgemm_split_k(self):
        """Split-K decode products of every block format: ranges of whole blocks (whole
        256-column tiles or not), the partials added in order by each tile's last range,
        against the gguf-py dequantization; one range equals the unsplit decode product bit
        for bit, and the gated forms equal gated_act then the plain form."""
        r = self.r
        blocks = read_safetensors(os.path.join(QUANT_DIR, "blocks.safetensors"))
        for fmt in QUANTS:
            raw = blocks[f"{fmt.upper()}.raw"]
            deq = blocks[f"{fmt.upper()}.dequant"]
            order = self.rng.integers(0, raw.shape[0], 40)
            raw, deq = np.ascontiguousarray(raw[order]), deq[order]
            n, k = deq.shape
            dw = r.dev(raw, "u8")
            name = f"qgemm_{fmt}_split"
            c = SPECS[name]["constexprs"]
            block = 256 if fmt.endswith("_k") else 32
            for m, kps in ((1, 256), (5, 512), (2, 3 * block), (3, k)):
                splits = cdiv(k, kps)
                xs = k + 3
                x, up = self.rand(m, xs), self.rand(m, xs)
                dx, dup = r.dev(x), r.dev(up)
                grid = (cdiv(m, c["BLOCK_M"]), cdiv(n, c["BLOCK_N"]), splits)
                sizes = [m, n, k, raw.shape[1], xs, kps]
                y = self.split(name, grid, ([r.ptr(dx), r.ptr(dx), r.ptr(dw)], sizes), m, n,
                               splits)
                want = x[:, :k].astype(np.float64) @ deq.astype(np.float64).T
                assert_close(self, f"{name} m={m} by {kps}", y, want, QTOL)
                for act, suffix in ((0, "_silu"), (1, "_gelu")):
                    gated = self.nan(m, xs)
                    r.launch(f"gated_{'silu' if act == 0 else 'gelu_tanh'}", (m, cdiv(xs, 1024)),
                             [r.ptr(dx), r.ptr(dup), r.ptr(gated), xs, xs, xs, xs])
                    want_g = self.split(name, grid, ([r.ptr(gated), r.ptr(gated), r.ptr(dw)],
                                                     sizes), m, n, splits)
                    got_g = self.split(name + suffix, grid, ([r.ptr(dx), r.ptr(dup), r.ptr(dw)],
                                                             sizes), m, n, splits)
                    np.testing.assert_array_equal(got_g, want_g, name + suffix)
                if splits == 1:
                    d = SPECS[f"qgemm_{fmt}_decode"]["constexprs"]
                    y1 = self.nan(m, n)
                    r.launch(f"qgemm_{fmt}_decode", (cdiv(m, d["BLOCK_M"]), cdiv(n, d["BLOCK_N"])),
                             [r.ptr(dx), r.ptr(dw), r.ptr(y1), m, n, k, raw.shape[1], xs, n])
                    np.testing.assert_array_equal(y, r.host(y1))


if __name__ == "__main__":
    unittest.main()
