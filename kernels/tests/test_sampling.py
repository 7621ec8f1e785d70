"""The sampling kernels against an independent numpy statement of ``ferrum_models::sampling``'s
rules (token for token, for given draws), and their distributions against the analytic ones
(chi-square), in the interpreter (``FERRUM_KERNEL_RUNNER=cuda``: on a GPU).

    cd kernels/tests && TRITON_INTERPRET=1 python -m unittest test_sampling
"""

import math
import unittest

import numpy as np

from harness import SPECS, runner

NEG_INF = np.float32(-np.inf)


def cdiv(a, b):
    return -(-a // b)


def ref_tokens(row, inv_t, ln_min_p, top_k, top_p, u):
    """The rules, one row: greedy when ``inv_t == 0``, else temperature, min-p, top-k (ties
    kept), top-p (whole groups of equal values), the draw in index order."""
    row = np.where(np.isnan(row), NEG_INF, row).astype(np.float32)
    if inv_t == 0:
        return 0 if row.max() == NEG_INF else int(np.argmax(row))
    v = (row * np.float32(inv_t)).astype(np.float32)
    mx = v.max()
    floor = np.float32(mx + np.float32(ln_min_p))
    cand = (v >= floor) & (v > NEG_INF)
    if not cand.any():
        return 0 if mx == NEG_INF else int(np.argmax(v))
    if 0 < top_k < cand.sum():
        kth = np.sort(v[cand])[::-1][top_k - 1]
        cand &= v >= kth
    p = np.where(cand, np.exp((v - mx).astype(np.float32)), 0).astype(np.float64)
    if top_p < 1:
        target = np.float64(np.float32(top_p)) * p.sum()
        vals = np.unique(v[cand])[::-1]
        keep = np.zeros_like(cand)
        for g in vals:
            if p[cand & (v > g)].sum() < target:
                keep |= cand & (v == g)
        cand = keep
        p = np.where(cand, p, 0)
    x = u * p.sum()
    cum = np.cumsum(p)
    hit = np.nonzero(cand & (cum > x))[0]
    return int(hit[0]) if len(hit) else int(np.nonzero(cand)[0][-1])


def probabilities(row, inv_t, ln_min_p, top_k, top_p):
    """The distribution the rules give ``row`` (the draw's uniform integrated out)."""
    v = (row * np.float32(inv_t)).astype(np.float32)
    mx = v.max()
    cand = (v >= np.float32(mx + np.float32(ln_min_p))) & (v > NEG_INF)
    if 0 < top_k < cand.sum():
        cand &= v >= np.sort(v[cand])[::-1][top_k - 1]
    p = np.where(cand, np.exp(v.astype(np.float64) - mx), 0)
    if top_p < 1:
        target = top_p * p.sum()
        keep = np.zeros_like(cand)
        for g in np.unique(v[cand]):
            if p[cand & (v > g)].sum() < target:
                keep |= cand & (v == g)
        p = np.where(keep, p, 0)
    return p / p.sum()


# Chi-square critical values at p = 0.001 for 1..=9 degrees of freedom.
CRITICAL = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88]


class Sampling(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.r = runner()

    def setUp(self):
        self.rng = np.random.default_rng(17)

    def sample(self, rows, inv_t, ln_min_p, top_k, top_p, u, stride=None):
        """``sample_rows`` over ``rows`` (``[n, cols]``, or one row repeated ``len(u)`` times
        with ``stride = 0``)."""
        r = self.r
        n = len(u)
        cols = rows.shape[-1]
        out = r.dev(np.full(n, 0xFFFFFFFF, np.uint32), "u32")
        args = [r.ptr(r.dev(rows)),
                r.ptr(r.dev(np.asarray(inv_t, np.float32))),
                r.ptr(r.dev(np.asarray(ln_min_p, np.float32))),
                r.ptr(r.dev(np.asarray(top_k, np.int32), "i32")),
                r.ptr(r.dev(np.asarray(top_p, np.float32))),
                r.ptr(r.dev(np.asarray(u, np.float64), "fp64")),
                r.ptr(out), cols, cols if stride is None else stride]
        r.launch("sample_rows", (n,), args)
        return [int(t) for t in r.host(out)]

    def test_tokens_follow_the_rules(self):
        """Random rows under every filter and their combinations, with ties, NaN and masked
        (minus infinity) values, rows longer than one chunk: the reference's token for each."""
        block = SPECS["sample_rows"]["constexprs"]["BLOCK"]
        cases = [  # inv_t, min_p, top_k, top_p
            (0.0, 0.0, 0, 1.0), (1.0, 0.0, 0, 1.0), (2.0, 0.0, 0, 1.0), (0.7, 0.05, 0, 1.0),
            (1.0, 0.0, 5, 1.0), (1.0, 0.0, 1, 1.0), (1.0, 0.0, 0, 0.9), (1.0, 0.0, 0, 0.3),
            (1.3, 0.02, 40, 0.8), (1.0, 0.5, 3, 0.95),
        ]
        for cols in (37, block + 100):
            rows = (self.rng.standard_normal((len(cases), cols)) * 3).astype(np.float32)
            # Ties (quantized values), NaN, masked tokens, a row with one finite value.
            rows[1] = np.round(rows[1])
            rows[4] = np.round(rows[4])
            rows[6] = np.round(rows[6] * 2) / 2
            rows[2, ::7] = np.nan
            rows[3, ::3] = NEG_INF
            rows[5, :] = NEG_INF
            rows[5, cols // 2] = 1.0
            for trial in range(3):
                u = self.rng.random(len(cases))
                inv_t = [c[0] for c in cases]
                ln_min_p = [math.log(c[1]) if c[1] > 0 else -math.inf for c in cases]
                top_k = [c[2] for c in cases]
                top_p = [c[3] for c in cases]
                got = self.sample(rows, inv_t, ln_min_p, top_k, top_p, u)
                for i, c in enumerate(cases):
                    want = ref_tokens(rows[i], inv_t[i], ln_min_p[i], top_k[i], top_p[i], u[i])
                    self.assertEqual(got[i], want, f"cols {cols} case {c} u {u[i]}")

    def test_draws_have_the_analytic_distribution(self):
        """Draws of one row (uniforms from numpy): chi-square against the distribution the
        rules give, cells expecting fewer than 5 draws pooled. Few draws, as the interpreter
        runs a program in milliseconds (tens with top-k or top-p); the token tests above pin
        every filter exactly."""
        row = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], np.float32)
        for name, draws, inv_t, min_p, top_k, top_p in (
                ("t=1", 600, 1.0, 0.0, 0, 1.0), ("min_p=0.2", 600, 2.0, 0.2, 0, 1.0),
                ("chain", 300, 1 / 0.7, 0.05, 5, 0.9)):
            ln_min_p = math.log(min_p) if min_p > 0 else -math.inf
            u = self.rng.random(draws)
            got = self.sample(row, [inv_t] * draws, [ln_min_p] * draws, [top_k] * draws,
                              [top_p] * draws, u, stride=0)
            counts = np.bincount(got, minlength=len(row))
            want = probabilities(row, inv_t, ln_min_p, top_k, top_p)
            self.assertTrue((counts[want == 0] == 0).all(), f"{name}: a filtered token drawn")
            big = want * draws >= 5
            obs = list(counts[big]) + ([counts[~big & (want > 0)].sum()] if (~big & (want > 0)).any() else [])
            exp = list(want[big] * draws) + ([want[~big].sum() * draws] if (~big & (want > 0)).any() else [])
            chi2 = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
            self.assertGreaterEqual(len(obs), 2, name)
            self.assertLess(chi2, CRITICAL[len(obs) - 2], f"{name}: counts {counts}, want {want}")

    def test_prepare_and_edits(self):
        """The mask (tokens past its words not allowed), then the edits in order: repetition,
        subtraction, bias, skipping tokens the mask does not allow; rows without a mask or
        edits untouched."""
        r = self.r
        rows, cols = 3, 70
        logits = (self.rng.standard_normal((rows, cols)) * 2).astype(np.float32)
        words = cdiv(cols, 32)
        mask = self.rng.integers(0, 2**32, (2, words), dtype=np.uint64).astype(np.uint32)
        mask[0, 0] &= np.uint32(0xFFFFFFFE)   # token 0 not allowed in row 0, which edits it
        mask_off = np.array([0, -1, words], np.int32)
        work = r.dev(np.full((rows, cols), np.nan, np.float32))
        grid = (rows, cdiv(cols, SPECS["sample_prepare"]["constexprs"]["BLOCK"]))
        r.launch("sample_prepare", grid, [r.ptr(r.dev(logits)), r.ptr(work),
                                          r.ptr(r.dev(mask.ravel(), "u32")),
                                          r.ptr(r.dev(mask_off, "i32")), cols, cols])
        want = logits.copy()
        for i, off in enumerate(mask_off):
            if off < 0:
                continue
            m = mask.ravel()[off:off + words]
            allowed = (m[np.arange(cols) // 32] >> (np.arange(cols) % 32)) & 1
            want[i] = np.where(allowed == 1, want[i], NEG_INF)
        np.testing.assert_array_equal(r.host(work), want)
        # Edits: row 0 three tokens, row 1 none, row 2 one past the row (ignored).
        tok = np.array([5, 0, 69, 3, 500], np.uint32)
        rep = np.array([1.3, 1.3, 1.0, 0.7, 2.0], np.float32)
        sub = np.array([0.0, 0.75, 0.5, 0.0, 1.0], np.float32)
        bias = np.array([2.0, 0.0, -1.0, 0.25, 3.0], np.float32)
        edit_off = np.array([0, 3, 3, 5], np.int32)
        before = r.host(work).copy()
        r.launch("logit_edits", (rows,), [r.ptr(work), r.ptr(r.dev(edit_off, "i32")),
                                          r.ptr(r.dev(tok, "u32")), r.ptr(r.dev(rep)),
                                          r.ptr(r.dev(sub)), r.ptr(r.dev(bias)),
                                          r.ptr(r.dev(mask.ravel(), "u32")),
                                          r.ptr(r.dev(mask_off, "i32")), cols, cols])
        want = before.copy()
        for row in range(rows):
            for e in range(edit_off[row], edit_off[row + 1]):
                t = int(tok[e])
                if t >= cols:
                    continue
                off = mask_off[row]
                if off >= 0 and not (int(mask.ravel()[off + t // 32]) >> (t % 32)) & 1:
                    continue  # a token the mask does not allow keeps its minus infinity
                l = want[row, t]
                if rep[e] != 1:
                    l = np.float32(l / rep[e]) if l > 0 else np.float32(l * rep[e])
                want[row, t] = np.float32(np.float32(l - sub[e]) + bias[e])
        np.testing.assert_array_equal(r.host(work), want)

    def test_logprobs(self):
        """The raw logprob of each row's token and its top n (ties by index, NaN as minus
        infinity); rows with n = -1 untouched."""
        r = self.r
        rows, cols, max_n = 4, 2100, 5
        logits = np.round(self.rng.standard_normal((rows, cols)) * 2, 1).astype(np.float32)
        logits[2, ::5] = np.nan
        tok = np.array([3, 7, 2099, 0], np.uint32)
        n = np.array([5, -1, 2, 0], np.int32)
        lp = r.dev(np.full(rows, 9.0, np.float32))
        ids = r.dev(np.full(rows * max_n, 0xFFFFFFFF, np.uint32), "u32")
        vals = r.dev(np.full(rows * max_n, 9.0, np.float32))
        r.launch("row_logprobs", (rows,), [r.ptr(r.dev(logits)), r.ptr(r.dev(tok, "u32")),
                                           r.ptr(r.dev(n, "i32")), r.ptr(lp), r.ptr(ids),
                                           r.ptr(vals), cols, cols, max_n])
        got_lp, got_ids, got_vals = r.host(lp), r.host(ids), r.host(vals)
        for i in range(rows):
            if n[i] < 0:
                self.assertEqual(got_lp[i], 9.0)
                continue
            v = np.where(np.isnan(logits[i]), NEG_INF, logits[i])
            lse = v.max() + np.log(np.exp(v.astype(np.float64) - v.max()).sum())
            self.assertAlmostEqual(float(got_lp[i]), float(v[tok[i]] - lse), places=5)
            order = sorted(range(cols), key=lambda j: (-v[j], j))[:n[i]]
            self.assertEqual([int(x) for x in got_ids[i * max_n:i * max_n + n[i]]], order)
            for j, t in enumerate(order):
                self.assertAlmostEqual(float(got_vals[i * max_n + j]), float(v[t] - lse),
                                       places=5)


if __name__ == "__main__":
    unittest.main()
