//! Float weights (f32, f16, bf16) repacked once at load for the fast float kernel.
//!
//! Rows are interleaved in tiles of [`TILE`] = 16 as in [`super::qpack`]: for every column `k`
//! the sixteen rows' values are contiguous (`[tiles, cols, 16]`, in the stored 2- or 4-byte
//! format), so one load and one widening give sixteen rows' weights for one activation value
//! broadcast to every lane. Activations stay f32.
//!
//! The arithmetic of row `r` against activation row `x`: four f32 partial sums, column `k`
//! going to sum `k % 4` with one fused multiply-add, in increasing `k`; the result is
//! `(s0 + s1) + (s2 + s3)`. The scalar reference, AVX2 and AVX-512 give the same bits, and a
//! row's result never depends on which other rows share a call.

use super::aligned::Aligned;
use super::qdot::Isa;
use super::qpack::TILE;
use crate::{DType, Result, RuntimeError, Tensor, ThreadPool};

/// Activation rows one kernel call takes at most.
pub const MAX_ROWS: usize = 4;

/// A float weight matrix `[rows, cols]` in the tiled layout.
#[derive(Debug, Clone)]
pub struct FloatPacked {
    dtype: DType,
    rows: usize,
    cols: usize,
    /// `[tiles, cols, TILE]` values of `dtype.block_bytes()` bytes each.
    data: Aligned<u8>,
}

impl FloatPacked {
    /// Repacks `t` (`[rows, cols]`, F32, F16 or BF16).
    pub fn pack(t: &Tensor, pool: &ThreadPool) -> Result<FloatPacked> {
        let dtype = t.dtype();
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(RuntimeError::Shape(format!(
                "{dtype} weights are not float weights"
            )));
        }
        let (rows, cols, es) = (t.rows(), t.cols(), dtype.block_bytes());
        let tiles = rows.div_ceil(TILE);
        let tb = cols * TILE * es;
        let mut data = Aligned::<u8>::zeroed(tiles * tb);
        let dst = super::DisjointMut::new(&mut data[..]);
        pool.parallel_ranges(tiles, 1, |range| {
            for tile in range {
                // SAFETY: each tile's bytes belong to this task alone.
                let d = unsafe { dst.slice(tile * tb, tb) };
                for l in 0..TILE.min(rows - tile * TILE) {
                    let src = t.row(tile * TILE + l);
                    for k in 0..cols {
                        let o = (k * TILE + l) * es;
                        d[o..o + es].copy_from_slice(&src[k * es..(k + 1) * es]);
                    }
                }
            }
        });
        Ok(FloatPacked {
            dtype,
            rows,
            cols,
            data,
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
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

    /// Bytes held.
    pub fn num_bytes(&self) -> usize {
        self.data.len()
    }

    fn tile(&self, t: usize) -> &[u8] {
        let n = self.cols * TILE * self.dtype.block_bytes();
        &self.data[t * n..(t + 1) * n]
    }

    /// Weight of tile row `l` at column `k` of tile `t`, widened to f32.
    fn value(&self, t: usize, k: usize, l: usize) -> f32 {
        let es = self.dtype.block_bytes();
        let b = &self.tile(t)[(k * TILE + l) * es..][..es];
        match self.dtype {
            DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            DType::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
            _ => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        }
    }
}

/// The reference: row `row` against `x` (`cols` values), the module's arithmetic in plain loops.
pub fn dot_scalar(w: &FloatPacked, row: usize, x: &[f32]) -> f32 {
    let (t, l) = (row / TILE, row % TILE);
    let mut s = [0f32; 4];
    for (k, &xv) in x.iter().enumerate().take(w.cols) {
        s[k % 4] = w.value(t, k, l).mul_add(xv, s[k % 4]);
    }
    (s[0] + s[1]) + (s[2] + s[3])
}

/// `out[j * xs.len() + i][l] = w[TILE * (tiles.start + j) + l] · xs[i]` for every tile in
/// `tiles` and one to four activation rows of `cols` values; `isa` one of [`Isa::available`].
pub fn dot_tiles(
    isa: Isa,
    w: &FloatPacked,
    tiles: std::ops::Range<usize>,
    xs: &[&[f32]],
    out: &mut [[f32; TILE]],
) {
    let na = xs.len();
    assert!(
        (1..=MAX_ROWS).contains(&na)
            && tiles.end <= w.tiles()
            && out.len() == tiles.len() * na
            && xs.iter().all(|x| x.len() == w.cols),
        "fpack::dot_tiles: no product of tiles {tiles:?} with {na} rows"
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` comes from `Isa::detect`/`available`; lengths were checked above.
        Isa::Avx512Vnni => unsafe { x86::tiles512(w, tiles, xs, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::tiles256(w, tiles, xs, out) },
        _ => {
            for (j, tile) in tiles.enumerate() {
                for (x, o) in xs.iter().zip(&mut out[j * na..(j + 1) * na]) {
                    for (l, o) in o.iter_mut().enumerate() {
                        *o = dot_scalar(w, TILE * tile + l, x);
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // register arrays read best indexed
mod x86 {
    use super::{FloatPacked, TILE};
    use crate::DType;
    use std::arch::x86_64::*;
    use std::ops::Range;

    const F32: u8 = 0;
    const F16: u8 = 1;
    const BF16: u8 = 2;

    macro_rules! dispatch {
        ($f:ident, $w:expr, $tiles:expr, $xs:expr, $out:expr) => {{
            macro_rules! rows {
                ($D:expr) => {
                    match $xs.len() {
                        4 => $f::<$D, 4>($w, $tiles, $xs, $out),
                        3 => $f::<$D, 3>($w, $tiles, $xs, $out),
                        2 => $f::<$D, 2>($w, $tiles, $xs, $out),
                        _ => $f::<$D, 1>($w, $tiles, $xs, $out),
                    }
                };
            }
            match $w.dtype() {
                DType::F32 => rows!(F32),
                DType::F16 => rows!(F16),
                _ => rows!(BF16),
            }
        }};
    }

    /// # Safety
    /// The CPU has AVX-512 F/BW, FMA and F16C; the call was checked by `dot_tiles`.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub(super) unsafe fn tiles512(
        w: &FloatPacked,
        tiles: Range<usize>,
        xs: &[&[f32]],
        out: &mut [[f32; TILE]],
    ) {
        // SAFETY: forwarded.
        unsafe { dispatch!(k512, w, tiles, xs, out) }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C; the call was checked by `dot_tiles`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tiles256(
        w: &FloatPacked,
        tiles: Range<usize>,
        xs: &[&[f32]],
        out: &mut [[f32; TILE]],
    ) {
        // SAFETY: forwarded.
        unsafe { dispatch!(k256, w, tiles, xs, out) }
    }

    /// Sixteen weights at `p` widened to f32.
    ///
    /// # Safety
    /// The CPU supports AVX-512F (and F16C for f16); `p` is valid for reads of sixteen weights
    /// of type `D`.
    #[inline(always)]
    unsafe fn load16<const D: u8>(p: *const u8) -> __m512 {
        // SAFETY: `p` points at sixteen values of the format.
        unsafe {
            match D {
                F32 => _mm512_loadu_ps(p as *const f32),
                F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
                _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                    _mm256_loadu_si256(p as *const __m256i),
                ))),
            }
        }
    }

    /// Eight weights at `p` widened to f32.
    ///
    /// # Safety
    /// The CPU supports AVX2 (and F16C for f16); `p` is valid for reads of eight weights of
    /// type `D`.
    #[inline(always)]
    unsafe fn load8<const D: u8>(p: *const u8) -> __m256 {
        // SAFETY: `p` points at eight values of the format.
        unsafe {
            match D {
                F32 => _mm256_loadu_ps(p as *const f32),
                F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                    _mm_loadu_si128(p as *const __m128i),
                ))),
            }
        }
    }

    /// # Safety
    /// The CPU supports the AVX-512 features of its callers' `target_feature` set; the tile and
    /// activation rows passed hold the `k` columns read, and the output has room for the rows
    /// and tile columns written.
    #[inline(always)]
    unsafe fn k512<const D: u8, const NA: usize>(
        w: &FloatPacked,
        tiles: Range<usize>,
        xs: &[&[f32]],
        out: &mut [[f32; TILE]],
    ) {
        let (cols, es) = (w.cols(), w.dtype().block_bytes());
        // SAFETY: `dot_tiles` checked the tiles exist (`cols * TILE` values each) and every
        // activation row holds `cols` values.
        unsafe {
            for (j, tile) in tiles.enumerate() {
                let base = w.tile(tile).as_ptr();
                let mut acc = [[_mm512_setzero_ps(); 4]; NA];
                macro_rules! step {
                    ($k:expr, $c:expr) => {{
                        let k = $k;
                        let wv = load16::<D>(base.add(k * TILE * es));
                        for i in 0..NA {
                            let x = _mm512_set1_ps(*xs[i].get_unchecked(k));
                            acc[i][$c] = _mm512_fmadd_ps(wv, x, acc[i][$c]);
                        }
                    }};
                }
                let k4 = cols / 4 * 4;
                for k in (0..k4).step_by(4) {
                    for c in 0..4 {
                        step!(k + c, c);
                    }
                }
                for c in 0..cols - k4 {
                    step!(k4 + c, c);
                }
                for i in 0..NA {
                    let [a0, a1, a2, a3] = acc[i];
                    let r = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
                    _mm512_storeu_ps(out[j * NA + i].as_mut_ptr(), r);
                }
            }
        }
    }

    /// # Safety
    /// The CPU supports the AVX2 features of its callers' `target_feature` set; the tile and
    /// activation rows passed hold the `k` columns read, and the output has room for the rows
    /// and tile columns written.
    #[inline(always)]
    unsafe fn k256<const D: u8, const NA: usize>(
        w: &FloatPacked,
        tiles: Range<usize>,
        xs: &[&[f32]],
        out: &mut [[f32; TILE]],
    ) {
        let (cols, es) = (w.cols(), w.dtype().block_bytes());
        // SAFETY: as in `k512`.
        unsafe {
            for (j, tile) in tiles.enumerate() {
                let base = w.tile(tile).as_ptr();
                for h in 0..2 {
                    let mut acc = [[_mm256_setzero_ps(); 4]; NA];
                    macro_rules! step {
                        ($k:expr, $c:expr) => {{
                            let k = $k;
                            let wv = load8::<D>(base.add((k * TILE + 8 * h) * es));
                            for i in 0..NA {
                                let x = _mm256_set1_ps(*xs[i].get_unchecked(k));
                                acc[i][$c] = _mm256_fmadd_ps(wv, x, acc[i][$c]);
                            }
                        }};
                    }
                    let k4 = cols / 4 * 4;
                    for k in (0..k4).step_by(4) {
                        for c in 0..4 {
                            step!(k + c, c);
                        }
                    }
                    for c in 0..cols - k4 {
                        step!(k4 + c, c);
                    }
                    for i in 0..NA {
                        let [a0, a1, a2, a3] = acc[i];
                        let r = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
                        _mm256_storeu_ps(out[j * NA + i].as_mut_ptr().add(8 * h), r);
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
    fn every_isa_matches_the_reference_and_the_plain_product() {
        let pool = ThreadPool::new(2).expect("pool");
        let (rows, cols) = (37, 70);
        let wv: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 13 % 97) as f32 - 48.0) * 0.01)
            .collect();
        let x: Vec<f32> = (0..4 * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let bytes: Vec<u8> = match dtype {
                DType::F32 => wv.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DType::F16 => wv
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
                    .collect(),
                _ => wv
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                    .collect(),
            };
            let t = Tensor::new(dtype, vec![rows, cols], Storage::owned(bytes)).expect("tensor");
            let w = FloatPacked::pack(&t, &pool).expect("pack");
            let xs: Vec<&[f32]> = x.chunks_exact(cols).collect();
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                t.dequantize_row(r, &mut row);
                let want: f64 = row
                    .iter()
                    .zip(xs[1])
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                assert!((dot_scalar(&w, r, xs[1]) as f64 - want).abs() < 1e-4);
            }
            for isa in Isa::available() {
                for na in 1..=MAX_ROWS {
                    let tiles = 0..w.tiles();
                    let mut out = vec![[f32::NAN; TILE]; na * tiles.len()];
                    dot_tiles(isa, &w, tiles, &xs[..na], &mut out);
                    for (j, o) in out.iter().enumerate() {
                        let (tile, i) = (j / na, j % na);
                        for (l, &v) in o.iter().enumerate() {
                            let r = TILE * tile + l;
                            let want = if r < rows {
                                dot_scalar(&w, r, xs[i])
                            } else {
                                0.0
                            };
                            assert_eq!(v.to_bits(), want.to_bits(), "{dtype} {isa:?} {na} row {r}");
                        }
                    }
                }
            }
        }
    }
}
