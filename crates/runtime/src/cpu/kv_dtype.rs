//! Element types of the KV cache: f32, a half type (f16, bf16) that halves the bytes
//! attention reads per step, or int8 with a scale per (token, KV head) row that quarters them.
//!
//! A half cache stores each key and value rounded to nearest (ties to even) when it is written;
//! attention widens them back to f32, which is exact, and then runs the same f32 arithmetic as
//! for an f32 cache. So attention over a half cache gives exactly the bits of attention over an
//! f32 cache holding the rounded values, whatever the instruction set: the widening differs
//! between builds (`vcvtph2ps` or plain code), its result does not.
//!
//! An fp8 cache ([`KvDtype::Fp8`], e4m3 with an f32 scale per row) is a GPU cache: no host
//! element type implements it.
//!
//! An int8 cache ([`KvElem::SCALED`]) stores each head's key or value row `x` (head_dim values)
//! in groups of [`SCALE_GROUP`] (32, llama.cpp's `q8_0` block) values: a group with largest
//! magnitude `amax` gets the scale `s`, `amax / 127` rounded up to an f16, and its values
//! `q = round(x / s)` (half away from zero), so `|q| ≤ 127` and `q · s` differs from `x` by at
//! most `s / 2` (and a few ulps): 1/254 of the group's largest value. Groups keep a channel of
//! large values from coarsening the rest of the row (with one scale per row, Qwen2.5-Coder-1.5B's
//! mean KL divergence from its f16 cache was 1.8e-2 nats; by groups, 2.8e-3).
//! Attention widens `q` exactly to f32 and applies the scales once per group of each key: to the
//! group's partial dot product, and to the key's softmax weight for the group's values. A group
//! with a non-finite value, or whose scale overflows an f16 (`amax` past 8.3e6), gets a
//! non-finite scale, so it poisons attention as an overflowing f16 cache would.
use half::{bf16, f16};

/// Element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    F16,
    Bf16,
    /// int8 with an f16 scale per [`SCALE_GROUP`] values of each (token, KV head) row.
    Int8,
    /// fp8 (e4m3) with an f32 scale per (token, KV head) row: a GPU cache (its kernels in
    /// `kernels/ferrum_kernels/fp8.py`); the CPU's quantized cache is [`KvDtype::Int8`].
    Fp8,
}

impl KvDtype {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Int8 | KvDtype::Fp8 => 1,
        }
    }

    /// Scales stored beside each (token, KV head) row of `head_dim` keys or values: one per
    /// [`SCALE_GROUP`] for int8, one for fp8, none for the float types.
    pub fn scales_per_row(self, head_dim: usize) -> usize {
        match self {
            KvDtype::Int8 => head_dim.div_ceil(SCALE_GROUP),
            KvDtype::Fp8 => 1,
            KvDtype::F32 | KvDtype::F16 | KvDtype::Bf16 => 0,
        }
    }

    /// Bytes of one scale: an f16 for int8, an f32 for fp8 (none for the float types).
    pub fn scale_bytes(self) -> usize {
        match self {
            KvDtype::Int8 => 2,
            KvDtype::Fp8 => 4,
            KvDtype::F32 | KvDtype::F16 | KvDtype::Bf16 => 0,
        }
    }

    /// Bytes one token takes in one KV head's keys (or values), scales included.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        head_dim * self.size() + self.scale_bytes() * self.scales_per_row(head_dim)
    }

    /// The lower-case name used by flags, reports and the GPU kernels' names (`f32`, `f16`,
    /// `bf16`, `int8`, `fp8`).
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Int8 => "int8",
            KvDtype::Fp8 => "fp8",
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Values of a row that share one scale in a scaled cache (int8).
pub const SCALE_GROUP: usize = 32;

/// A type the KV cache can hold.
pub trait KvElem: sealed::Widen16 + Copy + Send + Sync + 'static {
    const DTYPE: KvDtype;
    /// Whether each (token, KV head) row is stored with a scale per [`SCALE_GROUP`] values
    /// ([`KvElem::encode_row`]): value `d` is `to_f32() · scale[d / SCALE_GROUP]`.
    const SCALED: bool = false;
    /// Rounds to nearest, ties to even (int8: half away from zero, saturating).
    fn from_f32(x: f32) -> Self;
    /// Exact (int8: the stored integer, unscaled).
    fn to_f32(self) -> f32;
    /// Stores the row `src` into `dst` (equal lengths), and for a scaled type its groups'
    /// scales into `scales` (one per [`SCALE_GROUP`]; untouched, and may be empty, for the
    /// unscaled types, which round each value: [`KvElem::narrow_row`]).
    #[inline]
    fn encode_row(src: &[f32], dst: &mut [Self], scales: &mut [f16]) {
        let _ = scales;
        Self::narrow_row(src, dst);
    }
    /// `dst[i] = from_f32(src[i])` (equal lengths), as fast as this CPU does it.
    #[inline]
    fn narrow_row(src: &[f32], dst: &mut [Self]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(x);
        }
    }
}

impl KvElem for f32 {
    const DTYPE: KvDtype = KvDtype::F32;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for f16 {
    const DTYPE: KvDtype = KvDtype::F16;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    /// `vcvtps2ph` (round to nearest even, as `from_f32`) where the CPU has F16C.
    #[inline]
    fn narrow_row(src: &[f32], dst: &mut [f16]) {
        #[cfg(target_arch = "x86_64")]
        if super::simd::level() != super::simd::SimdLevel::Baseline {
            // SAFETY: every level above the baseline has AVX2 and F16C (`simd::level`).
            unsafe { narrow_f16c(src, dst) };
            return;
        }
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = f16::from_f32(x);
        }
    }
}

/// [`KvElem::narrow_row`] for f16 with F16C, 8 values at a time.
///
/// # Safety
/// The CPU has AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn narrow_f16c(src: &[f32], dst: &mut [f16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    for (s, d) in src[..whole]
        .chunks_exact(8)
        .zip(dst[..whole].chunks_exact_mut(8))
    {
        // SAFETY: 8 values are read from `s` and 8 written to `d`, which hold them; f16 is
        // 16-bit plain data.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm_storeu_si128(d.as_mut_ptr() as *mut __m128i, h);
        }
    }
    for (d, &x) in dst[whole..n].iter_mut().zip(&src[whole..n]) {
        *d = f16::from_f32(x);
    }
}

impl KvElem for bf16 {
    const DTYPE: KvDtype = KvDtype::Bf16;
    /// Round to nearest even on the bits ([`super::bpack::to_bf16`]): plain integer arithmetic
    /// that vectorizes, with the library's results.
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_bits(super::bpack::to_bf16(x))
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

impl KvElem for i8 {
    const DTYPE: KvDtype = KvDtype::Int8;
    const SCALED: bool = true;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        // `as` saturates (NaN becomes 0).
        x.round() as i8
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    /// Per group: scale `s = amax / 127` rounded up to an f16, `q = round(x / s)` (see the
    /// module doc). An all-zero group has scale 0; a group holding a non-finite value a
    /// non-finite scale.
    #[inline]
    fn encode_row(src: &[f32], dst: &mut [i8], scales: &mut [f16]) {
        for ((x, q), s) in src
            .chunks(SCALE_GROUP)
            .zip(dst.chunks_mut(SCALE_GROUP))
            .zip(scales.iter_mut())
        {
            let scale = group_scale(x);
            *s = scale;
            let s = scale.to_f32();
            for (d, &v) in q.iter_mut().zip(x) {
                *d = if s > 0.0 && s.is_finite() {
                    (v / s).round().clamp(-127.0, 127.0) as i8
                } else {
                    0
                };
            }
        }
    }
}

/// The f16 scale of one group: `amax / 127` rounded up (so `|x| / scale ≤ 127`), NaN for a
/// group holding a non-finite value, infinity past the f16 range.
fn group_scale(x: &[f32]) -> f16 {
    if !x.iter().all(|v| v.is_finite()) {
        return f16::NAN;
    }
    let s = x.iter().fold(0f32, |m, &v| m.max(v.abs())) / 127.0;
    let h = f16::from_f32(s);
    if h.to_f32() >= s {
        h
    } else {
        // The next f16 up (`h` is finite and non-negative here: below `s`, which is finite).
        f16::from_bits(h.to_bits() + 1)
    }
}

/// A zeroed vector of `len` elements from the allocator's zeroed memory, so its pages stay
/// untouched (and not resident) until used, as `vec![0f32; len]` does.
pub fn zeroed_vec<E: KvElem>(len: usize) -> Vec<E> {
    match E::DTYPE {
        KvDtype::F32 => reinterpret(vec![0f32; len]),
        KvDtype::F16 | KvDtype::Bf16 => reinterpret(vec![0u16; len]),
        KvDtype::Int8 | KvDtype::Fp8 => reinterpret(vec![0u8; len]),
    }
}

/// `v` as a vector of `E`, whose all-zero bit pattern is zero.
fn reinterpret<T: Copy, E: KvElem>(v: Vec<T>) -> Vec<E> {
    assert!(
        std::mem::size_of::<T>() == std::mem::size_of::<E>()
            && std::mem::align_of::<T>() == std::mem::align_of::<E>()
    );
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: `E` is f32, f16, bf16 or i8: plain data with the size and alignment of `T` (checked
    // above) for which every bit pattern, zero included, is a valid value; the allocation is
    // handed over whole, with its length and capacity.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut E, v.len(), v.capacity()) }
}

/// The widening of 16 elements as each build of the attention kernel does it. Crate-internal:
/// a build's marker is only used inside functions compiled with its features, after the CPU
/// was checked for them.
pub(crate) mod sealed {
    use half::{bf16, f16};

    /// How one build widens 16 f16 values, and takes the maximum of a block's visible scores.
    pub trait Isa {
        fn f16x16(src: &[f16]) -> [f32; 16];

        /// 16 int8 values as f32 (exact).
        #[inline(always)]
        fn i8x16(src: &[i8]) -> [f32; 16] {
            std::array::from_fn(|i| f32::from(src[i]))
        }

        /// The largest of `scores[lo..hi]` that is not NaN (minus infinity when there is
        /// none): the fold of `f32::max` from minus infinity, which is exact in any order.
        #[inline(always)]
        fn visible_max16(scores: &[f32; 16], lo: usize, hi: usize) -> f32 {
            scores[lo.min(hi)..hi.min(16)]
                .iter()
                .fold(f32::NEG_INFINITY, |a, &b| a.max(b))
        }
    }

    /// Lanes `lo..hi` of 16 as a bit mask.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn lanes(lo: usize, hi: usize) -> u32 {
        let below = |n: usize| (1u32 << n.min(16)) - 1;
        below(hi) & !below(lo)
    }

    /// Any CPU: the library's scalar conversion.
    pub struct Portable;

    impl Isa for Portable {
        #[inline(always)]
        fn f16x16(src: &[f16]) -> [f32; 16] {
            std::array::from_fn(|i| src[i].to_f32())
        }
    }

    /// AVX2 builds (which also enable F16C): two `vcvtph2ps` of 8.
    #[cfg(target_arch = "x86_64")]
    pub struct Avx2;

    #[cfg(target_arch = "x86_64")]
    impl Isa for Avx2 {
        #[inline(always)]
        fn f16x16(src: &[f16]) -> [f32; 16] {
            use std::arch::x86_64::*;
            let src = &src[..16];
            // SAFETY: 16 values (32 bytes) are read from a slice that has them; this marker is
            // only used in functions compiled with F16C, which the CPU was checked for.
            unsafe {
                let p = src.as_ptr() as *const __m128i;
                let lo = _mm256_cvtph_ps(_mm_loadu_si128(p));
                let hi = _mm256_cvtph_ps(_mm_loadu_si128(p.add(1)));
                std::mem::transmute::<[__m256; 2], [f32; 16]>([lo, hi])
            }
        }

        /// Two sign extensions of 8 to 32 bits, then conversions.
        #[inline(always)]
        fn i8x16(src: &[i8]) -> [f32; 16] {
            use std::arch::x86_64::*;
            let src = &src[..16];
            // SAFETY: 16 bytes are read from a slice that has them; this marker is only used
            // in functions compiled with AVX2.
            unsafe {
                let b = _mm_loadu_si128(src.as_ptr() as *const __m128i);
                let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(b)));
                std::mem::transmute::<[__m256; 2], [f32; 16]>([lo, hi])
            }
        }

        /// Invisible and NaN lanes become minus infinity, then a tree of maxima.
        #[inline(always)]
        fn visible_max16(scores: &[f32; 16], lo: usize, hi: usize) -> f32 {
            use std::arch::x86_64::*;
            let m = lanes(lo, hi);
            // SAFETY: register arithmetic on 16 values the array holds; this marker is only
            // used in functions compiled with AVX2.
            unsafe {
                let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
                let half = |v: __m256, bits: u32| {
                    let sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
                    let on = _mm256_cmpeq_epi32(
                        _mm256_and_si256(_mm256_set1_epi32(bits as i32), sel),
                        sel,
                    );
                    let ord = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
                    _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(_mm256_and_si256(on, ord)))
                };
                let a = half(_mm256_loadu_ps(scores.as_ptr()), m & 0xff);
                let b = half(_mm256_loadu_ps(scores.as_ptr().add(8)), m >> 8);
                let v = _mm256_max_ps(a, b);
                let v = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let v = _mm_max_ps(v, _mm_movehl_ps(v, v));
                let v = _mm_max_ss(v, _mm_shuffle_ps::<1>(v, v));
                _mm_cvtss_f32(v)
            }
        }
    }

    /// AVX-512 builds: one `vcvtph2ps` of 16.
    #[cfg(target_arch = "x86_64")]
    pub struct Avx512;

    #[cfg(target_arch = "x86_64")]
    impl Isa for Avx512 {
        #[inline(always)]
        fn f16x16(src: &[f16]) -> [f32; 16] {
            use std::arch::x86_64::*;
            let src = &src[..16];
            // SAFETY: 16 values (32 bytes) are read from a slice that has them; this marker is
            // only used in functions compiled with AVX-512F, which the CPU was checked for.
            unsafe {
                let v = _mm512_cvtph_ps(_mm256_loadu_si256(src.as_ptr() as *const __m256i));
                std::mem::transmute::<__m512, [f32; 16]>(v)
            }
        }

        /// One sign extension of 16 to 32 bits, then a conversion.
        #[inline(always)]
        fn i8x16(src: &[i8]) -> [f32; 16] {
            use std::arch::x86_64::*;
            let src = &src[..16];
            // SAFETY: 16 bytes are read from a slice that has them; this marker is only used
            // in functions compiled with AVX-512F.
            unsafe {
                let b = _mm_loadu_si128(src.as_ptr() as *const __m128i);
                let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
                std::mem::transmute::<__m512, [f32; 16]>(v)
            }
        }

        /// Invisible and NaN lanes become minus infinity, then a tree of maxima.
        #[inline(always)]
        fn visible_max16(scores: &[f32; 16], lo: usize, hi: usize) -> f32 {
            use std::arch::x86_64::*;
            // SAFETY: register arithmetic on 16 values the array holds; this marker is only
            // used in functions compiled with AVX-512F.
            unsafe {
                let v = _mm512_loadu_ps(scores.as_ptr());
                let keep = lanes(lo, hi) as u16 & _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
                let v = _mm512_mask_blend_ps(keep, _mm512_set1_ps(f32::NEG_INFINITY), v);
                _mm512_reduce_max_ps(v)
            }
        }
    }

    /// Widening of `src[..16]` to f32 (exact), in the way build `W` does it best.
    pub trait Widen16: Sized {
        fn widen16<W: Isa>(src: &[Self]) -> [f32; 16];
    }

    impl Widen16 for f32 {
        #[inline(always)]
        fn widen16<W: Isa>(src: &[f32]) -> [f32; 16] {
            std::array::from_fn(|i| src[i])
        }
    }

    impl Widen16 for f16 {
        #[inline(always)]
        fn widen16<W: Isa>(src: &[f16]) -> [f32; 16] {
            W::f16x16(src)
        }
    }

    impl Widen16 for i8 {
        #[inline(always)]
        fn widen16<W: Isa>(src: &[i8]) -> [f32; 16] {
            W::i8x16(src)
        }
    }

    impl Widen16 for bf16 {
        /// A shift, which every build vectorizes.
        #[inline(always)]
        fn widen16<W: Isa>(src: &[bf16]) -> [f32; 16] {
            let src = &src[..16];
            std::array::from_fn(|i| f32::from_bits(u32::from(src[i].to_bits()) << 16))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sealed::{Isa, Portable, Widen16};
    use super::*;

    /// Every f16 bit pattern widens to the library's value in each build this CPU can run.
    #[test]
    fn f16_widening_is_exact_in_every_build() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let check = |name: &str, widen: &dyn Fn(&[f16]) -> [f32; 16]| {
            for chunk in all.chunks_exact(16) {
                let got = widen(chunk);
                for (g, h) in got.iter().zip(chunk) {
                    let want = h.to_f32();
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "{name}: {:#06x} -> {g} (want {want})",
                        h.to_bits()
                    );
                }
            }
        };
        check("portable", &|c| Portable::f16x16(c));
        #[cfg(target_arch = "x86_64")]
        {
            /// # Safety
            /// The CPU supports AVX2, FMA and F16C (the test checked `simd::level`).
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2(c: &[f16]) -> [f32; 16] {
                super::sealed::Avx2::f16x16(c)
            }
            /// # Safety
            /// The CPU supports AVX-512F, AVX-512BW, AVX2, FMA and F16C (the test checked
            /// `simd::level`).
            #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
            unsafe fn avx512(c: &[f16]) -> [f32; 16] {
                super::sealed::Avx512::f16x16(c)
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
                // SAFETY: the CPU has the features.
                check("avx2", &|c| unsafe { avx2(c) });
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c") {
                // SAFETY: as above.
                check("avx512", &|c| unsafe { avx512(c) });
            }
        }
    }

    /// Every build's maximum of the visible scores equals the fold of `f32::max` over them, for
    /// every visible range, with NaN, infinities and both zeros among the scores.
    #[test]
    fn visible_maxima_agree_in_every_build() {
        let fold = |s: &[f32; 16], lo: usize, hi: usize| {
            s[lo..hi].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
        };
        let mut x = 12345u32;
        let mut cases: Vec<[f32; 16]> = Vec::new();
        for c in 0..200 {
            cases.push(std::array::from_fn(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match (x >> 8) % 16 {
                    0 if c % 3 == 0 => f32::NAN,
                    1 if c % 5 == 0 => f32::INFINITY,
                    2 if c % 4 == 0 => f32::NEG_INFINITY,
                    3 => -0.0,
                    4 => 0.0,
                    _ => (x % 2001) as f32 * 0.01 - 10.0,
                }
            }));
        }
        cases.push([f32::NAN; 16]);
        type Max = dyn Fn(&[f32; 16], usize, usize) -> f32;
        let check = |name: &str, max: &Max| {
            for s in &cases {
                for lo in 0..16 {
                    for hi in lo + 1..=16 {
                        let (got, want) = (max(s, lo, hi), fold(s, lo, hi));
                        // Equal values (a zero's sign may differ: max(-0, +0) is either).
                        assert!(got == want, "{name} {lo}..{hi}: {got} vs {want} in {s:?}");
                    }
                }
            }
        };
        check("portable", &|s, lo, hi| Portable::visible_max16(s, lo, hi));
        #[cfg(target_arch = "x86_64")]
        {
            /// # Safety
            /// The CPU supports AVX2, FMA and F16C (the test checked `simd::level`).
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2(s: &[f32; 16], lo: usize, hi: usize) -> f32 {
                super::sealed::Avx2::visible_max16(s, lo, hi)
            }
            /// # Safety
            /// The CPU supports AVX-512F, AVX-512BW, AVX2, FMA and F16C (the test checked
            /// `simd::level`).
            #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
            unsafe fn avx512(s: &[f32; 16], lo: usize, hi: usize) -> f32 {
                super::sealed::Avx512::visible_max16(s, lo, hi)
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
                // SAFETY: the CPU has the features.
                check("avx2", &|s, lo, hi| unsafe { avx2(s, lo, hi) });
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c") {
                // SAFETY: as above.
                check("avx512", &|s, lo, hi| unsafe { avx512(s, lo, hi) });
            }
        }
    }

    #[test]
    fn bf16_widening_is_exact() {
        let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        for chunk in all.chunks_exact(16) {
            for (g, h) in bf16::widen16::<Portable>(chunk).iter().zip(chunk) {
                let want = h.to_f32();
                // The library quiets signalling NaNs; the shift keeps them as they are.
                assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()));
            }
        }
    }

    /// The fast narrowings give the library's conversions (NaNs: NaN) on every f32 class:
    /// ties, overflow, subnormal results, infinities, NaNs, and a spread of random values.
    #[test]
    fn fast_narrowing_equals_the_library() {
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            1.0 + 2f32.powi(-8),
            65504.0,
            65520.0,
            1e9,
            -1e9,
            6e-8,
            3e-5,
            1e-40,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001),
        ];
        let mut r = 0x2545_f491u32;
        xs.extend((0..100_000).map(|_| {
            r ^= r << 13;
            r ^= r >> 17;
            r ^= r << 5;
            f32::from_bits(r)
        }));
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let mut h = vec![f16::ZERO; xs.len()];
        f16::narrow_row(&xs, &mut h);
        for (x, got) in xs.iter().zip(&h) {
            let want = f16::from_f32(*x);
            assert!(
                same(got.to_f32(), want.to_f32()),
                "f16 {x:e}: {got} vs {want}"
            );
        }
        let mut b = vec![bf16::ZERO; xs.len()];
        bf16::narrow_row(&xs, &mut b);
        for (x, got) in xs.iter().zip(&b) {
            // The inherent `from_f32`: the library's.
            let want = bf16::from_f32(*x);
            assert!(
                same(got.to_f32(), want.to_f32()),
                "bf16 {x:e}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn narrowing_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between two f16 values: ties go to the even one (1.0).
        assert_eq!(f16::from_f32(1.0 + 2f32.powi(-11)).to_f32(), 1.0);
        assert_eq!(
            f16::from_f32(1.0 + 3.0 * 2f32.powi(-11)).to_f32(),
            1.0 + 2f32.powi(-9)
        );
        assert_eq!(bf16::from_f32(1.0 + 2f32.powi(-8)).to_f32(), 1.0);
        let z: Vec<f16> = zeroed_vec(5);
        assert!(z.iter().all(|x| x.to_f32() == 0.0));
    }
}
