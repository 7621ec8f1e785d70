//! Integer dot products of 32-element weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) with
//! activations quantized to 8 bits per 32-element block ([`Q8Acts`]).
//!
//! One arithmetic, every instruction set. Per block, weight codes (signed: Q4_0 `n - 8`,
//! Q5_0 `n - 16`, Q8_0; unsigned: Q4_1 and Q5_1 `n`) meet the activation codes in eight exact
//! `i32` lane sums, lane `l` covering elements `4l..4l+4`. Each lane is scaled by
//! `d_w * d_a` and added to its own f32 accumulator (a multiply, then an add: never fused),
//! with two sets of eight, for even and odd blocks, so consecutive blocks do not wait on each
//! other; Q4_1/Q5_1 add `m_w * (d_a * Σa)` to one more accumulator. The row's result adds the
//! two sets lane by lane, then `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) + a_min`. The scalar reference spells this out;
//! the AVX2 and AVX-512 VNNI paths compute it with vector lanes, so all three agree to the
//! bit, and a row's result never depends on its batch-mates.

use crate::DType;
use half::f16;

/// Elements per block of both weights and quantized activations.
pub const QK: usize = 32;

/// Activation rows quantized per block of 32: `x ≈ d * q`, `d = max|x| / 127`.
#[derive(Debug, Default, Clone)]
pub struct Q8Acts {
    k: usize,
    m: usize,
    /// `[m, k]` codes.
    qs: Vec<i8>,
    /// `[m, k / 32]` block scales.
    d: Vec<f32>,
    /// `[m, k / 32]`: `d * Σq` per block (for the weights' minimums).
    s: Vec<f32>,
}

/// One quantized activation row.
#[derive(Debug, Clone, Copy)]
pub struct ActRow<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
}

impl Q8Acts {
    /// Quantizes `x` (`[m, k]`, `k` a multiple of 32), reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], k: usize) {
        assert!(
            k.is_multiple_of(QK) && k > 0 && x.len().is_multiple_of(k),
            "Q8Acts: bad shape"
        );
        let m = x.len() / k;
        let nb = k / QK;
        self.k = k;
        self.m = m;
        self.qs.resize(m * k, 0);
        self.d.resize(m * nb, 0.0);
        self.s.resize(m * nb, 0.0);
        for (b, (xs, qs)) in x
            .chunks_exact(QK)
            .zip(self.qs.chunks_exact_mut(QK))
            .enumerate()
        {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in qs.iter_mut().zip(xs) {
                let r = (v * id).round() as i8;
                *q = r;
                sum += r as i32;
            }
            self.d[b] = d;
            self.s[b] = d * sum as f32;
        }
    }

    pub fn rows(&self) -> usize {
        self.m
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    pub fn row(&self, i: usize) -> ActRow<'_> {
        let nb = self.k / QK;
        ActRow {
            qs: &self.qs[i * self.k..(i + 1) * self.k],
            d: &self.d[i * nb..(i + 1) * nb],
            s: &self.s[i * nb..(i + 1) * nb],
        }
    }
}

/// Whether weights of `dtype` have an integer dot product here.
pub fn supports(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
    )
}

/// The instruction sets with a kernel, best first. NEON would slot in here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx512Vnni,
    Avx2,
    Scalar,
}

impl Isa {
    /// The best one this CPU has.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c");
            if avx2
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512vl")
            {
                return Isa::Avx512Vnni;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every set this CPU can run (for tests).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        [Isa::Avx512Vnni, Isa::Avx2, Isa::Scalar]
            .into_iter()
            .filter(|&i| match best {
                Isa::Avx512Vnni => true,
                Isa::Avx2 => i != Isa::Avx512Vnni,
                Isa::Scalar => i == Isa::Scalar,
            })
            .collect()
    }
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// The fixed reduction of the eight lane accumulators.
#[inline(always)]
fn reduce(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// `Σ_j w[j] · x[j]` over one weight row (`dtype` blocks) and one activation row, using `isa`
/// (which must be one of [`Isa::available`]).
pub fn dot_row(isa: Isa, dtype: DType, w: &[u8], a: ActRow<'_>) -> f32 {
    let nb = a.d.len();
    assert!(
        w.len() == nb * dtype.block_bytes() && a.qs.len() == nb * QK && a.s.len() == nb,
        "dot_row: {} weight bytes against {nb} activation blocks",
        w.len()
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` comes from `Isa::detect`/`available`, so the CPU has these features;
        // the lengths were checked above.
        Isa::Avx512Vnni => unsafe { x86::dot_row_vnni(dtype, w, a) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::dot_row_avx2(dtype, w, a) },
        _ => dot_row_scalar(dtype, w, a),
    }
}

/// [`dot_row`] for four activation rows at once (bit-identical to four calls), decoding each
/// weight block once: the prefill and batched-decode path.
pub fn dot_rows4(isa: Isa, dtype: DType, w: &[u8], a: &[ActRow<'_>; 4]) -> [f32; 4] {
    for r in a {
        let nb = r.d.len();
        assert!(
            w.len() == nb * dtype.block_bytes() && r.qs.len() == nb * QK && r.s.len() == nb,
            "dot_rows4: {} weight bytes against {nb} activation blocks",
            w.len()
        );
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot_row`; lengths checked above.
        Isa::Avx512Vnni => unsafe { x86::dot_rows4_vnni(dtype, w, a) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::dot_rows4_avx2(dtype, w, a) },
        _ => a.map(|r| dot_row_scalar(dtype, w, r)),
    }
}

/// A block's codes (signed, or unsigned with `has_min`) and its f16 scale(s).
fn block_codes(dtype: DType, blk: &[u8], codes: &mut [i32; QK]) {
    match dtype {
        DType::Q4_0 | DType::Q4_1 => {
            let (qs, off) = if dtype == DType::Q4_0 {
                (&blk[2..18], 8)
            } else {
                (&blk[4..20], 0)
            };
            for j in 0..16 {
                codes[j] = (qs[j] & 0x0F) as i32 - off;
                codes[j + 16] = (qs[j] >> 4) as i32 - off;
            }
        }
        DType::Q5_0 | DType::Q5_1 => {
            let (o, off) = if dtype == DType::Q5_0 {
                (2, 16)
            } else {
                (4, 0)
            };
            let qh = u32::from_le_bytes([blk[o], blk[o + 1], blk[o + 2], blk[o + 3]]);
            let qs = &blk[o + 4..o + 20];
            for j in 0..16 {
                codes[j] = ((qs[j] & 0x0F) as i32 | ((((qh >> j) & 1) as i32) << 4)) - off;
                codes[j + 16] =
                    ((qs[j] >> 4) as i32 | ((((qh >> (j + 16)) & 1) as i32) << 4)) - off;
            }
        }
        DType::Q8_0 => {
            for (c, &q) in codes.iter_mut().zip(&blk[2..34]) {
                *c = (q as i8) as i32;
            }
        }
        other => panic!("dot_row: no integer dot product for {other}"),
    }
}

/// The reference: the module's arithmetic in plain loops.
pub fn dot_row_scalar(dtype: DType, w: &[u8], a: ActRow<'_>) -> f32 {
    let has_min = matches!(dtype, DType::Q4_1 | DType::Q5_1);
    let mut acc = [[0f32; 8]; 2];
    let mut acc_min = 0f32;
    let mut codes = [0i32; QK];
    for (b, blk) in w.chunks_exact(dtype.block_bytes()).enumerate() {
        block_codes(dtype, blk, &mut codes);
        let aq = &a.qs[b * QK..(b + 1) * QK];
        let scale = f16_at(blk, 0) * a.d[b];
        for (l, lane) in acc[b % 2].iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4).map(|j| codes[j] * aq[j] as i32).sum();
            *lane += p as f32 * scale;
        }
        if has_min {
            acc_min += f16_at(blk, 2) * a.s[b];
        }
    }
    let lanes: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    reduce(lanes) + acc_min
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ActRow, QK};
    use crate::DType;
    use std::arch::x86_64::*;

    // Block formats as const generics, so each row loop is compiled for one format.
    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q5_0: u8 = 2;
    const Q5_1: u8 = 3;
    const Q8_0: u8 = 4;

    /// Eight `i32` lane sums of `u8` weights times `i8` activations (lane `l`: bytes
    /// `4l..4l+4`).
    trait LaneDot {
        unsafe fn lanes(w: __m256i, a: __m256i) -> __m256i;
    }

    struct Avx2Dot;
    impl LaneDot for Avx2Dot {
        #[inline(always)]
        unsafe fn lanes(w: __m256i, a: __m256i) -> __m256i {
            // SAFETY: only called from functions compiled with AVX2, checked at run time.
            // maddubs cannot saturate: |w| <= 128 and |a| <= 127, two products per lane.
            unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)) }
        }
    }

    struct VnniDot;
    impl LaneDot for VnniDot {
        #[inline(always)]
        unsafe fn lanes(w: __m256i, a: __m256i) -> __m256i {
            // SAFETY: only called from functions compiled with AVX-512 VNNI + VL.
            unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a) }
        }
    }

    /// 16 bytes of packed nibbles -> 32 bytes: low nibbles, then high nibbles.
    #[inline(always)]
    unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
        // SAFETY: `p` points at 16 readable bytes of the weight block.
        unsafe {
            let q = _mm_loadu_si128(p as *const __m128i);
            let m = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(q, m);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m);
            _mm256_set_m128i(hi, lo)
        }
    }

    /// Bit `i` of `qh` -> byte `i` set to 0x10 (the fifth bit of Q5 codes).
    #[inline(always)]
    unsafe fn fifth_bits(qh: u32) -> __m256i {
        // SAFETY: register-only intrinsics.
        unsafe {
            let v = _mm256_set1_epi32(qh as i32);
            let spread = _mm256_setr_epi64x(
                0x0000_0000_0000_0000,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            );
            let bytes = _mm256_shuffle_epi8(v, spread);
            let bits = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64));
            let set = _mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1));
            _mm256_and_si256(set, _mm256_set1_epi8(0x10))
        }
    }

    #[inline(always)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        // SAFETY: `p` points at 2 readable bytes; F16C is enabled with AVX2 here.
        unsafe {
            let h = (p as *const u16).read_unaligned();
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
        }
    }

    /// The block's codes as bytes: unsigned for Q4_1/Q5_1, signed otherwise.
    #[inline(always)]
    unsafe fn codes<const T: u8>(blk: *const u8) -> __m256i {
        // SAFETY: `blk` points at one whole block of format `T`.
        unsafe {
            match T {
                Q4_0 => _mm256_sub_epi8(unpack_nibbles(blk.add(2)), _mm256_set1_epi8(8)),
                Q4_1 => unpack_nibbles(blk.add(4)),
                Q5_0 | Q5_1 => {
                    let o = if T == Q5_0 { 2 } else { 4 };
                    let qh = (blk.add(o) as *const u32).read_unaligned();
                    let v = _mm256_or_si256(unpack_nibbles(blk.add(o + 4)), fifth_bits(qh));
                    if T == Q5_0 {
                        _mm256_sub_epi8(v, _mm256_set1_epi8(16))
                    } else {
                        v
                    }
                }
                _ => _mm256_loadu_si256(blk.add(2) as *const __m256i),
            }
        }
    }

    /// Block `b`'s scaled lanes, and its minimum term (0 without minimums).
    #[inline(always)]
    unsafe fn block<const T: u8, D: LaneDot>(
        bb: usize,
        w: *const u8,
        a: ActRow<'_>,
        b: usize,
    ) -> (__m256, f32) {
        // SAFETY: the caller guarantees block `b` exists in `w` and `a`.
        unsafe {
            let wp = w.add(b * bb);
            let wv = codes::<T>(wp);
            let av = _mm256_loadu_si256(a.qs.as_ptr().add(b * QK) as *const __m256i);
            let has_min = T == Q4_1 || T == Q5_1;
            let lanes = if has_min {
                D::lanes(wv, av)
            } else {
                // Signed weights: move the sign onto the activations.
                D::lanes(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv))
            };
            let scale = _mm256_set1_ps(f16_at(wp) * *a.d.get_unchecked(b));
            let p = _mm256_mul_ps(_mm256_cvtepi32_ps(lanes), scale);
            let m = if has_min {
                f16_at(wp.add(2)) * *a.s.get_unchecked(b)
            } else {
                0.0
            };
            (p, m)
        }
    }

    #[inline(always)]
    unsafe fn row<const T: u8, D: LaneDot>(bb: usize, w: &[u8], a: ActRow<'_>) -> f32 {
        let nb = a.d.len();
        let has_min = T == Q4_1 || T == Q5_1;
        // SAFETY: the caller checked `w.len() == nb * bb`, `a.qs.len() == nb * 32` and
        // `a.s.len() == nb`, so every block index below is in bounds.
        unsafe {
            let wp = w.as_ptr();
            let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut acc_min = 0f32;
            let mut b = 0;
            while b + 1 < nb {
                let (p0, m0) = block::<T, D>(bb, wp, a, b);
                let (p1, m1) = block::<T, D>(bb, wp, a, b + 1);
                even = _mm256_add_ps(even, p0);
                odd = _mm256_add_ps(odd, p1);
                if has_min {
                    acc_min += m0;
                    acc_min += m1;
                }
                b += 2;
            }
            if b < nb {
                let (p0, m0) = block::<T, D>(bb, wp, a, b);
                even = _mm256_add_ps(even, p0);
                if has_min {
                    acc_min += m0;
                }
            }
            let acc = _mm256_add_ps(even, odd);
            // ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), as `super::reduce`.
            let x = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
            let y = _mm_add_ps(x, _mm_movehl_ps(x, x));
            let z = _mm_add_ss(y, _mm_shuffle_ps::<0b01>(y, y));
            _mm_cvtss_f32(z) + acc_min
        }
    }

    /// Four activation rows against one weight row: each block's codes are decoded once.
    /// Every row goes through exactly the arithmetic of [`row`], so results are identical.
    #[inline(always)]
    unsafe fn rows4<const T: u8, D: LaneDot>(bb: usize, w: &[u8], a: &[ActRow<'_>; 4]) -> [f32; 4] {
        let nb = a[0].d.len();
        let has_min = T == Q4_1 || T == Q5_1;
        // SAFETY: the caller checked every row's lengths against `w` (nb blocks each).
        unsafe {
            let wp = w.as_ptr();
            let mut acc = [[_mm256_setzero_ps(); 4]; 2];
            let mut mins = [0f32; 4];
            for b in 0..nb {
                let blk = wp.add(b * bb);
                let wv = codes::<T>(blk);
                let wabs = _mm256_sign_epi8(wv, wv);
                let dw = f16_at(blk);
                let mw = if has_min { f16_at(blk.add(2)) } else { 0.0 };
                let k = b & 1;
                for r in 0..4 {
                    let av = _mm256_loadu_si256(a[r].qs.as_ptr().add(b * QK) as *const __m256i);
                    let lanes = if has_min {
                        D::lanes(wv, av)
                    } else {
                        D::lanes(wabs, _mm256_sign_epi8(av, wv))
                    };
                    let scale = _mm256_set1_ps(dw * *a[r].d.get_unchecked(b));
                    let p = _mm256_mul_ps(_mm256_cvtepi32_ps(lanes), scale);
                    acc[k][r] = _mm256_add_ps(acc[k][r], p);
                    if has_min {
                        mins[r] += mw * *a[r].s.get_unchecked(b);
                    }
                }
            }
            let mut out = [0f32; 4];
            for r in 0..4 {
                let v = _mm256_add_ps(acc[0][r], acc[1][r]);
                let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let y = _mm_add_ps(x, _mm_movehl_ps(x, x));
                let z = _mm_add_ss(y, _mm_shuffle_ps::<0b01>(y, y));
                out[r] = _mm_cvtss_f32(z) + mins[r];
            }
            out
        }
    }

    #[inline(always)]
    unsafe fn dispatch4<D: LaneDot>(dtype: DType, w: &[u8], a: &[ActRow<'_>; 4]) -> [f32; 4] {
        let bb = dtype.block_bytes();
        // SAFETY: forwarded from the callers' contract.
        unsafe {
            match dtype {
                DType::Q4_0 => rows4::<Q4_0, D>(bb, w, a),
                DType::Q4_1 => rows4::<Q4_1, D>(bb, w, a),
                DType::Q5_0 => rows4::<Q5_0, D>(bb, w, a),
                DType::Q5_1 => rows4::<Q5_1, D>(bb, w, a),
                DType::Q8_0 => rows4::<Q8_0, D>(bb, w, a),
                other => panic!("dot_rows4: no integer dot product for {other}"),
            }
        }
    }

    /// # Safety
    /// As [`dot_row_avx2`], for every row.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn dot_rows4_avx2(dtype: DType, w: &[u8], a: &[ActRow<'_>; 4]) -> [f32; 4] {
        // SAFETY: the features are enabled for this function and checked by the caller.
        unsafe { dispatch4::<Avx2Dot>(dtype, w, a) }
    }

    /// # Safety
    /// As [`dot_row_vnni`], for every row.
    #[target_feature(enable = "avx2,f16c,avx512vnni,avx512vl")]
    pub(super) unsafe fn dot_rows4_vnni(dtype: DType, w: &[u8], a: &[ActRow<'_>; 4]) -> [f32; 4] {
        // SAFETY: as above.
        unsafe { dispatch4::<VnniDot>(dtype, w, a) }
    }

    #[inline(always)]
    unsafe fn dispatch<D: LaneDot>(dtype: DType, w: &[u8], a: ActRow<'_>) -> f32 {
        let bb = dtype.block_bytes();
        // SAFETY: forwarded from the callers' contract.
        unsafe {
            match dtype {
                DType::Q4_0 => row::<Q4_0, D>(bb, w, a),
                DType::Q4_1 => row::<Q4_1, D>(bb, w, a),
                DType::Q5_0 => row::<Q5_0, D>(bb, w, a),
                DType::Q5_1 => row::<Q5_1, D>(bb, w, a),
                DType::Q8_0 => row::<Q8_0, D>(bb, w, a),
                other => panic!("dot_row: no integer dot product for {other}"),
            }
        }
    }

    /// # Safety
    /// The CPU has AVX2 and F16C; `w` and `a` hold the same number of blocks.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn dot_row_avx2(dtype: DType, w: &[u8], a: ActRow<'_>) -> f32 {
        // SAFETY: the features are enabled for this function and checked by the caller.
        unsafe { dispatch::<Avx2Dot>(dtype, w, a) }
    }

    /// # Safety
    /// As [`dot_row_avx2`], plus AVX-512 VNNI and VL.
    #[target_feature(enable = "avx2,f16c,avx512vnni,avx512vl")]
    pub(super) unsafe fn dot_row_vnni(dtype: DType, w: &[u8], a: ActRow<'_>) -> f32 {
        // SAFETY: as above.
        unsafe { dispatch::<VnniDot>(dtype, w, a) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    /// Random-looking bytes for `nb` blocks of `dtype`, with sane f16 scales.
    fn blocks(dtype: DType, nb: usize, seed: u32) -> Vec<u8> {
        let bb = dtype.block_bytes();
        let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
        let mut v: Vec<u8> = (0..nb * bb)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 7) as u8
            })
            .collect();
        let scales = if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
            2
        } else {
            1
        };
        for (b, blk) in v.chunks_exact_mut(bb).enumerate() {
            for s in 0..scales {
                let val = f16::from_f32(
                    0.01 + 0.003 * ((b + s) % 7) as f32 * if s == 1 { -1.0 } else { 1.0 },
                );
                blk[2 * s..2 * s + 2].copy_from_slice(&val.to_bits().to_le_bytes());
            }
        }
        v
    }

    const TYPES: [DType; 5] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ];

    #[test]
    fn every_isa_matches_the_scalar_reference_exactly() {
        let k = 8 * QK;
        let x: Vec<f32> = (0..3 * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.07)
            .collect();
        let mut acts = Q8Acts::default();
        acts.quantize(&x, k);
        for dtype in TYPES {
            let w = blocks(dtype, k / QK, dtype as u32);
            for r in 0..3 {
                let want = dot_row_scalar(dtype, &w, acts.row(r));
                for isa in Isa::available() {
                    let got = dot_row(isa, dtype, &w, acts.row(r));
                    assert_eq!(got.to_bits(), want.to_bits(), "{dtype} {isa:?} row {r}");
                }
            }
            let rows = [acts.row(2), acts.row(0), acts.row(1), acts.row(2)];
            for isa in Isa::available() {
                let four = dot_rows4(isa, dtype, &w, &rows);
                for (got, r) in four.iter().zip(&rows) {
                    let want = dot_row_scalar(dtype, &w, *r);
                    assert_eq!(got.to_bits(), want.to_bits(), "{dtype} {isa:?} rows4");
                }
            }
        }
    }

    #[test]
    fn close_to_the_float_product() {
        let k = 16 * QK;
        let x: Vec<f32> = (0..k).map(|i| ((i as f32) * 0.013).sin()).collect();
        let mut acts = Q8Acts::default();
        acts.quantize(&x, k);
        for dtype in TYPES {
            let w = blocks(dtype, k / QK, 7);
            let mut wf = vec![0f32; k];
            dequantize_row(dtype, &w, &mut wf);
            let exact: f64 = wf.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let norm: f64 = wf
                .iter()
                .zip(&x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let got = dot_row(Isa::detect(), dtype, &w, acts.row(0)) as f64;
            // 8-bit activations: error well under 1% of the sum of magnitudes.
            assert!(
                (got - exact).abs() < 0.01 * norm,
                "{dtype}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn quantization_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.5).collect();
        let mut a = Q8Acts::default();
        a.quantize(&x, 64);
        let r = a.row(0);
        for (i, &v) in x.iter().enumerate() {
            let d = r.d[i / QK];
            assert!((r.qs[i] as f32 * d - v).abs() <= d * 0.5 + 1e-6);
        }
        let sum: i32 = r.qs[..32].iter().map(|&q| q as i32).sum();
        assert_eq!(r.s[0], r.d[0] * sum as f32);
        a.quantize(&[0.0; 32], 32);
        assert_eq!(a.row(0).d[0], 0.0);
        assert!(a.row(0).qs.iter().all(|&q| q == 0));
    }
}
