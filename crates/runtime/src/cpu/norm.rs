//! RMSNorm: `y = w * x / sqrt(mean(x²) + eps)`, per row of `w.len()` elements.

use super::simd::multiversion;

multiversion! {
    /// Normalizes every row of `x` (rows of `w.len()` values) into `out`.
    pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) = rms_norm_impl;
}

multiversion! {
    /// Normalizes every row of `x` (rows of `w.len()` values) in place.
    pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) = rms_norm_in_place_impl;
}

#[inline(always)]
fn rms_norm_impl(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let dim = w.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ss: f32 = super::dot(xr, xr);
        let inv = 1.0 / (ss / dim as f32 + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = g * (v * inv);
        }
    }
}

#[inline(always)]
fn rms_norm_in_place_impl(x: &mut [f32], w: &[f32], eps: f32) {
    let dim = w.len();
    for xr in x.chunks_exact_mut(dim) {
        let inv = 1.0 / (super::dot(xr, xr) / dim as f32 + eps).sqrt();
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = g * (*v * inv);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn unit_rms_rows() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut y = [0f32; 4];
        super::rms_norm(&x, &[1.0, 2.0], 1e-6, &mut y);
        let r = (12.5f32 + 1e-6).sqrt();
        assert!((y[0] - 3.0 / r).abs() < 1e-6 && (y[1] - 8.0 / r).abs() < 1e-6);
        assert_eq!(&y[2..], &[0.0, 0.0]);
        let mut z = x;
        super::rms_norm_in_place(&mut z, &[1.0, 2.0], 1e-6);
        assert_eq!(z, y);
    }
}
