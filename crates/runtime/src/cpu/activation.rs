//! Activations.

use super::simd::{self, multiversion};

multiversion! {
    /// `gate = silu(gate) * up`, elementwise (the SiLU-gated MLP's middle).
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) = silu_mul_impl;
}

#[inline(always)]
fn silu_mul_impl(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + simd::exp(-*g)) * u;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn silu_matches_its_definition() {
        let mut g: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) * 0.3).collect();
        let want: Vec<f64> = g
            .iter()
            .map(|&x| x as f64 / (1.0 + (-x as f64).exp()) * 2.0)
            .collect();
        super::silu_mul(&mut g, &[2.0; 100]);
        for (a, b) in g.iter().zip(&want) {
            assert!(
                (*a as f64 - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{a} vs {b}"
            );
        }
    }
}
