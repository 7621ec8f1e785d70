//! Matrix products against weights in any stored format.
//!
//! Two paths: [`matmul`] decodes weight rows to f32 (the reference, and the path of float
//! weights), [`matmul_q8`] runs integer dot products over weights repacked at load.
//!
//! `out[m, n] = x[m, k] · w[n, k]ᵀ`. Work is split over weight rows; each task decodes one weight
//! row at a time into a scratch row and dots it with every activation row, so each weight byte is
//! read once per call whatever `m` is, and no matrix is ever expanded. Every output element is
//! one `dot` in a fixed order: results are identical for any batch composition or thread count.

use super::fpack::{self, FloatPacked};
use super::qdot::{self, ActRow, Isa, Q8Acts};
use super::qpack::PackedWeight;
use super::DisjointMut;
use crate::{DType, Result, RuntimeError, Tensor, ThreadPool};
use std::ops::Range;

/// Weight rows per tile of the tiled kernels.
const TILE: usize = qdot::TILE_ROWS;

/// How products with block-quantized weights treat the activations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// Activations quantized to 8 bits per block of 32, integer dot products (llama.cpp's
    /// arithmetic): the fast default.
    #[default]
    Int8,
    /// Weights decoded to f32 and multiplied with f32 activations: the reference path.
    Float,
}

/// A linear layer's weight `[n, k]`: the stored tensor and, for block-quantized formats on
/// the int8 path, its repacked form (built once at load).
#[derive(Debug, Clone)]
pub struct Weight {
    tensor: Tensor,
    packed: Option<PackedWeight>,
    /// Float weights in row tiles for the fast float kernel (int8 setting only).
    fpacked: Option<FloatPacked>,
}

impl Weight {
    /// Wraps `tensor`, repacking it when `linear` takes the int8 path for its format.
    pub fn new(tensor: Tensor, linear: &Linear, pool: &ThreadPool) -> Result<Weight> {
        let packed = if linear.precision == MatmulPrecision::Int8
            && qdot::supports(tensor.dtype())
            && tensor.cols() > 0
        {
            Some(PackedWeight::pack(&tensor, pool)?)
        } else {
            None
        };
        let fpacked = if linear.precision == MatmulPrecision::Int8
            && matches!(tensor.dtype(), DType::F32 | DType::F16 | DType::BF16)
            && tensor.cols() > 0
        {
            Some(FloatPacked::pack(&tensor, pool)?)
        } else {
            None
        };
        Ok(Weight {
            tensor,
            packed,
            fpacked,
        })
    }

    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    pub fn packed(&self) -> Option<&PackedWeight> {
        self.packed.as_ref()
    }

    pub fn rows(&self) -> usize {
        self.tensor.rows()
    }

    pub fn cols(&self) -> usize {
        self.tensor.cols()
    }

    /// Bytes the kernels read: the repacked form when there is one.
    pub fn num_bytes(&self) -> usize {
        match (&self.packed, &self.fpacked) {
            (Some(p), _) => p.num_bytes(),
            (_, Some(f)) => f.num_bytes(),
            _ => self.tensor.num_bytes(),
        }
    }
}

/// Runs linear layers with a chosen precision and instruction set. Weights without an
/// integer kernel (f32, f16, bf16) always take the float path.
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    pub precision: MatmulPrecision,
    pub isa: Isa,
}

/// One linear layer input: the f32 rows and, on the int8 path, their quantized form.
#[derive(Debug, Clone, Copy)]
pub struct LinearInput<'a> {
    x: &'a [f32],
    q: Option<&'a Q8Acts>,
}

impl Linear {
    pub fn new(precision: MatmulPrecision) -> Linear {
        Linear {
            precision,
            isa: Isa::detect(),
        }
    }

    /// Prepares `x` (`[m, k]`) for its products with `weights`: quantizes it once into `q`
    /// (rows split over `pool`) when at least one of them was repacked for the int8 path.
    pub fn prepare<'a>(
        &self,
        pool: &ThreadPool,
        x: &'a [f32],
        k: usize,
        q: &'a mut Q8Acts,
        weights: &[&Weight],
    ) -> LinearInput<'a> {
        let int8 = k > 0
            && k.is_multiple_of(qdot::QK)
            && x.len().is_multiple_of(k)
            && !x.is_empty()
            && weights.iter().any(|w| w.packed.is_some() && w.cols() == k);
        if int8 {
            q.quantize_par(x, k, pool);
            LinearInput { x, q: Some(q) }
        } else {
            LinearInput { x, q: None }
        }
    }

    /// `out_i[m, n_i] = input[m, k] · w_i[n_i, k]ᵀ` for every `(w_i, out_i)`: one parallel call
    /// over all their rows when they all take the int8 path, else one product at a time.
    pub fn matmul_many(
        &self,
        pool: &ThreadPool,
        input: &LinearInput<'_>,
        products: &mut [(&Weight, &mut [f32])],
    ) -> Result<()> {
        let all_packed = |q: &Q8Acts| {
            products.len() <= MAX_PRODUCTS
                && products
                    .iter()
                    .all(|(w, _)| w.packed.as_ref().is_some_and(|p| p.cols() == q.cols()))
        };
        match (input.q, products.first()) {
            (Some(q), Some((first, _))) if all_packed(q) => {
                let Some(filler) = first.packed.as_ref() else {
                    return Ok(());
                };
                let mut ws = [filler; MAX_PRODUCTS];
                let mut outs: [&mut [f32]; MAX_PRODUCTS] = Default::default();
                for (i, (w, out)) in products.iter_mut().enumerate() {
                    ws[i] = w.packed.as_ref().unwrap_or(filler);
                    outs[i] = std::mem::take(out);
                }
                let n = products.len();
                return matmul_q8_many(pool, self.isa, q, &ws[..n], &mut outs[..n]);
            }
            _ => {}
        }
        for (w, out) in products.iter_mut() {
            self.matmul(pool, input, w, out)?;
        }
        Ok(())
    }

    /// `out[m, n] = input[m, k] · w[n, k]ᵀ`.
    pub fn matmul(
        &self,
        pool: &ThreadPool,
        input: &LinearInput<'_>,
        w: &Weight,
        out: &mut [f32],
    ) -> Result<()> {
        match (input.q, &w.packed, &w.fpacked) {
            (Some(q), Some(p), _) if q.cols() == p.cols() => matmul_q8(pool, self.isa, q, p, out),
            (_, _, Some(f)) => matmul_f(pool, self.isa, input.x, f, out),
            _ => matmul(pool, input.x, &w.tensor, out),
        }
    }
}

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
    let (k, m) = (acts.cols(), acts.rows());
    if weights.len() != outs.len() || weights.len() > MAX_PRODUCTS {
        return Err(RuntimeError::Shape(format!(
            "matmul_q8: {} weights for {} outputs (at most {MAX_PRODUCTS})",
            weights.len(),
            outs.len()
        )));
    }
    for (w, out) in weights.iter().zip(outs.iter()) {
        let n = w.rows();
        if w.cols() != k {
            return Err(RuntimeError::Shape(format!(
                "matmul_q8: {} weights [{n}, {}] against quantized rows of {k}",
                w.dtype(),
                w.cols()
            )));
        }
        if out.len() != m * n {
            return Err(RuntimeError::Shape(format!(
                "matmul_q8: output of {} values for [{m}, {n}]",
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
    let total: usize = weights.iter().map(|w| w.tiles()).sum();
    pool.parallel_ranges(total, 1, |range| {
        // Map the global tile range onto each weight's own tiles.
        let mut first = 0;
        for (w, out) in weights.iter().zip(dst.iter().flatten()) {
            let t = w.tiles();
            let (lo, hi) = (range.start.max(first), range.end.min(first + t));
            if lo < hi {
                run_tiles(isa, acts, w, lo - first..hi - first, out);
            }
            first += t;
        }
    });
    Ok(())
}

/// Activation rows one call of either tiled kernel takes.
const MAX_ROWS: usize = if qdot::MAX_ACT_ROWS < fpack::MAX_ROWS {
    qdot::MAX_ACT_ROWS
} else {
    fpack::MAX_ROWS
};

/// Walks `tiles` of a weight tiled by 16 rows (`n` rows in all) against `m` activation rows,
/// storing into `out` (`[m, n]`). `kernel(tiles, rows, res)` fills `res[j * rows.len() + i]`
/// with tile `tiles.start + j` against activation row `rows.start + i`. With at most
/// [`MAX_ROWS`] rows (decode) one call covers a run of tiles; otherwise each tile stays in L1
/// while the rows pass it [`MAX_ROWS`] at a time.
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
    let mut res = [[0f32; TILE]; CHUNK * MAX_ROWS];
    let store = |res: &[f32; TILE], tile: usize, i: usize| {
        let r0 = tile * TILE;
        let live = (n - r0).min(TILE);
        // SAFETY: columns r0..r0 + live belong to the task owning this tile.
        unsafe { out.slice(i * n + r0, live) }.copy_from_slice(&res[..live]);
    };
    if m <= MAX_ROWS {
        let mut t = tiles.start;
        while t < tiles.end {
            let chunk = t..(t + CHUNK).min(tiles.end);
            let res = &mut res[..chunk.len() * m];
            kernel(chunk.clone(), 0..m, res);
            for (j, tile) in chunk.clone().enumerate() {
                for i in 0..m {
                    store(&res[j * m + i], tile, i);
                }
            }
            t = chunk.end;
        }
        return;
    }
    for tile in tiles {
        let mut i = 0;
        while i < m {
            let na = (m - i).min(MAX_ROWS);
            kernel(tile..tile + 1, i..i + na, &mut res[..na]);
            for (d, r) in res[..na].iter().enumerate() {
                store(r, tile, i + d);
            }
            i += na;
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
    drive_tiles(w.rows(), acts.rows(), tiles, out, |tiles, rows, res| {
        let a: [ActRow<'_>; MAX_ROWS] =
            std::array::from_fn(|d| acts.row((rows.start + d).min(rows.end - 1)));
        qdot::dot_tiles(isa, w, tiles, &a[..rows.len()], res);
    });
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
            let xs: [&[f32]; MAX_ROWS] = std::array::from_fn(|d| {
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

/// Dot product with 16 independent partial sums (vectorizes; fixed summation order).
#[inline]
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

    /// Q8_0 weights built from `wv` (per block: scale max|w|/127, codes rounded).
    fn q8_0(n: usize, k: usize, wv: &[f32]) -> Tensor {
        let mut bytes = Vec::new();
        for blk in wv.chunks_exact(32) {
            let d = blk.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            bytes.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
            let d = half::f16::from_f32(d).to_f32();
            bytes.extend(blk.iter().map(|v| ((v / d).round() as i8) as u8));
        }
        Tensor::new(DType::Q8_0, vec![n, k], crate::Storage::owned(bytes)).unwrap()
    }

    #[test]
    fn int8_path_is_close_to_float_and_batch_invariant() {
        let pool = ThreadPool::new(2).unwrap();
        let (m, n, k) = (5, 70, 96);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let wv: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let w = q8_0(n, k, &wv);
        let (mut fast, mut reference) = (vec![0f32; m * n], vec![0f32; m * n]);
        let int8 = Linear::new(MatmulPrecision::Int8);
        let mut q = Q8Acts::default();
        let wi = Weight::new(w.clone(), &int8, &pool).unwrap();
        assert!(wi.packed().is_some());
        let input = int8.prepare(&pool, &x, k, &mut q, &[&wi]);
        int8.matmul(&pool, &input, &wi, &mut fast).unwrap();
        matmul(&pool, &x, &w, &mut reference).unwrap();
        for (a, b) in fast.iter().zip(&reference) {
            assert!((a - b).abs() < 0.02 * k as f32 * 0.05 + 1e-3, "{a} vs {b}");
        }
        // Row 3 alone gives the same bits as inside the batch.
        let mut alone = vec![0f32; n];
        let mut q1 = Q8Acts::default();
        let input = int8.prepare(&pool, &x[3 * k..4 * k], k, &mut q1, &[&wi]);
        int8.matmul(&pool, &input, &wi, &mut alone).unwrap();
        assert_eq!(alone, fast[3 * n..4 * n]);
        // The float setting never quantizes.
        let float = Linear::new(MatmulPrecision::Float);
        let mut q2 = Q8Acts::default();
        let wf = Weight::new(w, &float, &pool).unwrap();
        assert!(wf.packed().is_none());
        let input = float.prepare(&pool, &x, k, &mut q2, &[&wf]);
        float.matmul(&pool, &input, &wf, &mut fast).unwrap();
        assert_eq!(fast, reference);
    }
}
