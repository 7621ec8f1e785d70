//! Integer dot products of repacked weight rows ([`PackedWeight`]) with 8-bit activation rows
//! ([`Q8Acts`]), for every block-quantized format.
//!
//! One arithmetic, every instruction set. Per group of 64 elements and per 32-bit lane `i`
//! (four codes), the exact integer `dot_i = Σ u·q - bias · Σ q` (the bias term comes from the
//! activations' lane sums) is converted to f32 and accumulated into lane `i` of sixteen f32
//! accumulators with one fused multiply-add by `w_scale_i * a_scale_i`. The row's result is the
//! sixteen lanes summed as a fixed tree ([`reduce16`]), plus, for formats with minimums, the
//! same tree over `Σ min_b * (d_a Σq)_b` accumulated per lane `b % 16`. The scalar reference
//! spells this out; the AVX-512 VNNI path does it with one 512-bit register per group, and the
//! AVX2 path with two 256-bit halves, so all three agree to the bit, and a row's result never
//! depends on which other rows or weight rows share a call.
//!
//! Kernels compute tiles of `NW` weight rows by `NA` activation rows: the weight codes of a
//! group are decoded once for all `NA` rows (prefill, batched decode), and several weight rows
//! give independent accumulator chains (single-sequence decode).

pub use super::qacts::{ActRow, Q8Acts, GROUP, LANES};
use super::qpack::{group_parts, lane_scale, Codes, PackFormat, PackedWeight};
use crate::DType;

/// Elements per quantization block of the activations.
pub const QK: usize = 32;

/// Whether weights of `dtype` have an integer dot product here.
pub fn supports(dtype: DType) -> bool {
    PackFormat::of(dtype).is_some()
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
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                return Isa::Avx512Vnni;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every set this CPU can run (for tests and benches).
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

/// The fixed reduction of sixteen lane accumulators: halves added lane by lane down to one.
#[inline(always)]
pub fn reduce16(a: &[f32; LANES]) -> f32 {
    let r8: [f32; 8] = std::array::from_fn(|i| a[i] + a[i + 8]);
    let r4: [f32; 4] = std::array::from_fn(|i| r8[i] + r8[i + 4]);
    let r2 = [r4[0] + r4[2], r4[1] + r4[3]];
    r2[0] + r2[1]
}

/// Activation rows one kernel call takes at most (prefill and batched decode pass them in
/// fours; the weight codes of a group are decoded once for all of them).
pub const MAX_ACT_ROWS: usize = 4;

/// `out[j * acts.len() + i] = w[rows.start + j] · acts[i]` for every weight row in `rows` and
/// one, two, three or four activation rows; `isa` must be one of [`Isa::available`]. Weight
/// rows go through the kernel in small tiles (two rows per four activation rows, four rows per
/// single activation row) so several accumulator chains run side by side.
pub fn dot_rows(
    isa: Isa,
    w: &PackedWeight,
    rows: std::ops::Range<usize>,
    acts: &[ActRow<'_>],
    out: &mut [f32],
) {
    let na = acts.len();
    assert!(
        (1..=MAX_ACT_ROWS).contains(&na) && rows.end <= w.rows() && out.len() == rows.len() * na,
        "dot_rows: no product of rows {rows:?} of {} with {na} activation rows",
        w.rows()
    );
    let g = w.groups();
    for a in acts {
        assert!(
            a.qs.len() == g * GROUP
                && a.neg_lane_sums.len() == g * LANES
                && a.scales.len() == 2 * g
                && a.block_sums.len() == super::qpack::min_stride(g),
            "dot_rows: activations of {} elements against {g} weight groups",
            a.qs.len()
        );
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` comes from `Isa::detect`/`available`, so the CPU has the features;
        // every row's lengths were checked above against the weight's group count.
        Isa::Avx512Vnni => unsafe { x86::rows_vnni(w, rows, acts, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::rows_avx2(w, rows, acts, out) },
        _ => {
            for (j, r) in rows.enumerate() {
                for (i, a) in acts.iter().enumerate() {
                    out[j * na + i] = dot_scalar(w, r, a);
                }
            }
        }
    }
}

/// The reference: the module's arithmetic in plain loops, for weight row `r`.
pub fn dot_scalar(w: &PackedWeight, r: usize, a: &ActRow<'_>) -> f32 {
    let (f, groups, row) = (w.format(), w.groups(), w.row(r));
    let mut acc = [0f32; LANES];
    for g in 0..groups {
        let (codes, sc) = group_parts(f, row, g, groups);
        for (lane, acc) in acc.iter_mut().enumerate() {
            let mut dot = if f.bias_shift > 0 {
                a.neg_lane_sums[g * LANES + lane] << f.bias_shift
            } else {
                0
            };
            let span = 4 * lane..4 * lane + 4;
            for (&c, &q) in codes[span.clone()].iter().zip(&a.qs[g * GROUP..][span]) {
                dot += c as i32 * q as i32;
            }
            let scale = lane_scale(f, &sc, lane) * a.scales[2 * g + lane % 2];
            *acc = (dot as f32).mul_add(scale, *acc);
        }
    }
    if f.has_min {
        let mut macc = [0f32; LANES];
        for (b, (&m, &s)) in w.row_mins(r).iter().zip(a.block_sums).enumerate() {
            macc[b % LANES] = m.mul_add(s, macc[b % LANES]);
        }
        for (a, m) in acc.iter_mut().zip(macc) {
            *a += m;
        }
    }
    reduce16(&acc)
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // register arrays read best indexed
mod x86 {
    use super::{ActRow, Codes, PackedWeight, GROUP, LANES};
    use std::arch::x86_64::*;
    use std::ops::Range;

    // Formats as const parameters (codes kind, four scales, bias shift, minimums), so each
    // loop is compiled for one format.
    const NIB4: u8 = 0;
    const NIB5: u8 = 1;
    const BYTE: u8 = 2;

    /// Runs `$f::<codes, scales4, bias_shift, has_min, NW, NA>` over all rows, in tiles of
    /// `NW` weight rows (two for four activation rows, four for one) and single rows at the end.
    macro_rules! dispatch {
        ($f:ident, $w:expr, $rows:expr, $acts:expr, $out:expr) => {{
            let fm = $w.format();
            let c = match fm.codes {
                Codes::Nib4 => NIB4,
                Codes::Nib5 => NIB5,
                Codes::Byte => BYTE,
            };
            macro_rules! tiles {
                ($C:expr, $S4:expr, $SH:expr, $M:expr, $NW:expr, $NA:expr) => {{
                    let (rows, out) = ($rows, $out);
                    let mut r = rows.start;
                    while r + $NW <= rows.end {
                        let o = &mut out[(r - rows.start) * $NA..(r - rows.start + $NW) * $NA];
                        $f::<$C, $S4, $SH, $M, $NW, $NA>($w, r, $acts, o);
                        r += $NW;
                    }
                    while r < rows.end {
                        let o = &mut out[(r - rows.start) * $NA..(r - rows.start + 1) * $NA];
                        $f::<$C, $S4, $SH, $M, 1, $NA>($w, r, $acts, o);
                        r += 1;
                    }
                }};
            }
            macro_rules! shape {
                ($C:expr, $S4:expr, $SH:expr, $M:expr) => {
                    match $acts.len() {
                        4 => tiles!($C, $S4, $SH, $M, 2, 4),
                        3 => tiles!($C, $S4, $SH, $M, 2, 3),
                        2 => tiles!($C, $S4, $SH, $M, 2, 2),
                        _ => tiles!($C, $S4, $SH, $M, 4, 1),
                    }
                };
            }
            match (c, fm.scales4, fm.bias_shift, fm.has_min) {
                (NIB4, false, 3, false) => shape!(NIB4, false, 3, false),
                (NIB4, false, 0, true) => shape!(NIB4, false, 0, true),
                (NIB5, false, 4, false) => shape!(NIB5, false, 4, false),
                (NIB5, false, 0, true) => shape!(NIB5, false, 0, true),
                (BYTE, false, 7, false) => shape!(BYTE, false, 7, false),
                (BYTE, true, 5, false) => shape!(BYTE, true, 5, false),
                other => unreachable!("no kernel for packed format {other:?}"),
            }
        }};
    }

    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI, AVX2, FMA and F16C; the call was checked by `dot_rows`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows_vnni(
        w: &PackedWeight,
        rows: Range<usize>,
        acts: &[ActRow<'_>],
        out: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { dispatch!(vnni, w, rows, acts, out) }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C; the call was checked by `dot_rows`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2(
        w: &PackedWeight,
        rows: Range<usize>,
        acts: &[ActRow<'_>],
        out: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { dispatch!(avx2, w, rows, acts, out) }
    }

    /// `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))` of eight lanes already summed from sixteen.
    #[inline(always)]
    unsafe fn reduce8(v: __m256) -> f32 {
        // SAFETY: register-only intrinsics of the enabled features.
        unsafe {
            let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let y = _mm_add_ps(x, _mm_movehl_ps(x, x));
            let z = _mm_add_ss(y, _mm_shuffle_ps::<0b01>(y, y));
            _mm_cvtss_f32(z)
        }
    }

    /// Two f32 at `p` repeated over the register: lane `i` gets `p[i % 2]`.
    #[inline(always)]
    unsafe fn bcast2_512(p: *const u8) -> __m512 {
        // SAFETY: `p` points at 8 readable bytes.
        unsafe { _mm512_castpd_ps(_mm512_set1_pd((p as *const f64).read_unaligned())) }
    }

    #[inline(always)]
    unsafe fn bcast2_256(p: *const u8) -> __m256 {
        // SAFETY: `p` points at 8 readable bytes.
        unsafe { _mm256_castpd_ps(_mm256_set1_pd((p as *const f64).read_unaligned())) }
    }

    /// One group's codes `c` with lane scales `ws` against every activation row.
    #[inline(always)]
    unsafe fn step512<const SH: u32, const NA: usize>(
        acc: &mut [__m512; NA],
        ap: &[&ActRow<'_>; NA],
        c: __m512i,
        ws: __m512,
        g: usize,
    ) {
        // SAFETY: the caller guarantees group `g` exists in every activation row.
        unsafe {
            for i in 0..NA {
                let a = ap[i];
                let aq = _mm512_loadu_si512(a.qs.as_ptr().add(g * GROUP) as *const __m512i);
                let init = if SH > 0 {
                    let s = _mm512_loadu_si512(
                        a.neg_lane_sums.as_ptr().add(g * LANES) as *const __m512i
                    );
                    _mm512_sll_epi32(s, _mm_cvtsi32_si128(SH as i32))
                } else {
                    _mm512_setzero_si512()
                };
                let dot = _mm512_dpbusd_epi32(init, c, aq);
                let scale =
                    _mm512_mul_ps(ws, bcast2_512(a.scales.as_ptr().add(2 * g) as *const u8));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[i]);
            }
        }
    }

    /// Adds bit 4 of 5-bit codes from the group's mask at `p`.
    #[inline(always)]
    unsafe fn high512<const C: u8>(c: __m512i, p: *const u8) -> __m512i {
        // SAFETY: for 5-bit codes `p` points at the group's 8 mask bytes.
        unsafe {
            if C == NIB5 {
                let k = _cvtu64_mask64((p as *const u64).read_unaligned());
                _mm512_mask_add_epi8(c, k, c, _mm512_set1_epi8(16))
            } else {
                c
            }
        }
    }

    /// AVX-512 VNNI: one register per group.
    #[inline(always)]
    unsafe fn vnni<
        const C: u8,
        const S4: bool,
        const SH: u32,
        const M: bool,
        const NW: usize,
        const NA: usize,
    >(
        w: &PackedWeight,
        r0: usize,
        acts: &[ActRow<'_>],
        out: &mut [f32],
    ) {
        let fm = w.format();
        let (unit, mb, sb, groups) = (
            fm.unit_bytes(),
            fm.mask_bytes(),
            fm.scale_bytes(),
            w.groups(),
        );
        // SAFETY: `dot_rows` checked that every weight row holds `row_bytes(groups)` bytes and
        // every activation row `groups` groups, so all pointer offsets below stay in bounds.
        unsafe {
            let wp: [*const u8; NW] = std::array::from_fn(|j| w.row(r0 + j).as_ptr());
            let ap: [&ActRow<'_>; NA] = std::array::from_fn(|i| &acts[i]);
            let mut acc = [[_mm512_setzero_ps(); NA]; NW];
            let low4 = _mm512_set1_epi8(0x0F);
            let mut g = 0;
            if C != BYTE {
                while g + 1 < groups {
                    for j in 0..NW {
                        let base = wp[j].add(g / 2 * unit);
                        let v = _mm512_loadu_si512(base as *const __m512i);
                        let c0 = high512::<C>(_mm512_and_si512(v, low4), base.add(64));
                        let c1 = high512::<C>(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4),
                            base.add(64 + mb),
                        );
                        let s = base.add(64 + 2 * mb);
                        step512::<SH, NA>(&mut acc[j], &ap, c0, bcast2_512(s), g);
                        step512::<SH, NA>(&mut acc[j], &ap, c1, bcast2_512(s.add(sb)), g + 1);
                    }
                    g += 2;
                }
                if g < groups {
                    // The last, unpaired group: 32 bytes of nibbles.
                    let shift = _mm512_set_epi64(
                        0x0004_0004_0004_0004,
                        0x0004_0004_0004_0004,
                        0x0004_0004_0004_0004,
                        0x0004_0004_0004_0004,
                        0,
                        0,
                        0,
                        0,
                    );
                    for j in 0..NW {
                        let base = wp[j].add(g / 2 * unit);
                        let v = _mm512_broadcast_i64x4(_mm256_loadu_si256(base as *const __m256i));
                        let c = high512::<C>(
                            _mm512_and_si512(_mm512_srlv_epi16(v, shift), low4),
                            base.add(32),
                        );
                        step512::<SH, NA>(&mut acc[j], &ap, c, bcast2_512(base.add(32 + mb)), g);
                    }
                }
            } else {
                while g < groups {
                    for j in 0..NW {
                        let base = wp[j].add(g * unit);
                        let c = _mm512_loadu_si512(base as *const __m512i);
                        let ws = if S4 {
                            _mm512_broadcast_f32x4(_mm_loadu_ps(base.add(64) as *const f32))
                        } else {
                            bcast2_512(base.add(64))
                        };
                        step512::<SH, NA>(&mut acc[j], &ap, c, ws, g);
                    }
                    g += 1;
                }
            }
            for j in 0..NW {
                let mins = w.row_mins(r0 + j);
                for i in 0..NA {
                    let mut v = acc[j][i];
                    if M {
                        let bs = ap[i].block_sums;
                        let mut macc = _mm512_setzero_ps();
                        for c in (0..mins.len()).step_by(LANES) {
                            macc = _mm512_fmadd_ps(
                                _mm512_loadu_ps(mins.as_ptr().add(c)),
                                _mm512_loadu_ps(bs.as_ptr().add(c)),
                                macc,
                            );
                        }
                        v = _mm512_add_ps(v, macc);
                    }
                    let lo = _mm512_castps512_ps256(v);
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
                    out[j * NA + i] = reduce8(_mm256_add_ps(lo, hi));
                }
            }
        }
    }

    /// Bit `i` of `qh` -> byte `i` set to 0x10.
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

    /// One group's codes `c` (two halves) with lane scales `ws` against every activation row.
    #[inline(always)]
    unsafe fn step256<const C: u8, const SH: u32, const NA: usize>(
        acc: &mut [[__m256; 2]; NA],
        ap: &[&ActRow<'_>; NA],
        c: [__m256i; 2],
        ws: __m256,
        g: usize,
    ) {
        // SAFETY: the caller guarantees group `g` exists in every activation row.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            for i in 0..NA {
                let a = ap[i];
                let scale =
                    _mm256_mul_ps(ws, bcast2_256(a.scales.as_ptr().add(2 * g) as *const u8));
                for h in 0..2 {
                    let aq =
                        _mm256_loadu_si256(a.qs.as_ptr().add(g * GROUP + 32 * h) as *const __m256i);
                    let dot = if C == BYTE && SH == 7 {
                        // Q8_0: back to signed codes, sign moved onto the activations
                        // (maddubs would saturate on unsigned codes above 127).
                        let s = _mm256_xor_si256(c[h], _mm256_set1_epi8(-128));
                        _mm256_madd_epi16(
                            _mm256_maddubs_epi16(_mm256_sign_epi8(s, s), _mm256_sign_epi8(aq, s)),
                            ones,
                        )
                    } else {
                        let d = _mm256_madd_epi16(_mm256_maddubs_epi16(c[h], aq), ones);
                        if SH > 0 {
                            let s =
                                _mm256_loadu_si256(a.neg_lane_sums.as_ptr().add(g * LANES + 8 * h)
                                    as *const __m256i);
                            _mm256_add_epi32(d, _mm256_sll_epi32(s, _mm_cvtsi32_si128(SH as i32)))
                        } else {
                            d
                        }
                    };
                    acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[i][h]);
                }
            }
        }
    }

    /// Adds bit 4 of 5-bit codes from the group's mask at `p`.
    #[inline(always)]
    unsafe fn high256<const C: u8>(c: [__m256i; 2], p: *const u8) -> [__m256i; 2] {
        // SAFETY: for 5-bit codes `p` points at the group's 8 mask bytes.
        unsafe {
            if C == NIB5 {
                let bits = (p as *const u64).read_unaligned();
                [
                    _mm256_or_si256(c[0], fifth_bits(bits as u32)),
                    _mm256_or_si256(c[1], fifth_bits((bits >> 32) as u32)),
                ]
            } else {
                c
            }
        }
    }

    /// AVX2: each group as two 256-bit halves (lanes 0..8 and 8..16).
    #[inline(always)]
    unsafe fn avx2<
        const C: u8,
        const S4: bool,
        const SH: u32,
        const M: bool,
        const NW: usize,
        const NA: usize,
    >(
        w: &PackedWeight,
        r0: usize,
        acts: &[ActRow<'_>],
        out: &mut [f32],
    ) {
        let fm = w.format();
        let (unit, mb, sb, groups) = (
            fm.unit_bytes(),
            fm.mask_bytes(),
            fm.scale_bytes(),
            w.groups(),
        );
        // SAFETY: as in `vnni`: every offset below was bounds-checked by `dot_rows`.
        unsafe {
            let wp: [*const u8; NW] = std::array::from_fn(|j| w.row(r0 + j).as_ptr());
            let ap: [&ActRow<'_>; NA] = std::array::from_fn(|i| &acts[i]);
            let mut acc = [[[_mm256_setzero_ps(); 2]; NA]; NW];
            let low4 = _mm256_set1_epi8(0x0F);
            let mut g = 0;
            if C != BYTE {
                while g + 1 < groups {
                    for j in 0..NW {
                        let base = wp[j].add(g / 2 * unit);
                        let v0 = _mm256_loadu_si256(base as *const __m256i);
                        let v1 = _mm256_loadu_si256(base.add(32) as *const __m256i);
                        let c0 = high256::<C>(
                            [_mm256_and_si256(v0, low4), _mm256_and_si256(v1, low4)],
                            base.add(64),
                        );
                        let c1 = high256::<C>(
                            [
                                _mm256_and_si256(_mm256_srli_epi16::<4>(v0), low4),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(v1), low4),
                            ],
                            base.add(64 + mb),
                        );
                        let s = base.add(64 + 2 * mb);
                        step256::<C, SH, NA>(&mut acc[j], &ap, c0, bcast2_256(s), g);
                        step256::<C, SH, NA>(&mut acc[j], &ap, c1, bcast2_256(s.add(sb)), g + 1);
                    }
                    g += 2;
                }
                if g < groups {
                    for j in 0..NW {
                        let base = wp[j].add(g / 2 * unit);
                        let v = _mm256_loadu_si256(base as *const __m256i);
                        let c = high256::<C>(
                            [
                                _mm256_and_si256(v, low4),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4),
                            ],
                            base.add(32),
                        );
                        step256::<C, SH, NA>(&mut acc[j], &ap, c, bcast2_256(base.add(32 + mb)), g);
                    }
                }
            } else {
                while g < groups {
                    for j in 0..NW {
                        let base = wp[j].add(g * unit);
                        let c = [
                            _mm256_loadu_si256(base as *const __m256i),
                            _mm256_loadu_si256(base.add(32) as *const __m256i),
                        ];
                        let ws = if S4 {
                            let x = _mm_loadu_ps(base.add(64) as *const f32);
                            _mm256_set_m128(x, x)
                        } else {
                            bcast2_256(base.add(64))
                        };
                        step256::<C, SH, NA>(&mut acc[j], &ap, c, ws, g);
                    }
                    g += 1;
                }
            }
            for j in 0..NW {
                let mins = w.row_mins(r0 + j);
                for i in 0..NA {
                    let [mut lo, mut hi] = acc[j][i];
                    if M {
                        let bs = ap[i].block_sums;
                        let mut macc = [_mm256_setzero_ps(); 2];
                        for c in (0..mins.len()).step_by(LANES) {
                            for h in 0..2 {
                                macc[h] = _mm256_fmadd_ps(
                                    _mm256_loadu_ps(mins.as_ptr().add(c + 8 * h)),
                                    _mm256_loadu_ps(bs.as_ptr().add(c + 8 * h)),
                                    macc[h],
                                );
                            }
                        }
                        lo = _mm256_add_ps(lo, macc[0]);
                        hi = _mm256_add_ps(hi, macc[1]);
                    }
                    out[j * NA + i] = reduce8(_mm256_add_ps(lo, hi));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::qpack::unpack_row;
    use crate::{Storage, Tensor, ThreadPool};
    use half::f16;

    /// Random-looking bytes for `rows` rows of `nb` blocks of `dtype`, with sane f16 scales.
    fn random_tensor(dtype: DType, rows: usize, cols: usize, seed: u32) -> Tensor {
        let bb = dtype.block_bytes();
        let nb = rows * cols / dtype.block_size();
        let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
        let mut v: Vec<u8> = (0..nb * bb)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 7) as u8
            })
            .collect();
        // f16 scale fields at the format's offsets.
        let offsets: &[usize] = match dtype {
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q6_K => &[208],
            _ => &[0],
        };
        for (b, blk) in v.chunks_exact_mut(bb).enumerate() {
            for (s, &o) in offsets.iter().enumerate() {
                let val = f16::from_f32(
                    0.01 + 0.003 * ((b + s) % 7) as f32 * if s == 1 { -1.0 } else { 1.0 },
                );
                blk[o..o + 2].copy_from_slice(&val.to_bits().to_le_bytes());
            }
        }
        Tensor::new(dtype, vec![rows, cols], Storage::owned(v)).expect("tensor")
    }

    const TYPES: [DType; 8] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    #[test]
    fn every_isa_and_tile_matches_the_scalar_reference_exactly() {
        let pool = ThreadPool::new(2).expect("pool");
        // 288 columns: four whole groups and a half group of padding (K-quants: 256 columns).
        for dtype in TYPES {
            let k = if dtype.block_size() == 256 { 512 } else { 288 };
            let t = random_tensor(dtype, 7, k, dtype as u32 + 3);
            let w = PackedWeight::pack(&t, &pool).expect("pack");
            let x: Vec<f32> = (0..4 * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.07)
                .collect();
            let mut acts = Q8Acts::default();
            acts.quantize(&x, k);
            let rows: Vec<ActRow<'_>> = (0..4).map(|i| acts.row(i)).collect();
            for isa in Isa::available() {
                for (nw, na) in [(4, 4), (3, 3), (1, 2), (4, 1), (1, 1), (3, 1), (7, 4)] {
                    let nw = nw.min(t.rows());
                    let mut out = vec![0f32; nw * na];
                    dot_rows(isa, &w, 0..nw, &rows[..na], &mut out);
                    for j in 0..nw {
                        for i in 0..na {
                            let want = dot_scalar(&w, j, &rows[i]);
                            assert_eq!(
                                out[j * na + i].to_bits(),
                                want.to_bits(),
                                "{dtype} {isa:?} {nw}x{na} ({j}, {i})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn close_to_the_float_product() {
        let pool = ThreadPool::new(1).expect("pool");
        for dtype in TYPES {
            let k = 512;
            let t = random_tensor(dtype, 1, k, 7);
            let w = PackedWeight::pack(&t, &pool).expect("pack");
            let x: Vec<f32> = (0..k).map(|i| ((i as f32) * 0.013).sin()).collect();
            let mut acts = Q8Acts::default();
            acts.quantize(&x, k);
            let mut wf = vec![0f32; k];
            unpack_row(&w, 0, &mut wf);
            let mut wd = vec![0f32; k];
            t.dequantize_row(0, &mut wd);
            assert_eq!(wf, wd, "{dtype}: repacked values");
            let exact: f64 = wf.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let norm: f64 = wf
                .iter()
                .zip(&x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let got = dot_scalar(&w, 0, &acts.row(0)) as f64;
            // 8-bit activations: error well under 1% of the sum of magnitudes.
            assert!(
                (got - exact).abs() < 0.01 * norm,
                "{dtype}: {got} vs {exact}"
            );
        }
    }
}
