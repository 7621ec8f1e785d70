//! Matrix products against weights in any stored format.
//!
//! `out[m, n] = x[m, k] · w[n, k]ᵀ`. Work is split over weight rows; each task decodes one weight
//! row at a time into a scratch row and dots it with every activation row, so each weight byte is
//! read once per call whatever `m` is, and no matrix is ever expanded. Every output element is
//! one `dot` in a fixed order: results are identical for any batch composition or thread count.

use super::DisjointMut;
use crate::{Result, RuntimeError, Tensor, ThreadPool};

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with `w` of shape `[n, k]` in any supported dtype.
pub fn matmul(pool: &ThreadPool, x: &[f32], w: &Tensor, out: &mut [f32]) -> Result<()> {
    let (n, k) = (w.rows(), w.cols());
    if k == 0 || x.len() % k != 0 {
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
}
