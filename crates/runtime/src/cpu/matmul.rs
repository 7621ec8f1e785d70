//! Matrix products against weights in any stored format.
//!
//! `out[m, n] = x[m, k] · w[n, k]ᵀ`. Work is split over weight rows; each task decodes one weight
//! row at a time into a scratch row and dots it with every activation row, so each weight byte is
//! read once per call whatever `m` is, and no matrix is ever expanded. Every output element is
//! one `dot` in a fixed order: results are identical for any batch composition or thread count.

use super::qdot::{self, Isa, Q8Acts};
use super::DisjointMut;
use crate::{Result, RuntimeError, Tensor, ThreadPool};

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

/// Runs linear layers with a chosen precision and instruction set. Weights without an
/// integer kernel (f32, f16, bf16, K-quants) always take the float path.
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
    /// when the int8 path applies to at least one of them (never for f32/f16/bf16 weights).
    pub fn prepare<'a>(
        &self,
        x: &'a [f32],
        k: usize,
        q: &'a mut Q8Acts,
        weights: &[&Tensor],
    ) -> LinearInput<'a> {
        let int8 = self.precision == MatmulPrecision::Int8
            && k > 0
            && k.is_multiple_of(qdot::QK)
            && x.len().is_multiple_of(k)
            && !x.is_empty()
            && weights.iter().any(|w| qdot::supports(w.dtype()));
        if int8 {
            q.quantize(x, k);
            LinearInput { x, q: Some(q) }
        } else {
            LinearInput { x, q: None }
        }
    }

    /// `out[m, n] = input[m, k] · w[n, k]ᵀ`.
    pub fn matmul(
        &self,
        pool: &ThreadPool,
        input: &LinearInput<'_>,
        w: &Tensor,
        out: &mut [f32],
    ) -> Result<()> {
        match input.q {
            Some(q) if qdot::supports(w.dtype()) && q.cols() == w.cols() => {
                matmul_q8(pool, self.isa, q, w, out)
            }
            _ => matmul(pool, input.x, w, out),
        }
    }
}

/// `out[m, n] = acts[m, k] · w[n, k]ᵀ` with integer block dot products; `w` must be one of
/// the types [`qdot::supports`]. Each weight row is read once for all `m` rows.
pub fn matmul_q8(
    pool: &ThreadPool,
    isa: Isa,
    acts: &Q8Acts,
    w: &Tensor,
    out: &mut [f32],
) -> Result<()> {
    let (n, k, m) = (w.rows(), w.cols(), acts.rows());
    if !qdot::supports(w.dtype()) || acts.cols() != k {
        return Err(RuntimeError::Shape(format!(
            "matmul_q8: {} weights [{n}, {k}] against quantized rows of {}",
            w.dtype(),
            acts.cols()
        )));
    }
    if out.len() != m * n {
        return Err(RuntimeError::Shape(format!(
            "matmul_q8: output of {} values for [{m}, {n}]",
            out.len()
        )));
    }
    let dtype = w.dtype();
    let out_shared = DisjointMut::new(out);
    // Tiles of weight rows stay in L1 while every activation row passes them once.
    const TILE: usize = 8;
    pool.parallel_ranges(n, 16, |rows| {
        let mut start = rows.start;
        while start < rows.end {
            let tile = start..(start + TILE).min(rows.end);
            let mut i = 0;
            // Four activation rows per weight block decode; identical results to one by one.
            while i + 4 <= m {
                let a = [
                    acts.row(i),
                    acts.row(i + 1),
                    acts.row(i + 2),
                    acts.row(i + 3),
                ];
                for r in tile.clone() {
                    let v = qdot::dot_rows4(isa, dtype, w.row(r), &a);
                    for (j, v) in v.into_iter().enumerate() {
                        // SAFETY: element (i + j, r) belongs to the task owning weight row r.
                        unsafe { out_shared.slice((i + j) * n + r, 1)[0] = v };
                    }
                }
                i += 4;
            }
            for i in i..m {
                let a = acts.row(i);
                for r in tile.clone() {
                    let v = qdot::dot_row(isa, dtype, w.row(r), a);
                    // SAFETY: element (i, r) belongs to the task owning weight row r alone.
                    unsafe { out_shared.slice(i * n + r, 1)[0] = v };
                }
            }
            start = tile.end;
        }
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
        let input = int8.prepare(&x, k, &mut q, &[&w]);
        int8.matmul(&pool, &input, &w, &mut fast).unwrap();
        matmul(&pool, &x, &w, &mut reference).unwrap();
        for (a, b) in fast.iter().zip(&reference) {
            assert!((a - b).abs() < 0.02 * k as f32 * 0.05 + 1e-3, "{a} vs {b}");
        }
        // Row 3 alone gives the same bits as inside the batch.
        let mut alone = vec![0f32; n];
        let mut q1 = Q8Acts::default();
        let input = int8.prepare(&x[3 * k..4 * k], k, &mut q1, &[&w]);
        int8.matmul(&pool, &input, &w, &mut alone).unwrap();
        assert_eq!(alone, fast[3 * n..4 * n]);
        // The float setting never quantizes.
        let float = Linear::new(MatmulPrecision::Float);
        let mut q2 = Q8Acts::default();
        let input = float.prepare(&x, k, &mut q2, &[&w]);
        float.matmul(&pool, &input, &w, &mut fast).unwrap();
        assert_eq!(fast, reference);
    }
}
