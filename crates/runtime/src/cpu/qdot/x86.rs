//! The AVX-512 VNNI and AVX2 kernels of [`super::dot_tiles`]: sixteen weight rows per call,
//! one per 32-bit lane, the same integer arithmetic and rounding as [`super::dot_scalar`].
#![allow(clippy::needless_range_loop)] // register arrays read best indexed
use super::{
    k6_slot, pass_rows, ActRow, Ahead, Codes, DisjointMut, Dst, PackedWeight, Q8Acts, Scales,
    MAX_ACT_ROWS, QK, TILE,
};
use std::arch::x86_64::*;
use std::ops::Range;

// Formats as const parameters (codes kind, scales kind, bias shift, minimums), so each
// loop is compiled for one format.
const NIB4: u8 = 0;
const NIB5: u8 = 1;
const NIB6: u8 = 2;
const BYTE: u8 = 3;
const BLOCK: u8 = 0;
const K6: u8 = 1;
const K8: u8 = 2;

/// Blocks per group of scales kind `K`.
const fn group_blocks(k: u8) -> usize {
    if k == BLOCK {
        1
    } else {
        8
    }
}

/// Runs `$f::<codes, scales, bias_shift, has_min, NA>` on every tile, for the call's format
/// and row count; tile `j` of the call fetches from unit `j * blocks` of `ahead` (where
/// `$fetch` and there is something to fetch).
macro_rules! dispatch {
    ($f:ident, $fetch:literal, $w:expr, $tiles:expr, $acts:expr, $ahead:expr, $out:expr) => {{
        let fm = $w.format();
        let nb = $w.blocks();
        let c = match fm.codes {
            Codes::Nib4 => NIB4,
            Codes::Nib5 => NIB5,
            Codes::Nib6 => NIB6,
            Codes::Byte => BYTE,
        };
        let k = match fm.scales {
            Scales::Block => BLOCK,
            Scales::K6 => K6,
            Scales::K8 => K8,
        };
        macro_rules! tiles {
            ($C:expr, $K:expr, $SH:expr, $M:expr, $NA:expr) => {
                for (j, tile) in $tiles.clone().enumerate() {
                    let o = ($out, j);
                    let at = ($ahead, j * nb);
                    // A separate build without the fetches: even skipped, they cost the
                    // many-pass products 4%.
                    if $fetch && $ahead.step > 0 {
                        $f::<$C, $K, $SH, $M, $NA, $fetch>($w, tile, $acts, at, o);
                    } else {
                        $f::<$C, $K, $SH, $M, $NA, false>($w, tile, $acts, at, o);
                    }
                }
            };
        }
        macro_rules! shape {
            ($C:expr, $K:expr, $SH:expr, $M:expr) => {
                match $acts.len() {
                    4 => tiles!($C, $K, $SH, $M, 4),
                    3 => tiles!($C, $K, $SH, $M, 3),
                    2 => tiles!($C, $K, $SH, $M, 2),
                    _ => tiles!($C, $K, $SH, $M, 1),
                }
            };
        }
        match (c, k, fm.bias_shift, fm.has_min) {
            (NIB4, BLOCK, 3, false) => shape!(NIB4, BLOCK, 3, false),
            (NIB4, BLOCK, 0, true) => shape!(NIB4, BLOCK, 0, true),
            (NIB4, K6, 0, true) => shape!(NIB4, K6, 0, true),
            (NIB5, BLOCK, 4, false) => shape!(NIB5, BLOCK, 4, false),
            (NIB5, BLOCK, 0, true) => shape!(NIB5, BLOCK, 0, true),
            (NIB5, K6, 0, true) => shape!(NIB5, K6, 0, true),
            (BYTE, BLOCK, 7, false) => shape!(BYTE, BLOCK, 7, false),
            (NIB6, K8, 5, false) => shape!(NIB6, K8, 5, false),
            other => unreachable!("no kernel for packed format {other:?}"),
        }
    }};
}

/// One instruction set's two entries, compiled with its `$features` around kernel `$k`
/// (`$fetch`: whether it runs the prefetches of [`Ahead`]): `$tiles`, one kernel call (for
/// `dot_tiles`), and `$rows`, [`super::dot_rows`] with its row passes expanded in this build.
macro_rules! build {
    ($tiles:ident, $rows:ident, $features:literal, $k:ident, $fetch:literal) => {
        /// # Safety
        /// The CPU has the build's features; the call was checked by `dot_tiles` or
        /// `dot_rows`, and `out` addresses the caller's own memory for every tile and row.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $tiles(
            w: &PackedWeight,
            tiles: Range<usize>,
            acts: &[ActRow<'_>],
            ahead: Ahead,
            out: Dst,
        ) {
            // SAFETY: forwarded from the caller's contract.
            unsafe { dispatch!($k, $fetch, w, tiles, acts, ahead, out) }
        }

        /// [`super::dot_rows`] in this build.
        ///
        /// # Safety
        /// As for `dot_rows`, which checked the call; the CPU has the build's features.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $rows(
            w: &PackedWeight,
            tiles: Range<usize>,
            acts: &Q8Acts,
            rows: Range<usize>,
            group: usize,
            out: &DisjointMut<f32>,
        ) {
            // SAFETY: forwarded from the caller's contract.
            unsafe {
                row_passes!(w, tiles, acts, rows, group, out, |t, a, ah, d| dispatch!(
                    $k, $fetch, w, t, a, ah, d
                ))
            }
        }
    };
}

build!(
    tiles_vnni,
    rows_vnni,
    "avx512f,avx512bw,avx512vnni,avx2,fma,f16c",
    vnni,
    true
);
build!(tiles_avx2, rows_avx2, "avx2,fma,f16c", avx2, false);

/// The integer bias correction `-bias * Σq` of elements `16 s0 .. 16 (s0 + n)` of block `b`.
///
/// # Safety
/// `a.sum16` holds the sums of blocks up to `b` (indices `2 * b + s0 .. 2 * b + s0 + n` are
/// in bounds).
#[inline(always)]
unsafe fn bias_init<const SH: u32>(a: &ActRow<'_>, b: usize, s0: usize, n: usize) -> i32 {
    if SH == 0 {
        return 0;
    }
    // SAFETY: `dot_tiles`/`dot_rows` checked that `sum16` holds two entries per block.
    let s: i32 = (0..n)
        .map(|s| unsafe { *a.sum16.get_unchecked(2 * b + s0 + s) })
        .sum();
    -(s << SH)
}

/// A group's f16 values at `p`, one per row, widened.
///
/// # Safety
/// The CPU supports AVX-512F and F16C; `p` is valid for reads of 32 bytes (sixteen f16
/// values).
#[inline(always)]
unsafe fn f16x16(p: *const u8) -> __m512 {
    // SAFETY: the caller's group holds sixteen f16 values at `p`.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

/// A K6 group's sub-block scales and minimums at `sp`, one byte per row: `out` gets four
/// 64-byte arrays `[sub / 2][r]`, scales of the even sub-blocks, of the odd ones, then
/// minimums of the even and of the odd ones. Three loads and byte operations for the whole
/// group (16-bit shifts: what crosses a byte lands outside the masks).
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512BW; `sp` points at a K6 group's scales, valid for
/// reads of `64 + 192` bytes.
#[inline(always)]
unsafe fn k6_bytes512(sp: *const u8, out: &mut [__m512i; 4]) {
    // SAFETY: the caller's group holds its 192 bytes of sub-block scales at `sp + 64`.
    unsafe {
        let even = _mm512_loadu_si512(sp.add(4 * TILE) as *const __m512i);
        let odd = _mm512_loadu_si512(sp.add(8 * TILE) as *const __m512i);
        let hi = _mm512_loadu_si512(sp.add(12 * TILE) as *const __m512i);
        let (low4, high2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let join = |lo: __m512i, h: __m512i| {
            _mm512_or_si512(_mm512_and_si512(lo, low4), _mm512_and_si512(h, high2))
        };
        out[0] = join(even, _mm512_slli_epi16::<4>(hi));
        out[1] = join(odd, hi);
        out[2] = join(_mm512_srli_epi16::<4>(even), _mm512_slli_epi16::<2>(hi));
        out[3] = join(_mm512_srli_epi16::<4>(odd), _mm512_srli_epi16::<2>(hi));
    }
}

/// Block `k` of a group's scales at `sp` (kind `K`, `d` and `dm` its widened `d` and
/// minimum or `dmin`; `k6` the group's bytes from [`k6_bytes512`] for `K6`): the scales of
/// its first and second halves and, for `K6`, the minimum `dmin * m` to subtract (else `dm`,
/// the minimum to add).
///
/// # Safety
/// The CPU supports AVX-512F, AVX-512BW and F16C; `sp` points at the scales of a group of
/// kind `K`, valid for reads of that kind's scale bytes for block `k`.
#[inline(always)]
unsafe fn scales512<const K: u8>(
    sp: *const u8,
    k6: *const u8,
    k: usize,
    d: __m512,
    dm: __m512,
) -> (__m512, __m512, __m512) {
    // SAFETY: the caller's group holds its scales at `sp` (the layout of `qpack`), and `k6`
    // 256 bytes.
    unsafe {
        let bytes = |p: *const u8| _mm_loadu_si128(p as *const __m128i);
        if K == K6 {
            let at = 64 * (k % 2) + 16 * (k / 2);
            let sc = _mm512_cvtepu8_epi32(bytes(k6.add(at)));
            let m = _mm512_cvtepu8_epi32(bytes(k6.add(128 + at)));
            let ws = _mm512_mul_ps(_mm512_cvtepi32_ps(sc), d);
            (ws, ws, _mm512_mul_ps(_mm512_cvtepi32_ps(m), dm))
        } else if K == K8 {
            let s = |h: usize| {
                let v = _mm512_cvtepi8_epi32(bytes(sp.add(2 * TILE + TILE * (2 * k + h))));
                _mm512_mul_ps(_mm512_cvtepi32_ps(v), d)
            };
            (s(0), s(1), dm)
        } else {
            (d, d, dm)
        }
    }
}

/// AVX-512 VNNI: lane `l` of every register is row `l` of the tile.
///
/// # Safety
/// The CPU supports AVX-512F, AVX-512BW, AVX-512VNNI, AVX2, FMA and F16C (the caller
/// checked [`Isa::detect`]); `tile` and every activation row hold whole groups of format
/// `C` for the `k` columns asked for, and `out` has room for the rows and tile columns
/// written.
#[inline(always)]
unsafe fn vnni<
    const C: u8,
    const K: u8,
    const SH: u32,
    const M: bool,
    const NA: usize,
    const F: bool,
>(
    w: &PackedWeight,
    tile: usize,
    acts: &[ActRow<'_>],
    (ahead, unit): (Ahead, usize),
    (out, j): (Dst, usize),
) {
    /// How far ahead of itself the kernel prefetches the weight stream, in bytes.
    const PREFETCH: usize = 4096;
    let fm = w.format();
    let nbg = group_blocks(K);
    let (gb, cb, ng) = (fm.group_bytes(), fm.code_bytes(), w.groups());
    // Bytes of the stream per block, for the prefetches.
    let ub = gb / nbg;
    let s16 = K == K8;
    // SAFETY: `dot_tiles`/`dot_rows` checked that the tile exists (so holds `ng` groups of
    // `gb` bytes) and that every activation row has `ng * nbg` blocks, so all offsets below
    // are in bounds.
    unsafe {
        let base = w.tile(tile).as_ptr();
        let data = w.data().as_ptr();
        let ap: [&ActRow<'_>; NA] = std::array::from_fn(|i| &acts[i]);
        let mut acc = [_mm512_setzero_ps(); NA];
        let mut macc = [_mm512_setzero_ps(); NA];
        let low4 = _mm512_set1_epi8(0x0F);
        let high2 = _mm512_set1_epi8(0x30);
        let sixteen = _mm512_set1_epi8(16);
        // A K6 group's sub-block scales as bytes (`k6_bytes512`), made once per call.
        let mut k6 = [_mm512_setzero_si512(); 4];
        for g in 0..ng {
            let gp = base.add(g * gb);
            let sp = gp.add(nbg * cb);
            let d = f16x16(sp);
            let dm = if M {
                f16x16(sp.add(2 * TILE))
            } else {
                _mm512_setzero_ps()
            };
            if K == K6 {
                k6_bytes512(sp, &mut k6);
            }
            let k6p = k6.as_ptr() as *const u8;
            for k in 0..nbg {
                let b = g * nbg + k;
                let p = gp.add(k * cb);
                // The weight stream runs on into the next tile; without a lead the first
                // pass over a tile waits on memory.
                for l in (0..ub).step_by(64) {
                    let at = PREFETCH + b * ub + l;
                    _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at) as *const i8);
                }
                if F {
                    ahead.fetch(data, unit + b);
                }
                let mut c = [_mm512_setzero_si512(); 8];
                if C == BYTE {
                    for t in 0..8 {
                        c[t] = _mm512_loadu_si512(p.add(64 * t) as *const __m512i);
                    }
                } else {
                    for j in 0..4 {
                        let v = _mm512_loadu_si512(p.add(64 * j) as *const __m512i);
                        c[2 * j] = _mm512_and_si512(v, low4);
                        // 4-bit codes: the high nibbles stay in place (16 times the code)
                        // and their sum is divided by 16 below, exactly; 5- and 6-bit
                        // codes shift down.
                        c[2 * j + 1] = if C == NIB4 {
                            _mm512_andnot_si512(low4, v)
                        } else {
                            _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4)
                        };
                        if C == NIB5 {
                            let m = p.add(256 + 16 * j) as *const u64;
                            let (m0, m1) = (m.read_unaligned(), m.add(1).read_unaligned());
                            c[2 * j] = _mm512_mask_add_epi8(c[2 * j], m0, c[2 * j], sixteen);
                            c[2 * j + 1] =
                                _mm512_mask_add_epi8(c[2 * j + 1], m1, c[2 * j + 1], sixteen);
                        }
                        if C == NIB6 {
                            // Bits 4-5 of each code from its plane (16-bit shifts: what
                            // crosses a byte lands outside the mask).
                            let h = _mm512_loadu_si512(p.add(256 + 64 * (j / 2)) as *const __m512i);
                            let (h0, h1) = if j % 2 == 0 {
                                (_mm512_slli_epi16::<4>(h), _mm512_slli_epi16::<2>(h))
                            } else {
                                (h, _mm512_srli_epi16::<2>(h))
                            };
                            c[2 * j] = _mm512_or_si512(c[2 * j], _mm512_and_si512(h0, high2));
                            c[2 * j + 1] =
                                _mm512_or_si512(c[2 * j + 1], _mm512_and_si512(h1, high2));
                        }
                    }
                }
                let (ws0, ws1, mins) = scales512::<K>(sp, k6p, k, d, dm);
                for i in 0..NA {
                    let a = ap[i];
                    let q = a.qs.as_ptr().add(b * QK) as *const i32;
                    let da = _mm512_set1_ps(*a.d.get_unchecked(b));
                    let subs = if s16 { 2 } else { 1 };
                    for s in 0..subs {
                        let (t0, n) = (s * 8 / subs, 8 / subs);
                        let mut d0 = _mm512_set1_epi32(bias_init::<SH>(a, b, s0(s16, s), 2 / subs));
                        let mut d1 = _mm512_setzero_si512();
                        for t in (t0..t0 + n).step_by(2) {
                            d0 = _mm512_dpbusd_epi32(d0, c[t], bc512(q, t));
                            d1 = _mm512_dpbusd_epi32(d1, c[t + 1], bc512(q, t + 1));
                        }
                        if C == NIB4 {
                            // Odd registers (high nibbles) only went into `d1`.
                            d1 = _mm512_srai_epi32::<4>(d1);
                        }
                        let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1));
                        let ws = if s == 0 { ws0 } else { ws1 };
                        acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(ws, da), acc[i]);
                    }
                    if M {
                        let bs = _mm512_set1_ps(*a.bsum.get_unchecked(b));
                        // K-quants subtract `dmin * m`: `macc - mins * bs`, rounded once,
                        // is the reference's `(-(dmin * m)) * bs + macc`.
                        macc[i] = if K == K6 {
                            _mm512_fnmadd_ps(mins, bs, macc[i])
                        } else {
                            _mm512_fmadd_ps(mins, bs, macc[i])
                        };
                    }
                }
            }
        }
        for i in 0..NA {
            let (p, live) = out.at(i, j);
            let v = _mm512_add_ps(acc[i], macc[i]);
            if live >= TILE {
                _mm512_storeu_ps(p, v);
            } else {
                _mm512_mask_storeu_ps(p, (1u16 << live) - 1, v);
            }
        }
    }
}

/// Four activation codes from `q + 4t` in every 32-bit lane.
///
/// # Safety
/// The CPU supports AVX-512F; `q + t` is valid for an unaligned read of an `i32`.
#[inline(always)]
unsafe fn bc512(q: *const i32, t: usize) -> __m512i {
    // SAFETY: the caller's block holds 32 codes from `q`.
    unsafe { _mm512_set1_epi32(q.add(t).read_unaligned()) }
}

/// # Safety
/// The CPU supports AVX2; `q + t` is valid for an unaligned read of an `i32`.
#[inline(always)]
unsafe fn bc256(q: *const i32, t: usize) -> __m256i {
    // SAFETY: as above.
    unsafe { _mm256_set1_epi32(q.add(t).read_unaligned()) }
}

/// First 16-element half covered by sub-block `s`.
#[inline(always)]
const fn s0(sub16: bool, s: usize) -> usize {
    if sub16 {
        s
    } else {
        0
    }
}

/// Bit `i` of `qh` -> byte `i` set to 0x10.
///
/// # Safety
/// The CPU supports AVX2 (register-only operations: no memory is read).
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

/// Rows `8h .. 8h + 8` of a group's f16 values at `p`, widened.
///
/// # Safety
/// The CPU supports AVX and F16C; `p + 16 * h` is valid for reads of 16 bytes (eight f16
/// values).
#[inline(always)]
unsafe fn f16x8(p: *const u8, h: usize) -> __m256 {
    // SAFETY: the caller's group holds sixteen f16 values at `p`.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h) as *const __m128i)) }
}

/// [`scales512`] for rows `8h .. 8h + 8`.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `sp` points at the scales of a group of kind `K`,
/// valid for reads of that kind's scale bytes for block `k`.
#[inline(always)]
unsafe fn scales256<const K: u8>(
    sp: *const u8,
    k: usize,
    h: usize,
    d: __m256,
    dm: __m256,
) -> (__m256, __m256, __m256) {
    // SAFETY: as in `scales512`.
    unsafe {
        let bytes = |o: usize| _mm_loadl_epi64(sp.add(o + 8 * h) as *const __m128i);
        if K == K6 {
            let lo = _mm256_cvtepu8_epi32(bytes(4 * TILE + TILE * k6_slot(k)));
            let hi = _mm256_cvtepu8_epi32(bytes(12 * TILE + TILE * (k / 2)));
            let hi = _mm256_srlv_epi32(hi, _mm256_set1_epi32(4 * (k % 2) as i32));
            let (f15, f3, f12) = (
                _mm256_set1_epi32(15),
                _mm256_set1_epi32(3),
                _mm256_set1_epi32(12),
            );
            let sc = _mm256_or_si256(
                _mm256_and_si256(lo, f15),
                _mm256_slli_epi32::<4>(_mm256_and_si256(hi, f3)),
            );
            let m = _mm256_or_si256(
                _mm256_srli_epi32::<4>(lo),
                _mm256_slli_epi32::<2>(_mm256_and_si256(hi, f12)),
            );
            let ws = _mm256_mul_ps(_mm256_cvtepi32_ps(sc), d);
            (ws, ws, _mm256_mul_ps(_mm256_cvtepi32_ps(m), dm))
        } else if K == K8 {
            let s = |x: usize| {
                let v = _mm256_cvtepi8_epi32(bytes(2 * TILE + TILE * (2 * k + x)));
                _mm256_mul_ps(_mm256_cvtepi32_ps(v), d)
            };
            (s(0), s(1), dm)
        } else {
            (d, d, dm)
        }
    }
}

/// AVX2: each register of sixteen rows as two halves (rows 0..8 and 8..16).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C (the caller checked [`Isa::detect`]); `tile` and
/// every activation row hold whole groups of format `C` for the `k` columns asked for, and
/// `out` has room for the rows and tile columns written.
#[inline(always)]
unsafe fn avx2<
    const C: u8,
    const K: u8,
    const SH: u32,
    const M: bool,
    const NA: usize,
    const F: bool,
>(
    w: &PackedWeight,
    tile: usize,
    acts: &[ActRow<'_>],
    (ahead, unit): (Ahead, usize),
    (out, j): (Dst, usize),
) {
    let fm = w.format();
    let nbg = group_blocks(K);
    let (gb, cb, ng) = (fm.group_bytes(), fm.code_bytes(), w.groups());
    let s16 = K == K8;
    // SAFETY: as in `vnni`: every offset below was bounds-checked by the caller.
    unsafe {
        let base = w.tile(tile).as_ptr();
        let data = w.data().as_ptr();
        let ap: [&ActRow<'_>; NA] = std::array::from_fn(|i| &acts[i]);
        let mut acc = [[_mm256_setzero_ps(); 2]; NA];
        let mut macc = [[_mm256_setzero_ps(); 2]; NA];
        let low4 = _mm256_set1_epi8(0x0F);
        let high2 = _mm256_set1_epi8(0x30);
        let ones = _mm256_set1_epi16(1);
        for g in 0..ng {
            let gp = base.add(g * gb);
            let sp = gp.add(nbg * cb);
            // The group's `d` and minimum (or `dmin`) for each half, widened once.
            let d = [f16x8(sp, 0), f16x8(sp, 1)];
            let dm = if M {
                [f16x8(sp.add(2 * TILE), 0), f16x8(sp.add(2 * TILE), 1)]
            } else {
                [_mm256_setzero_ps(); 2]
            };
            for k in 0..nbg {
                let b = g * nbg + k;
                let p = gp.add(k * cb);
                if F {
                    ahead.fetch(data, unit + b);
                }
                for h in 0..2 {
                    let mut c = [_mm256_setzero_si256(); 8];
                    if C == BYTE {
                        for t in 0..8 {
                            c[t] = _mm256_loadu_si256(p.add(64 * t + 32 * h) as *const __m256i);
                        }
                    } else {
                        for j in 0..4 {
                            let v = _mm256_loadu_si256(p.add(64 * j + 32 * h) as *const __m256i);
                            c[2 * j] = _mm256_and_si256(v, low4);
                            c[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
                            if C == NIB5 {
                                let m = p.add(256 + 16 * j + 4 * h) as *const u32;
                                let (m0, m1) = (m.read_unaligned(), m.add(2).read_unaligned());
                                c[2 * j] = _mm256_or_si256(c[2 * j], fifth_bits(m0));
                                c[2 * j + 1] = _mm256_or_si256(c[2 * j + 1], fifth_bits(m1));
                            }
                            if C == NIB6 {
                                let hp = p.add(256 + 64 * (j / 2) + 32 * h);
                                let hv = _mm256_loadu_si256(hp as *const __m256i);
                                let (h0, h1) = if j % 2 == 0 {
                                    (_mm256_slli_epi16::<4>(hv), _mm256_slli_epi16::<2>(hv))
                                } else {
                                    (hv, _mm256_srli_epi16::<2>(hv))
                                };
                                c[2 * j] = _mm256_or_si256(c[2 * j], _mm256_and_si256(h0, high2));
                                c[2 * j + 1] =
                                    _mm256_or_si256(c[2 * j + 1], _mm256_and_si256(h1, high2));
                            }
                        }
                    }
                    let (ws0, ws1, mins) = scales256::<K>(sp, k, h, d[h], dm[h]);
                    for i in 0..NA {
                        let a = ap[i];
                        let q = a.qs.as_ptr().add(b * QK) as *const i32;
                        let da = _mm256_set1_ps(*a.d.get_unchecked(b));
                        let subs = if s16 { 2 } else { 1 };
                        for s in 0..subs {
                            let (t0, n) = (s * 8 / subs, 8 / subs);
                            // Q8_0's signed products below already subtract its bias.
                            let init = if C == BYTE && SH == 7 {
                                0
                            } else {
                                bias_init::<SH>(a, b, s0(s16, s), 2 / subs)
                            };
                            let mut dd = [_mm256_set1_epi32(init), _mm256_setzero_si256()];
                            for t in t0..t0 + n {
                                let prod = if C == BYTE && SH == 7 {
                                    // Q8_0: back to signed codes, the sign moved onto the
                                    // activations (maddubs would saturate on codes over 127).
                                    let sw = _mm256_xor_si256(c[t], _mm256_set1_epi8(-128));
                                    _mm256_maddubs_epi16(
                                        _mm256_sign_epi8(sw, sw),
                                        _mm256_sign_epi8(bc256(q, t), sw),
                                    )
                                } else {
                                    _mm256_maddubs_epi16(c[t], bc256(q, t))
                                };
                                dd[t % 2] =
                                    _mm256_add_epi32(dd[t % 2], _mm256_madd_epi16(prod, ones));
                            }
                            let dot = _mm256_cvtepi32_ps(_mm256_add_epi32(dd[0], dd[1]));
                            let ws = if s == 0 { ws0 } else { ws1 };
                            acc[i][h] = _mm256_fmadd_ps(dot, _mm256_mul_ps(ws, da), acc[i][h]);
                        }
                        if M {
                            let bs = _mm256_set1_ps(*a.bsum.get_unchecked(b));
                            macc[i][h] = if K == K6 {
                                _mm256_fnmadd_ps(mins, bs, macc[i][h])
                            } else {
                                _mm256_fmadd_ps(mins, bs, macc[i][h])
                            };
                        }
                    }
                }
            }
        }
        for i in 0..NA {
            let mut v = [0f32; TILE];
            for h in 0..2 {
                _mm256_storeu_ps(
                    v.as_mut_ptr().add(8 * h),
                    _mm256_add_ps(acc[i][h], macc[i][h]),
                );
            }
            out.put(i, j, &v);
        }
    }
}
