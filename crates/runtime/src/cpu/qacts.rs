//! Activation rows quantized to 8 bits for the integer kernels, once per row per layer input.
//!
//! Per 32-element block: `d = max|x| / 127`, codes `q = round(x / d)` (ties to even,
//! `|q| <= 127`), kept in
//! element order (the kernels broadcast four codes at a time to every lane of a register), next
//! to what the kernels need: per block the scale `d` and `d * Σq` (for the weights' minimums),
//! and per 16 elements `Σq` (for the weights' code bias).

use super::qpack::QK;
use super::simd::multiversion;
use super::DisjointMut;
use crate::ThreadPool;

/// `[m, k]` activation rows, quantized (`k` a multiple of 32).
#[derive(Debug, Default, Clone)]
pub struct Q8Acts {
    k: usize,
    m: usize,
    /// `[m, k]` codes.
    qs: Vec<i8>,
    /// `[m, k / 32]` block scales.
    d: Vec<f32>,
    /// `[m, k / 32]`: `d * Σq` per block.
    bsum: Vec<f32>,
    /// `[m, k / 16]`: `Σq` per 16 elements.
    sum16: Vec<i32>,
}

/// One quantized activation row.
#[derive(Debug, Clone, Copy)]
pub struct ActRow<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub bsum: &'a [f32],
    pub sum16: &'a [i32],
}

impl Q8Acts {
    /// Quantizes `x` (`[m, k]`, `k > 0`, `k` a multiple of 32), reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], k: usize) {
        self.reshape(x, k);
        let nb = k / QK;
        for (r, xr) in x.chunks_exact(k).enumerate() {
            quantize_row(
                xr,
                &mut self.qs[r * k..(r + 1) * k],
                &mut self.d[r * nb..(r + 1) * nb],
                &mut self.bsum[r * nb..(r + 1) * nb],
                &mut self.sum16[r * 2 * nb..(r + 1) * 2 * nb],
            );
        }
    }

    /// [`Q8Acts::quantize`] with the rows split over `pool` (when there are enough of them).
    pub fn quantize_par(&mut self, x: &[f32], k: usize, pool: &ThreadPool) {
        let m = self.reshape(x, k);
        if m < 8 || pool.num_threads() == 1 {
            self.quantize(x, k);
            return;
        }
        let rows = self.rows_mut(m, k);
        pool.parallel_ranges(m, 4, |r| {
            // SAFETY: the row ranges of different tasks do not overlap.
            unsafe { rows.quantize(r.clone(), &x[r.start * k..r.end * k]) };
        });
    }

    /// The buffers sized for `[m, k]` (`k` a multiple of 32), for tasks that quantize disjoint
    /// rows of them.
    pub(crate) fn rows_mut(&mut self, m: usize, k: usize) -> Q8Rows<'_> {
        self.size_for(m, k);
        Q8Rows {
            k,
            qs: DisjointMut::new(&mut self.qs),
            d: DisjointMut::new(&mut self.d),
            bsum: DisjointMut::new(&mut self.bsum),
            sum16: DisjointMut::new(&mut self.sum16),
            _acts: std::marker::PhantomData,
        }
    }

    /// Checks the shape of `x` (`[m, k]`) and sizes the buffers for it (reused); returns `m`.
    fn reshape(&mut self, x: &[f32], k: usize) -> usize {
        assert!(
            k.is_multiple_of(QK) && k > 0 && x.len().is_multiple_of(k),
            "Q8Acts: bad shape"
        );
        let m = x.len() / k;
        self.size_for(m, k);
        m
    }

    /// Sizes the buffers for `[m, k]` (`k` a multiple of 32), reusing their memory.
    fn size_for(&mut self, m: usize, k: usize) {
        assert!(k.is_multiple_of(QK) && k > 0, "Q8Acts: bad shape");
        self.k = k;
        self.m = m;
        self.qs.resize(m * k, 0);
        self.d.resize(m * k / QK, 0.0);
        self.bsum.resize(m * k / QK, 0.0);
        self.sum16.resize(m * k / 16, 0);
    }

    pub fn rows(&self) -> usize {
        self.m
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    #[inline(always)]
    pub fn row(&self, i: usize) -> ActRow<'_> {
        let (k, nb) = (self.k, self.k / QK);
        ActRow {
            qs: &self.qs[i * k..(i + 1) * k],
            d: &self.d[i * nb..(i + 1) * nb],
            bsum: &self.bsum[i * nb..(i + 1) * nb],
            sum16: &self.sum16[i * 2 * nb..(i + 1) * 2 * nb],
        }
    }
}

/// A [`Q8Acts`] whose rows parallel tasks quantize, each its own rows.
pub(crate) struct Q8Rows<'a> {
    k: usize,
    qs: DisjointMut<i8>,
    d: DisjointMut<f32>,
    bsum: DisjointMut<f32>,
    sum16: DisjointMut<i32>,
    _acts: std::marker::PhantomData<&'a mut Q8Acts>,
}

impl Q8Rows<'_> {
    /// Quantizes `x` (`[rows.len(), k]`) into rows `rows`, as [`Q8Acts::quantize`] does.
    ///
    /// # Safety
    /// No other task writes any of `rows` meanwhile.
    pub(crate) unsafe fn quantize(&self, rows: std::ops::Range<usize>, x: &[f32]) {
        let (k, nb) = (self.k, self.k / QK);
        assert_eq!(x.len(), rows.len() * k, "Q8Rows: bad rows");
        for (r, xr) in rows.zip(x.chunks_exact(k)) {
            // SAFETY: row r's ranges belong to the caller alone (the slices check bounds).
            unsafe {
                quantize_row(
                    xr,
                    self.qs.slice(r * k, k),
                    self.d.slice(r * nb, nb),
                    self.bsum.slice(r * nb, nb),
                    self.sum16.slice(2 * r * nb, 2 * nb),
                )
            };
        }
    }
}

/// One row: codes, block scales, block sums and 16-element code sums. AVX-512 where the CPU
/// has it (the same bits: the conversion rounds to nearest even, as the plain loop does).
fn quantize_row(xr: &[f32], qs: &mut [i8], d: &mut [f32], bsum: &mut [f32], sum16: &mut [i32]) {
    let nb = xr.len() / QK;
    assert!(qs.len() == nb * QK && d.len() == nb && bsum.len() == nb && sum16.len() == 2 * nb);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU has the features; the lengths were checked above.
        unsafe { quantize_row_avx512(xr, qs, d, bsum, sum16) };
        return;
    }
    quantize_row_plain(xr, qs, d, bsum, sum16);
}

/// # Safety
/// The CPU supports AVX-512F and AVX-512BW (the caller checked [`super::simd::level`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::needless_range_loop)] // a block index addresses four arrays
unsafe fn quantize_row_avx512(
    xr: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    bsum: &mut [f32],
    sum16: &mut [i32],
) {
    use std::arch::x86_64::*;
    let nb = xr.len() / QK;
    // SAFETY: `quantize_row` checked every length against the row's block count.
    unsafe {
        // Block `b`'s scale into `d[b]`, and its two halves' codes.
        let mut block = |b: usize| {
            let x0 = _mm512_loadu_ps(xr.as_ptr().add(b * QK));
            let x1 = _mm512_loadu_ps(xr.as_ptr().add(b * QK + 16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            let db = amax / 127.0;
            let id = _mm512_set1_ps(if db > 0.0 { 1.0 / db } else { 0.0 });
            let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
            let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
            d[b] = db;
            (_mm512_cvtsepi32_epi8(q0), _mm512_cvtsepi32_epi8(q1))
        };
        // Two blocks at a time: their 64 codes as one register, stored once, and their four
        // 16-code sums from it: pairs of codes, pairs of those (multiply-adds by one: exact),
        // then within 128-bit lanes, whose first values are the sums. Integer sums: the same
        // values as a horizontal sum per half.
        let (ones8, ones16) = (_mm512_set1_epi8(1), _mm512_set1_epi16(1));
        let mut b = 0;
        while b + 2 <= nb {
            let ((a0, a1), (b0, b1)) = (block(b), block(b + 1));
            let lo = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a0), a1);
            let hi = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(b0), b1);
            let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            _mm512_storeu_si512(qs.as_mut_ptr().add(b * QK) as *mut __m512i, v);
            let s4 = _mm512_madd_epi16(_mm512_maddubs_epi16(ones8, v), ones16);
            let s8 = _mm512_add_epi32(s4, _mm512_shuffle_epi32::<_MM_PERM_CDAB>(s4));
            let s16 = _mm512_add_epi32(s8, _mm512_shuffle_epi32::<_MM_PERM_BADC>(s8));
            let first = _mm512_maskz_compress_epi32(0x1111, s16);
            _mm_storeu_si128(
                sum16.as_mut_ptr().add(2 * b) as *mut __m128i,
                _mm512_castsi512_si128(first),
            );
            b += 2;
        }
        if b < nb {
            let (h0, h1) = block(b);
            for (h, codes) in [h0, h1].into_iter().enumerate() {
                _mm_storeu_si128(qs.as_mut_ptr().add(b * QK + 16 * h) as *mut __m128i, codes);
                let c: [i8; 16] = std::mem::transmute(codes);
                sum16[2 * b + h] = c.iter().map(|&q| q as i32).sum();
            }
        }
        for b in 0..nb {
            bsum[b] = d[b] * (sum16[2 * b] + sum16[2 * b + 1]) as f32;
        }
    }
}

multiversion! {
    fn quantize_row_plain(
        xr: &[f32],
        qs: &mut [i8],
        d: &mut [f32],
        bsum: &mut [f32],
        sum16: &mut [i32],
    ) = quantize_row_impl;
}

#[inline(always)]
fn quantize_row_impl(
    xr: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    bsum: &mut [f32],
    sum16: &mut [i32],
) {
    for (b, (xs, q)) in xr.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).enumerate() {
        let mut amax = [0f32; 8];
        for c in xs.chunks_exact(8) {
            for j in 0..8 {
                amax[j] = amax[j].max(c[j].abs());
            }
        }
        let amax = amax.iter().fold(0f32, |a, &v| a.max(v));
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        for (q, &v) in q.iter_mut().zip(xs) {
            *q = (v * id).round_ties_even() as i8;
        }
        let s0: i32 = q[..16].iter().map(|&v| v as i32).sum();
        let s1: i32 = q[16..].iter().map(|&v| v as i32).sum();
        sum16[2 * b] = s0;
        sum16[2 * b + 1] = s1;
        d[b] = db;
        bsum[b] = db * (s0 + s1) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..96).map(|i| (i as f32 - 20.0) * 0.5).collect();
        let mut a = Q8Acts::default();
        a.quantize(&x, 96);
        let r = a.row(0);
        for (i, &v) in x.iter().enumerate() {
            let d = r.d[i / QK];
            assert!((r.qs[i] as f32 * d - v).abs() <= d * 0.5 + 1e-6);
        }
        for b in 0..3 {
            let s: i32 = r.qs[32 * b..32 * b + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(r.sum16[2 * b], s);
            let all: i32 = r.qs[32 * b..32 * b + 32].iter().map(|&q| q as i32).sum();
            assert_eq!(r.bsum[b], r.d[b] * all as f32);
        }
        // The parallel form gives the same rows.
        let big: Vec<f32> = (0..40 * 64)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.3)
            .collect();
        let (mut one, mut par) = (Q8Acts::default(), Q8Acts::default());
        one.quantize(&big, 64);
        par.quantize_par(&big, 64, &ThreadPool::new(2).expect("pool"));
        for i in 0..40 {
            let (x, y) = (one.row(i), par.row(i));
            assert_eq!((x.qs, x.d, x.bsum, x.sum16), (y.qs, y.d, y.bsum, y.sum16));
        }
        // The AVX-512 and plain rows agree to the bit.
        let nb = big.len() / QK;
        let mut plain = (
            vec![0i8; big.len()],
            vec![0f32; nb],
            vec![0f32; nb],
            vec![0i32; 2 * nb],
        );
        quantize_row_plain(&big, &mut plain.0, &mut plain.1, &mut plain.2, &mut plain.3);
        let mut best = (
            vec![0i8; big.len()],
            vec![0f32; nb],
            vec![0f32; nb],
            vec![0i32; 2 * nb],
        );
        quantize_row(&big, &mut best.0, &mut best.1, &mut best.2, &mut best.3);
        assert_eq!(plain, best);
        // Odd block counts (the last block's sums on their own) and codes at both ends.
        for nb in [1, 3, 9] {
            let x: Vec<f32> = (0..nb * QK)
                .map(|i| match i % 7 {
                    0 => 3.0,
                    1 => -3.0,
                    _ => ((i * 13 % 29) as f32 - 14.0) * 0.2,
                })
                .collect();
            let mut want = (
                vec![0i8; x.len()],
                vec![0f32; nb],
                vec![0f32; nb],
                vec![0i32; 2 * nb],
            );
            quantize_row_plain(&x, &mut want.0, &mut want.1, &mut want.2, &mut want.3);
            let mut got = (
                vec![0i8; x.len()],
                vec![0f32; nb],
                vec![0f32; nb],
                vec![0i32; 2 * nb],
            );
            quantize_row(&x, &mut got.0, &mut got.1, &mut got.2, &mut got.3);
            assert_eq!(want, got, "{nb} blocks");
        }
        a.quantize(&[0.0; 32], 32);
        assert_eq!(a.row(0).d[0], 0.0);
        assert!(a.row(0).qs.iter().all(|&q| q == 0));
    }
}
