//! The matrix-product drivers: products against weights in any stored format, split over the
//! pool. The API that picks among them is [`super::linear`].
//!
//! Two settings ([`MatmulPrecision`](super::MatmulPrecision)). The float setting runs [`matmul`], which decodes weight
//! rows to f32: the reference. The fast setting runs tiled kernels over weights repacked at load:
//! integer dot products for block-quantized weights ([`matmul_q8`]), bf16 dot products with bf16
//! activations for bf16 weights where the CPU has AVX-512 BF16 ([`super::bpack`]), and f32
//! products for other float weights ([`matmul_f`]).
//!
//! `out[m, n] = x[m, k] · w[n, k]ᵀ`. Work is split over weight rows; each task decodes one weight
//! row at a time into a scratch row and dots it with every activation row, so each weight byte is
//! read once per call whatever `m` is, and no matrix is ever expanded. Every output element is
//! one `dot` in a fixed order: results are identical for any batch composition or thread count.

use super::bpack::{self, Bf16Acts, Bf16Packed};
use super::fpack::{self, FloatPacked};
use super::qdot::{self, Isa, Q8Acts};
use super::qpack::PackedWeight;
use super::simd::multiversion;
use super::DisjointMut;
use crate::{DType, Result, RuntimeError, Tensor, ThreadPool};
use std::ops::Range;

/// Weight rows per tile of the tiled kernels.
const TILE: usize = qdot::TILE_ROWS;

/// `out[m, n] = acts[m, k] · w[n, k]ᵀ` with integer dot products over repacked weights. Tiles
/// of sixteen weight rows are split over the pool; each task walks its tiles one at a time,
/// every tile staying in L1 while the activation rows pass it four at a time.
pub fn matmul_q8(
    pool: &ThreadPool,
    isa: Isa,
    acts: &Q8Acts,
    w: &PackedWeight,
    out: &mut [f32],
) -> Result<()> {
    matmul_q8_many(pool, isa, acts, &[w], &mut [out])
}

/// Most products [`matmul_q8_many`] takes at once.
pub const MAX_PRODUCTS: usize = 4;

/// [`matmul_q8`] for several weights of one input at once (q, k and v; gate and up): one
/// parallel call over all their tiles.
pub fn matmul_q8_many(
    pool: &ThreadPool,
    isa: Isa,
    acts: &Q8Acts,
    weights: &[&PackedWeight],
    outs: &mut [&mut [f32]],
) -> Result<()> {
    let (m, k) = (acts.rows(), acts.cols());
    over_tiles(pool, "matmul_q8", m, k, weights, outs, |w, tiles, out| {
        run_tiles(isa, acts, w, tiles, out)
    })
}

/// Several bf16 weights of one input (rounded to bf16) at once, in one parallel call over all
/// their tiles (as `matmul_q8_many` does for block-quantized weights).
pub fn matmul_b16_many(
    pool: &ThreadPool,
    acts: &Bf16Acts,
    weights: &[&Bf16Packed],
    outs: &mut [&mut [f32]],
) -> Result<()> {
    let (m, k) = (acts.rows(), acts.cols());
    over_tiles(pool, "matmul_b16", m, k, weights, outs, |w, tiles, out| {
        // SAFETY: these tiles' columns belong to this task (`over_tiles` splits the tiles).
        unsafe { bpack::dot_rows(w, tiles, acts, 0..m, GROUP, out) }
    })
}

/// A weight repacked into tiles of 16 rows, as [`over_tiles`] sees it.
trait Tiled: Sync {
    fn shape(&self) -> (usize, usize, usize, DType);
}

impl Tiled for PackedWeight {
    fn shape(&self) -> (usize, usize, usize, DType) {
        (self.rows(), self.cols(), self.tiles(), self.dtype())
    }
}

impl Tiled for Bf16Packed {
    fn shape(&self) -> (usize, usize, usize, DType) {
        (self.rows(), self.cols(), self.tiles(), DType::BF16)
    }
}

/// Checks `outs[i]` is `[m, n_i]` for weights `[n_i, k]`, then splits all their tiles over
/// `pool` in one call, `run(w_i, tiles, out_i)` for each weight's share. `op` names the product
/// in errors.
fn over_tiles<W: Tiled>(
    pool: &ThreadPool,
    op: &str,
    m: usize,
    k: usize,
    weights: &[&W],
    outs: &mut [&mut [f32]],
    run: impl Fn(&W, Range<usize>, &DisjointMut<f32>) + Sync,
) -> Result<()> {
    if weights.len() != outs.len() || weights.len() > MAX_PRODUCTS {
        return Err(RuntimeError::Shape(format!(
            "{op}: {} weights for {} outputs (at most {MAX_PRODUCTS})",
            weights.len(),
            outs.len()
        )));
    }
    for (w, out) in weights.iter().zip(outs.iter()) {
        let (n, cols, _, format) = w.shape();
        if cols != k {
            return Err(RuntimeError::Shape(format!(
                "{op}: {format} weights [{n}, {cols}] against activation rows of {k}"
            )));
        }
        if out.len() != m * n {
            return Err(RuntimeError::Shape(format!(
                "{op}: output of {} values for [{m}, {n}]",
                out.len()
            )));
        }
    }
    if m == 0 {
        return Ok(());
    }
    let mut dst: [Option<DisjointMut<f32>>; MAX_PRODUCTS] = Default::default();
    for (d, out) in dst.iter_mut().zip(outs.iter_mut()) {
        *d = Some(DisjointMut::new(out));
    }
    let total: usize = weights.iter().map(|w| w.shape().2).sum();
    // Each thread walks its own contiguous run of tiles (the next group is what its kernels
    // prefetch), a group at a time, and the last groups balance the threads.
    pool.parallel_segments(total, GROUP, |range| {
        // Map the global tile range onto each weight's own tiles.
        let mut first = 0;
        for (w, out) in weights.iter().zip(dst.iter().flatten()) {
            let t = w.shape().2;
            let (lo, hi) = (range.start.max(first), range.end.min(first + t));
            if lo < hi {
                run(w, lo - first..hi - first, out);
            }
            first += t;
        }
    });
    Ok(())
}

/// Tiles that stay in cache together while the activation rows pass them (and the unit of work
/// the pool balances).
const GROUP: usize = 4;

/// Walks `tiles` of a float weight ([`fpack`], tiled by 16 rows, `n` rows in all) against `m`
/// activation rows, storing into `out` (`[m, n]`). `kernel(tiles, rows, res)` fills
/// `res[j * rows.len() + i]` with tile `tiles.start + j` against activation row
/// `rows.start + i`, taking at most [`fpack::MAX_ROWS`] rows. With that many rows or fewer
/// (decode) one call covers a run of tiles; otherwise each group of four tiles stays in cache
/// while the rows pass it four at a time. (The int8 and bf16 products store straight from
/// their kernels: [`qdot::dot_rows`], [`bpack::dot_rows`].)
fn drive_tiles(
    n: usize,
    m: usize,
    tiles: Range<usize>,
    out: &DisjointMut<f32>,
    kernel: impl Fn(Range<usize>, Range<usize>, &mut [[f32; TILE]]),
) {
    /// Tiles per kernel call in decode; the result buffer stays small, as it is zeroed on
    /// every call.
    const CHUNK: usize = 8;
    const PER_CALL: usize = fpack::MAX_ROWS;
    let mut res = [[0f32; TILE]; CHUNK * PER_CALL];
    if m <= PER_CALL {
        let mut t = tiles.start;
        while t < tiles.end {
            let chunk = t..(t + CHUNK).min(tiles.end);
            let res = &mut res[..chunk.len() * m];
            kernel(chunk.clone(), 0..m, res);
            // SAFETY: these tiles' columns belong to this task.
            unsafe { store_results(res, n, chunk.clone(), 0..m, out) };
            t = chunk.end;
        }
        return;
    }
    // A few tiles at a time stay in cache while all rows pass them, four rows per call: one
    // call (and one build of its row views) per group of tiles, not per tile.
    let mut t = tiles.start;
    while t < tiles.end {
        let group = t..(t + GROUP).min(tiles.end);
        let mut i = 0;
        while i < m {
            let na = (m - i).min(PER_CALL);
            let res = &mut res[..group.len() * na];
            kernel(group.clone(), i..i + na, res);
            // SAFETY: these tiles' columns belong to this task.
            unsafe { store_results(res, n, group.clone(), i..i + na, out) };
            i += na;
        }
        t = group.end;
    }
}

multiversion! {
    /// Copies a kernel call's results (`res[j * rows.len() + i]`: tile `tiles.start + j`
    /// against row `rows.start + i`) into `out` (`[m, n]`), a whole tile as one 64-byte copy
    /// (one register store in the AVX-512 build; the baseline build took four).
    fn store_results_impl_mv(
        res: &[[f32; TILE]],
        n: usize,
        tiles: Range<usize>,
        rows: Range<usize>,
        out: &DisjointMut<f32>
    ) = store_results_impl;
}

/// [`store_results_impl_mv`].
///
/// # Safety
/// Columns `TILE * tiles.start .. TILE * tiles.end` (within `n`) of `rows` of `out` belong to
/// the caller's task alone.
unsafe fn store_results(
    res: &[[f32; TILE]],
    n: usize,
    tiles: Range<usize>,
    rows: Range<usize>,
    out: &DisjointMut<f32>,
) {
    store_results_impl_mv(res, n, tiles, rows, out)
}

#[inline(always)]
fn store_results_impl(
    res: &[[f32; TILE]],
    n: usize,
    tiles: Range<usize>,
    rows: Range<usize>,
    out: &DisjointMut<f32>,
) {
    let na = rows.len();
    for (j, tile) in tiles.enumerate() {
        let r0 = tile * TILE;
        let live = (n - r0).min(TILE);
        for (d, i) in rows.clone().enumerate() {
            let res = &res[j * na + d];
            // SAFETY: the caller of `store_results` owns these columns of these rows.
            let dst = unsafe { out.slice(i * n + r0, live) };
            match <&mut [f32; TILE]>::try_from(&mut *dst) {
                Ok(whole) => *whole = *res,
                Err(_) => dst.copy_from_slice(&res[..live]),
            }
        }
    }
}

/// Tiles `tiles` of `w` against every activation row, into `out` (`[m, n]`).
fn run_tiles(
    isa: Isa,
    acts: &Q8Acts,
    w: &PackedWeight,
    tiles: Range<usize>,
    out: &DisjointMut<f32>,
) {
    // SAFETY: these tiles' columns belong to this task (`over_tiles` splits the tiles), and
    // `isa` is the detected one.
    unsafe { qdot::dot_rows(isa, w, tiles, acts, 0..acts.rows(), GROUP, out) }
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with float weights in row tiles ([`fpack`]): f32
/// activations, tiles split over the pool, each tile staying in cache while the activation rows
/// pass it four at a time.
pub fn matmul_f(
    pool: &ThreadPool,
    isa: Isa,
    x: &[f32],
    w: &FloatPacked,
    out: &mut [f32],
) -> Result<()> {
    let (n, k) = (w.rows(), w.cols());
    if k == 0 || !x.len().is_multiple_of(k) || out.len() != x.len() / k * n {
        return Err(RuntimeError::Shape(format!(
            "matmul_f: [{n}, {k}] weights against {} activations into {} outputs",
            x.len(),
            out.len()
        )));
    }
    let m = x.len() / k;
    if m == 0 {
        return Ok(());
    }
    let out = DisjointMut::new(out);
    pool.parallel_ranges(w.tiles(), 1, |tiles| {
        drive_tiles(n, m, tiles, &out, |tiles, rows, res| {
            let xs: [&[f32]; fpack::MAX_ROWS] = std::array::from_fn(|d| {
                let r = (rows.start + d).min(rows.end - 1);
                &x[r * k..(r + 1) * k]
            });
            fpack::dot_tiles(isa, w, tiles, &xs[..rows.len()], res);
        });
    });
    Ok(())
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with `w` of shape `[n, k]` in any supported dtype.
pub fn matmul(pool: &ThreadPool, x: &[f32], w: &Tensor, out: &mut [f32]) -> Result<()> {
    let (n, k) = (w.rows(), w.cols());
    if k == 0 || !x.len().is_multiple_of(k) {
        return Err(RuntimeError::Shape(format!(
            "matmul: activations of {} values are not rows of {k}",
            x.len()
        )));
    }
    let m = x.len() / k;
    if out.len() != m * n {
        return Err(RuntimeError::Shape(format!(
            "matmul: output of {} values for [{m}, {n}]",
            out.len()
        )));
    }
    if m == 0 {
        return Ok(());
    }
    let out_shared = DisjointMut::new(out);
    pool.parallel_ranges(n, 4, |rows| {
        let mut wrow = vec![0f32; k];
        for r in rows {
            w.dequantize_row(r, &mut wrow);
            for (i, xrow) in x.chunks_exact(k).enumerate() {
                // SAFETY: element (i, r) belongs to the task owning weight row r alone.
                unsafe { out_shared.slice(i * n + r, 1)[0] = dot(xrow, &wrow) };
            }
        }
    });
    Ok(())
}

/// Adds `bias[n]` to every row of `out[m, n]`.
pub fn add_bias(out: &mut [f32], bias: &[f32]) {
    for row in out.chunks_exact_mut(bias.len()) {
        for (o, b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
}

/// Dot product with 16 independent partial sums (vectorizes; fixed summation order). Always
/// inlined, so callers built for wider vectors (RMSNorm's) get it in their width.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for j in 0..16 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    for w in [8, 4, 2, 1] {
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    acc[0] + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn matches_naive_product() {
        let pool = ThreadPool::new(2).unwrap();
        let (m, n, k) = (3, 37, 40);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let wv: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let w = Tensor::from_f32(vec![n, k], &wv).unwrap();
        let mut out = vec![0f32; m * n];
        matmul(&pool, &x, &w, &mut out).unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|t| x[i * k + t] as f64 * wv[j * k + t] as f64)
                    .sum();
                assert!((out[i * n + j] as f64 - want).abs() < 1e-4);
            }
        }
        assert_eq!(w.dtype(), DType::F32);
        assert!(matmul(&pool, &x[..5], &w, &mut out).is_err());
    }
}
