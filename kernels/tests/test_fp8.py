"""The fp8 (e4m3) KV cache's writes against a reference encoder (``harness.e4m3_encode``: a
search over the format's table, independent of the kernels' integer arithmetic): every byte
and scale exact, on rows that reach every code, ties, subnormals, zero rows and non-finite
values. Attention over fp8 caches is checked with the other cache types in
``test_kernels.Kernels.attention_case``.

    TRITON_INTERPRET=1 python -m unittest test_fp8       (from kernels/tests)
"""

import unittest

import numpy as np

from harness import e4m3_decode, e4m3_encode, e4m3_values, fp8_rows, runner


class Fp8(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.r = runner()

    def setUp(self):
        self.rng = np.random.default_rng(abs(hash(self.id())) % (2**32))

    def test_reference_encoder_round_trips_the_table(self):
        vals = e4m3_values()
        self.assertEqual(vals[0x7E], 448.0)
        self.assertEqual(vals[1], 2.0 ** -9)
        self.assertEqual(vals[8], 2.0 ** -6)
        codes = np.arange(256, dtype=np.uint8)
        codes = codes[(codes & 0x7F) != 0x7F]
        np.testing.assert_array_equal(e4m3_encode(e4m3_decode(codes)) & 0x7F, codes & 0x7F)
        # Ties go to the even code: 1.0 + 1/16 lies between 1.0 (0x38) and 1.125 (0x39).
        self.assertEqual(e4m3_encode([1.0625])[0], 0x38)
        self.assertEqual(e4m3_encode([1.1875])[0], 0x3A)
        self.assertEqual(e4m3_encode([1000.0, -1e9])[0], 0x7E)

    def write(self, kernel, rows, hd, d_block, extra=(), tail=()):
        """Writes ``rows`` (``[t, nkv, hd]`` keys; values the negated keys) into shuffled slots
        of an fp8 cache: (codes, scales) of the keys and the values, by slot."""
        r = self.r
        t, nkv, _ = rows.shape
        slots = t + 3
        stride = nkv * hd + 5
        k = np.zeros((t, stride), np.float32)
        k[:, :nkv * hd] = rows.reshape(t, nkv * hd)
        v = -k
        slot_map = self.rng.permutation(slots)[:t].astype(np.uint32)
        kc, vc = r.dev(np.zeros((slots, nkv, hd), np.uint8), "u8"), \
            r.dev(np.zeros((slots, nkv, hd), np.uint8), "u8")
        ks, vs = r.dev(np.full((slots, nkv), np.nan, np.float32)), \
            r.dev(np.full((slots, nkv), np.nan, np.float32))
        r.launch(kernel, (t, nkv),
                 [r.ptr(r.dev(k)), r.ptr(r.dev(v)), r.ptr(kc), r.ptr(vc), r.ptr(ks), r.ptr(vs),
                  r.ptr(r.dev(slot_map, "u32"))] + list(extra) + [stride, nkv, hd] + list(tail))
        return [(r.host(c)[slot_map], r.host(s)[slot_map]) for c, s in ((kc, ks), (vc, vs))]

    def test_kv_write_fp8_stores_the_reference_bytes_and_scales(self):
        nkv = 2
        for d_block, hd in ((32, 32), (64, 64), (128, 80), (256, 256)):
            rows = [self.rng.standard_normal((5, nkv, hd)).astype(np.float32)]
            # Every code's value, at the row's largest (448 times the scale 1): exact.
            table = np.resize(np.concatenate([e4m3_values(), -e4m3_values()]), hd)
            table[0] = 448.0
            rows.append(np.broadcast_to(table.astype(np.float32), (1, nkv, hd)))
            # Values halfway between codes (ties to even), subnormals, a wide dynamic range.
            mids = (e4m3_values()[:-1] + e4m3_values()[1:]) / 2
            ties = np.resize(mids, hd)
            ties[0] = 448.0
            rows.append(np.broadcast_to(ties.astype(np.float32), (1, nkv, hd)))
            wide = (self.rng.standard_normal(hd) * 10.0 ** self.rng.uniform(-8, 3, hd))
            rows.append(np.broadcast_to(wide.astype(np.float32), (1, nkv, hd)))
            zero = np.zeros((1, nkv, hd), np.float32)
            rows.append(zero)
            x = np.concatenate(rows)
            for kernel in (f"kv_write_fp8_d{d_block}",):
                (kq, ks), (vq, vs) = self.write(kernel, x, hd, d_block)
                for what, got_q, got_s, src in (("k", kq, ks, x), ("v", vq, vs, -x)):
                    want_q, want_s = fp8_rows(src)
                    np.testing.assert_array_equal(got_s, want_s, f"{kernel} {what} scales")
                    np.testing.assert_array_equal(got_q, want_q, f"{kernel} {what} bytes")
                    # Within the format's bound: half a unit in the last place, 2^-4 relative
                    # above the subnormals, 2^-10 of the row's largest below.
                    deq = e4m3_decode(got_q) * got_s[..., None]
                    bound = np.maximum(np.abs(src) * 2.0 ** -4,
                                       np.abs(src).max(-1, keepdims=True) * 2.0 ** -10)
                    self.assertTrue((np.abs(deq - src) <= bound * (1 + 1e-6)).all(),
                                    f"{kernel} {what} within the bound")
            self.assertTrue((kq[-1] == 0).all() and (ks[-1] == 0).all(), "a zero row: zeros")

    def test_a_non_finite_value_poisons_its_row_only(self):
        x = self.rng.standard_normal((3, 2, 64)).astype(np.float32)
        x[0, 1, 7] = np.nan
        x[2, 0, 0] = np.inf
        (kq, ks), _ = self.write("kv_write_fp8_d64", x, 64, 64)
        self.assertTrue(np.isnan(ks[0, 1]) and np.isnan(ks[2, 0]))
        finite = [(0, 0), (1, 0), (1, 1), (2, 1)]
        want_q, want_s = fp8_rows(x)
        for t, h in finite:
            self.assertEqual(ks[t, h], want_s[t, h])
            np.testing.assert_array_equal(kq[t, h], want_q[t, h])

    def test_rope_kv_write_fp8_equals_rope_then_kv_write_fp8(self):
        r = self.r
        for hd, d_block, rot_half in ((64, 64, 32), (80, 128, 16)):
            t, nkv = 4, 2
            x = self.rng.standard_normal((t, nkv, hd)).astype(np.float32)
            pos = self.rng.integers(0, 5000, t).astype(np.uint32)
            inv = (1.0 / 1e4 ** (np.arange(rot_half) * 2 / (2 * rot_half))).astype(np.float32)
            dpos, dinv = r.dev(pos, "u32"), r.dev(inv)
            # The rotated keys, by the rope kernel, then written plainly (the values differ
            # between the two writes: the negated keys before and after rotation).
            rk = r.dev(x.reshape(t, nkv * hd))
            r.launch("rope", (t, nkv), [r.ptr(rk), r.ptr(dpos), r.ptr(dinv), nkv * hd, hd,
                                        rot_half, 1.0])
            rotated = r.host(rk).reshape(t, nkv, hd)
            self.rng = np.random.default_rng(7)
            plain = self.write(f"kv_write_fp8_d{d_block}", rotated, hd, d_block)
            self.rng = np.random.default_rng(7)
            fused = self.write(f"rope_kv_write_fp8_d{d_block}", x, hd, d_block,
                               extra=(r.ptr(dpos), r.ptr(dinv)), tail=(rot_half, 1.0))
            np.testing.assert_array_equal(fused[0][0], plain[0][0], f"keys hd={hd}")
            np.testing.assert_array_equal(fused[0][1], plain[0][1], f"key scales hd={hd}")


if __name__ == "__main__":
    unittest.main()
