//! bf16 weights against bf16 activations with AVX-512 BF16 (`vdpbf16ps`): the fast setting's
//! product for bf16 weights on CPUs that have the instruction. vLLM's CPU backend and llama.cpp
//! both compute bf16 models this way; on other CPUs bf16 weights keep f32 activations
//! ([`super::fpack`]), and the float setting never takes this path.
//!
//! Layout: weight rows are interleaved in tiles of [`TILE`] = 16 as in [`super::qpack`], and
//! columns are taken in pairs: for pair `p` the sixteen rows' `(w[2p], w[2p + 1])` are 64
//! contiguous bytes (`[tiles, pairs, 16, 2]`, one `u32` per row and pair, the even column in the
//! low half). An odd last column is padded with zero. Activation rows are rounded to bf16
//! (nearest, ties to even) once per product and kept as the same pairs ([`Bf16Acts`]); one pair
//! is broadcast to every lane.
//!
//! The arithmetic of row `r` against activation row `x` is the instruction's: two f32 partial
//! sums, pair `p` going to sum `p % 2` as `s = fma(w[2p+1], x[2p+1], s)` then
//! `s = fma(w[2p], x[2p], s)` (inputs with a zero exponent read as zero, results below the
//! normal range flushed to zero), in increasing `p`; the result is `s0 + s1`. The scalar
//! reference gives the same bits as the hardware, and a row's result never depends on which
//! other rows share a call.
//!
//! Speed: one call takes up to eight activation rows, so at sixteen rows (batched decode) each
//! weight tile is read twice, and the first pass's eight dot products per 64 bytes keep pace with
//! one core's share of memory bandwidth. Two chains per row (latency 6 cycles) are still far
//! faster than memory for a single row.

pub use super::ahead::Ahead;
use super::aligned::Aligned;
use super::dst::Dst;
use super::qpack::TILE;
use super::simd::multiversion;
use super::DisjointMut;
use crate::{DType, Result, RuntimeError, Tensor, ThreadPool};

/// Activation rows one kernel call takes at most.
pub const MAX_ROWS: usize = 8;

/// Whether this CPU runs the kernel (AVX-512 F/BW and BF16).
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x` rounded to bf16: nearest, ties to even; NaN stays NaN.
pub fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// A bf16 weight matrix `[rows, cols]` in the paired tile layout.
#[derive(Debug, Clone)]
pub struct Bf16Packed {
    rows: usize,
    cols: usize,
    /// `[tiles, pairs, TILE]` pairs of bf16 values.
    data: Aligned<u32>,
}

impl Bf16Packed {
    /// Repacks `t` (`[rows, cols]`, BF16).
    pub fn pack(t: &Tensor, pool: &ThreadPool) -> Result<Bf16Packed> {
        if t.dtype() != DType::BF16 {
            return Err(RuntimeError::Shape(format!(
                "{} weights are not bf16 weights",
                t.dtype()
            )));
        }
        let (rows, cols) = (t.rows(), t.cols());
        let pairs = cols.div_ceil(2);
        let tiles = rows.div_ceil(TILE);
        let tw = pairs * TILE;
        let mut data = Aligned::<u32>::zeroed(tiles * tw);
        let dst = super::DisjointMut::new(&mut data[..]);
        pool.parallel_ranges(tiles, 1, |range| {
            for tile in range {
                // SAFETY: each tile's words belong to this task alone.
                let d = unsafe { dst.slice(tile * tw, tw) };
                for l in 0..TILE.min(rows - tile * TILE) {
                    let src = t.row(tile * TILE + l);
                    for (p, pair) in src.chunks(4).enumerate() {
                        let lo = u16::from_le_bytes([pair[0], pair[1]]) as u32;
                        let hi = match pair {
                            [_, _, a, b] => u16::from_le_bytes([*a, *b]) as u32,
                            _ => 0,
                        };
                        d[p * TILE + l] = lo | hi << 16;
                    }
                }
            }
        });
        Ok(Bf16Packed { rows, cols, data })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE)
    }

    /// Column pairs per row: the kernel's steps through a tile, 64 bytes each.
    pub fn pairs(&self) -> usize {
        self.cols.div_ceil(2)
    }

    /// Bytes of one tile.
    pub fn tile_bytes(&self) -> usize {
        self.pairs() * TILE * 4
    }

    /// Bytes held.
    pub fn num_bytes(&self) -> usize {
        self.data.len() * 4
    }

    fn tile(&self, t: usize) -> &[u32] {
        let n = self.pairs() * TILE;
        &self.data[t * n..(t + 1) * n]
    }
}

/// Activation rows `[rows, cols]` rounded to bf16, in column pairs.
#[derive(Debug, Clone, Default)]
pub struct Bf16Acts {
    rows: usize,
    cols: usize,
    data: Vec<u32>,
}

impl Bf16Acts {
    /// Rounds `x` (rows of `cols` values) into this buffer, reusing its memory.
    pub fn fill(&mut self, x: &[f32], cols: usize) {
        let rows = x.len().checked_div(cols).unwrap_or(0);
        let pairs = cols.div_ceil(2);
        self.rows = rows;
        self.cols = cols;
        self.data.clear();
        self.data.resize(rows * pairs, 0);
        for (src, dst) in x
            .chunks_exact(cols.max(1))
            .zip(self.data.chunks_exact_mut(pairs))
        {
            fill_row(src, dst);
        }
    }

    /// The buffer sized for `rows` rows of `cols` values, for tasks that fill disjoint rows.
    pub(crate) fn rows_mut(&mut self, rows: usize, cols: usize) -> Bf16Rows<'_> {
        let pairs = cols.div_ceil(2);
        self.rows = rows;
        self.cols = cols;
        self.data.resize(rows * pairs, 0);
        Bf16Rows {
            cols,
            data: DisjointMut::new(&mut self.data),
            _acts: std::marker::PhantomData,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i`'s pairs.
    pub fn row(&self, i: usize) -> &[u32] {
        let pairs = self.cols.div_ceil(2);
        &self.data[i * pairs..(i + 1) * pairs]
    }
}

/// A [`Bf16Acts`] whose rows parallel tasks fill, each its own rows.
pub(crate) struct Bf16Rows<'a> {
    cols: usize,
    data: DisjointMut<u32>,
    _acts: std::marker::PhantomData<&'a mut Bf16Acts>,
}

impl Bf16Rows<'_> {
    /// Rounds `x` (`[rows.len(), cols]`) into rows `rows`, as [`Bf16Acts::fill`] does.
    ///
    /// # Safety
    /// No other task writes any of `rows` meanwhile.
    pub(crate) unsafe fn fill(&self, rows: std::ops::Range<usize>, x: &[f32]) {
        let (cols, pairs) = (self.cols, self.cols.div_ceil(2));
        assert_eq!(x.len(), rows.len() * cols, "Bf16Rows: bad rows");
        for (r, src) in rows.zip(x.chunks_exact(cols.max(1))) {
            // SAFETY: row r belongs to the caller alone (the slice checks bounds).
            fill_row(src, unsafe { self.data.slice(r * pairs, pairs) });
        }
    }
}

multiversion! {
    /// One row of [`Bf16Acts::fill`]: `src` (`cols` values) into `dst` (`cols / 2` pairs,
    /// rounded up; an odd last value pairs with zero).
    fn fill_row(src: &[f32], dst: &mut [u32]) = fill_row_impl;
}

#[inline(always)]
fn fill_row_impl(src: &[f32], dst: &mut [u32]) {
    let whole = src.len() / 2;
    for (d, s) in dst[..whole].iter_mut().zip(src.chunks_exact(2)) {
        *d = to_bf16(s[0]) as u32 | (to_bf16(s[1]) as u32) << 16;
    }
    if src.len() % 2 == 1 {
        dst[whole] = to_bf16(src[src.len() - 1]) as u32;
    }
}

/// A bf16 value as the instruction reads it: a zero exponent reads as (signed) zero.
fn read(b: u32) -> f32 {
    let b = b & 0xffff;
    if b & 0x7f80 == 0 {
        f32::from_bits((b & 0x8000) << 16)
    } else {
        f32::from_bits(b << 16)
    }
}

/// `fma(a, b, s)` with a result below the normal range flushed to (signed) zero.
fn fma_ftz(a: f32, b: f32, s: f32) -> f32 {
    let r = a.mul_add(b, s);
    if r != 0.0 && r.abs() < f32::MIN_POSITIVE {
        f32::from_bits(r.to_bits() & 0x8000_0000)
    } else {
        r
    }
}

/// The reference: row `row` against `x` (one row of [`Bf16Acts`]), the module's arithmetic in
/// plain loops.
pub fn dot_scalar(w: &Bf16Packed, row: usize, x: &[u32]) -> f32 {
    let (t, l) = (row / TILE, row % TILE);
    let tile = w.tile(t);
    let mut s = [0f32; 2];
    for (p, &xp) in x.iter().enumerate().take(w.pairs()) {
        let wp = tile[p * TILE + l];
        let c = p % 2;
        s[c] = fma_ftz(read(wp >> 16), read(xp >> 16), s[c]);
        s[c] = fma_ftz(read(wp), read(xp), s[c]);
    }
    s[0] + s[1]
}

/// `out[j * xs.len() + i][l] = w[TILE * (tiles.start + j) + l] · xs[i]` for every tile in
/// `tiles` and one to eight activation rows (rows of one [`Bf16Acts`] of `w.cols()` columns).
/// The hardware kernel runs where [`supported`] (also prefetching `ahead`, a unit per column
/// pair: a hint only), the reference elsewhere. The test and bench entry; products go through
/// `dot_rows`.
pub fn dot_tiles(
    w: &Bf16Packed,
    tiles: std::ops::Range<usize>,
    xs: &[&[u32]],
    ahead: Ahead,
    out: &mut [[f32; TILE]],
) {
    let na = xs.len();
    assert!(
        (1..=MAX_ROWS).contains(&na)
            && tiles.end <= w.tiles()
            && out.len() == tiles.len() * na
            && xs.iter().all(|x| x.len() == w.pairs()),
        "bpack::dot_tiles: no product of tiles {tiles:?} with {na} rows"
    );
    // SAFETY: the call was checked above, and `dst` addresses exactly `out`.
    unsafe { call(w, tiles, xs, ahead, Dst::buffer(out, na)) }
}

/// One kernel call: the tiles against `xs`, stored through `dst`.
///
/// # Safety
/// One to [`MAX_ROWS`] rows of `w.pairs()` pairs each, tiles of `w`; `dst` addresses writable
/// memory that is the caller's alone for every tile of `tiles` and row of `xs`.
unsafe fn call(
    w: &Bf16Packed,
    tiles: std::ops::Range<usize>,
    xs: &[&[u32]],
    ahead: Ahead,
    dst: Dst,
) {
    #[cfg(target_arch = "x86_64")]
    if supported() {
        // SAFETY: the CPU has the features; the caller checked the call.
        unsafe {
            // A separate build without the fetches, so that many-pass products (which have
            // none) do not test for them at every step.
            macro_rules! rows {
                ($f:literal) => {
                    match xs.len() {
                        8 => x86::k512::<8, $f>(w, tiles, xs, ahead, dst),
                        7 => x86::k512::<7, $f>(w, tiles, xs, ahead, dst),
                        6 => x86::k512::<6, $f>(w, tiles, xs, ahead, dst),
                        5 => x86::k512::<5, $f>(w, tiles, xs, ahead, dst),
                        4 => x86::k512::<4, $f>(w, tiles, xs, ahead, dst),
                        3 => x86::k512::<3, $f>(w, tiles, xs, ahead, dst),
                        2 => x86::k512::<2, $f>(w, tiles, xs, ahead, dst),
                        _ => x86::k512::<1, $f>(w, tiles, xs, ahead, dst),
                    }
                };
            }
            if ahead.step > 0 {
                rows!(true)
            } else {
                rows!(false)
            }
        }
        return;
    }
    for (j, tile) in tiles.enumerate() {
        for (i, x) in xs.iter().enumerate() {
            let v: [f32; TILE] = std::array::from_fn(|l| dot_scalar(w, TILE * tile + l, x));
            // SAFETY: the caller's contract.
            unsafe { dst.put(i, j, &v) };
        }
    }
}

/// `out[i, c] = w[c] · acts.row(i)` for every column `c` of the tiles `tiles` (columns at or
/// past the weight's rows are not written) and every activation row `i` in `rows`, where `out`
/// is `[acts.rows(), w.rows()]`. With at most [`MAX_ROWS`] rows (decode) one kernel call covers
/// all the tiles; with more, each group of `group` tiles stays in cache while the rows pass it
/// eight at a time, the group's last passes prefetching a share of the next ([`Ahead`]).
/// Results go straight from the kernel's registers to `out`.
///
/// # Safety
/// Columns `TILE * tiles.start .. TILE * tiles.end` of rows `rows` of `out` belong to the
/// caller's task alone.
pub(super) unsafe fn dot_rows(
    w: &Bf16Packed,
    tiles: std::ops::Range<usize>,
    acts: &Bf16Acts,
    rows: std::ops::Range<usize>,
    group: usize,
    out: &DisjointMut<f32>,
) {
    let n = w.rows();
    assert!(
        tiles.end <= w.tiles()
            && rows.end <= acts.rows()
            && acts.cols() == w.cols()
            && out.len == acts.rows() * n,
        "bpack::dot_rows: no product of tiles {tiles:?} of [{n}, {}] with rows {rows:?} of [{}, {}]",
        w.cols(),
        acts.rows(),
        acts.cols()
    );
    if tiles.is_empty() || rows.is_empty() {
        return;
    }
    // One call: tiles `t` against rows `i .. i + na` (`i` < `acts.rows()`, each row
    // `w.pairs()` pairs as checked above), into those rows' columns of the tiles: the caller's.
    let pass = |t: std::ops::Range<usize>, i: usize, na: usize, ahead: Ahead| {
        let xs: [&[u32]; MAX_ROWS] = std::array::from_fn(|d| acts.row(i + d.min(na - 1)));
        let dst = Dst::output(out, n, t.start, i);
        // SAFETY: as above.
        unsafe { call(w, t, &xs[..na], ahead, dst) }
    };
    if rows.len() <= MAX_ROWS {
        pass(tiles, rows.start, rows.len(), Ahead::NONE);
        return;
    }
    let passes = rows.len().div_ceil(MAX_ROWS);
    let mut t = tiles.start;
    while t < tiles.end {
        let g = t..(t + group.max(1)).min(tiles.end);
        let mut i = rows.start;
        for k in 0..passes {
            let na = (rows.end - i).min(MAX_ROWS);
            let ahead = Ahead::split(g.clone(), w.tile_bytes(), w.pairs(), k, passes);
            pass(g.clone(), i, na, ahead);
            i += na;
        }
        t = g.end;
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // register arrays read best indexed
mod x86 {
    use super::{Ahead, Bf16Packed, Dst, TILE};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// How far ahead of the kernel the weight stream is prefetched, in `u32`s (2 KiB).
    const PREFETCH: usize = 512;

    /// # Safety
    /// The CPU has AVX-512 F/BW and BF16; the call was checked as `call` requires, and `out`
    /// addresses the caller's own memory for every tile and row.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn k512<const NA: usize, const F: bool>(
        w: &Bf16Packed,
        tiles: Range<usize>,
        xs: &[&[u32]],
        ahead: Ahead,
        out: Dst,
    ) {
        let pairs = w.pairs();
        let data = w.data.as_ptr() as *const u8;
        // SAFETY: the caller checked the tiles exist (`pairs * TILE` words each) and every
        // activation row holds `pairs` words.
        unsafe {
            for (j, tile) in tiles.enumerate() {
                let base = w.tile(tile).as_ptr();
                let mut acc = [[_mm512_setzero_ps(); 2]; NA];
                macro_rules! step {
                    ($p:expr, $c:expr) => {{
                        let p = $p;
                        // The stream runs on into the next tile; the hardware prefetcher alone
                        // leaves the first pass waiting on memory.
                        _mm_prefetch::<_MM_HINT_T0>(
                            base.wrapping_add(p * TILE + PREFETCH) as *const i8
                        );
                        if F {
                            ahead.fetch(data, j * pairs + p);
                        }
                        let wv: __m512bh =
                            std::mem::transmute(_mm512_loadu_si512(base.add(p * TILE) as *const _));
                        for i in 0..NA {
                            let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(
                                *xs[i].get_unchecked(p) as i32,
                            ));
                            acc[i][$c] = _mm512_dpbf16_ps(acc[i][$c], wv, x);
                        }
                    }};
                }
                let p2 = pairs / 2 * 2;
                for p in (0..p2).step_by(2) {
                    step!(p, 0);
                    step!(p + 1, 1);
                }
                if pairs > p2 {
                    step!(p2, 0);
                }
                for i in 0..NA {
                    let r = _mm512_add_ps(acc[i][0], acc[i][1]);
                    let (p, live) = out.at(i, j);
                    if live >= TILE {
                        _mm512_storeu_ps(p, r);
                    } else {
                        _mm512_mask_storeu_ps(p, (1u16 << live) - 1, r);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Storage;

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even code.
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(to_bf16(f32::MAX), 0x7f80);
        assert!(f32::from_bits((to_bf16(f32::NAN) as u32) << 16).is_nan());
    }

    #[test]
    fn kernel_matches_the_reference_and_the_plain_product() {
        let pool = ThreadPool::new(2).expect("pool");
        for (rows, cols) in [(37, 70), (16, 9), (5, 1)] {
            let wv: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 13 % 97) as f32 - 48.0) * 0.01)
                .collect();
            let bytes: Vec<u8> = wv
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                .collect();
            let t =
                Tensor::new(DType::BF16, vec![rows, cols], Storage::owned(bytes)).expect("tensor");
            let w = Bf16Packed::pack(&t, &pool).expect("pack");
            let x: Vec<f32> = (0..MAX_ROWS * cols)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let mut acts = Bf16Acts::default();
            acts.fill(&x, cols);
            let xs: Vec<&[u32]> = (0..MAX_ROWS).map(|i| acts.row(i)).collect();
            // Each pair holds the two values rounded by `to_bf16`, an odd last one with zero.
            for (i, xr) in xs.iter().enumerate() {
                for (p, &pair) in xr.iter().enumerate() {
                    let at = |c: usize| {
                        if c < cols {
                            to_bf16(x[i * cols + c]) as u32
                        } else {
                            0
                        }
                    };
                    assert_eq!(pair, at(2 * p) | at(2 * p + 1) << 16, "row {i} pair {p}");
                }
            }
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                t.dequantize_row(r, &mut row);
                let want: f64 = row
                    .iter()
                    .zip(&x[cols..2 * cols])
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                // Activations rounded to bf16: 2^-9 relative each.
                let bound = row.iter().map(|v| v.abs() as f64).sum::<f64>() * 4e-3 + 1e-5;
                assert!((dot_scalar(&w, r, xs[1]) as f64 - want).abs() < bound);
            }
            for na in 1..=MAX_ROWS {
                for tiles in [0..w.tiles(), w.tiles() - 1..w.tiles()] {
                    let mut out = vec![[f32::NAN; TILE]; na * tiles.len()];
                    dot_tiles(&w, tiles.clone(), &xs[..na], Ahead::NONE, &mut out);
                    for (j, o) in out.iter().enumerate() {
                        let (tile, i) = (tiles.start + j / na, j % na);
                        for (l, &v) in o.iter().enumerate() {
                            let r = TILE * tile + l;
                            let want = if r < rows {
                                dot_scalar(&w, r, xs[i])
                            } else {
                                0.0
                            };
                            assert_eq!(v.to_bits(), want.to_bits(), "{na} rows, row {r}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn row_passes_store_straight_into_the_output() {
        // 20 weight rows (the last tile has 12 padding rows) against 19 activation rows: one
        // pass of three rows, or three passes (the last of three rows), each tile in turn. Every
        // value is the reference's, and the padding rows store nothing: the last tile goes after
        // the first, so a whole-tile store would overwrite the next row's first columns.
        let pool = ThreadPool::new(1).expect("pool");
        let (n, m, k) = (20, 19, 37);
        let bytes: Vec<u8> = (0..n * k)
            .flat_map(|i| {
                let v = ((i * 29 % 101) as f32 - 50.0) * 0.02;
                half::bf16::from_f32(v).to_bits().to_le_bytes()
            })
            .collect();
        let t = Tensor::new(DType::BF16, vec![n, k], Storage::owned(bytes)).expect("tensor");
        let w = Bf16Packed::pack(&t, &pool).expect("pack");
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.71).cos()).collect();
        let mut acts = Bf16Acts::default();
        acts.fill(&x, k);
        for (rows, group) in [(0..m, 1), (0..m, 4), (4..7, 2), (2..12, 1)] {
            // A guard tile past the output catches stores past its last row.
            let mut out = vec![f32::NAN; m * n + TILE];
            let shared = DisjointMut::new(&mut out[..m * n]);
            for tiles in [0..1, 1..2] {
                // SAFETY: the calls store in turn.
                unsafe { dot_rows(&w, tiles, &acts, rows.clone(), group, &shared) };
            }
            for i in 0..m {
                for c in 0..n {
                    let got = out[i * n + c];
                    if rows.contains(&i) {
                        let want = dot_scalar(&w, c, acts.row(i));
                        assert_eq!(got.to_bits(), want.to_bits(), "rows {rows:?}: [{i}, {c}]");
                    } else {
                        assert!(got.is_nan(), "rows {rows:?}: row {i} written");
                    }
                }
            }
            assert!(
                out[m * n..].iter().all(|v| v.is_nan()),
                "rows {rows:?}: guard written"
            );
        }
    }

    #[test]
    fn reference_flushes_like_the_instruction() {
        // A denormal input reads as zero; a product below the normal range flushes to zero.
        assert_eq!(read(0x0001), 0.0);
        assert_eq!(read(0x8001).to_bits(), (-0.0f32).to_bits());
        assert_eq!(fma_ftz(1e-20, 1e-20, 0.0), 0.0);
        assert_eq!(fma_ftz(2.0, 3.0, 1.0), 7.0);
    }
}
