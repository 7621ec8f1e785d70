//! Activations.

use super::simd::{self, multiversion};

/// The activation of a gated MLP's gate: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GatedAct {
    /// SiLU (Llama, Qwen, Mistral, Phi-3, the MoE families).
    #[default]
    Silu,
    /// GELU in its tanh approximation, `gelu_pytorch_tanh` (Gemma).
    GeluTanh,
}

/// `gate = act(gate) * up`, elementwise.
pub fn gated_mul(act: GatedAct, gate: &mut [f32], up: &[f32]) {
    match act {
        GatedAct::Silu => silu_mul(gate, up),
        GatedAct::GeluTanh => gelu_tanh_mul(gate, up),
    }
}

multiversion! {
    /// `gate = gelu_tanh(gate) * up`: `0.5 x (1 + tanh(u))` with
    /// `u = sqrt(2/pi) (x + 0.044715 x^3)`, computed as `x / (1 + exp(-2u))` (the same value:
    /// `0.5 (1 + tanh(u)) = sigmoid(2u)`) with the vectorized `exp` SiLU uses.
    pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) = gelu_tanh_mul_impl;
}

#[inline(always)]
fn gelu_tanh_mul_impl(gate: &mut [f32], up: &[f32]) {
    const C2: f32 = 2.0 * 0.797_884_6; // 2 sqrt(2/pi)
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let two_u = C2 * (x + 0.044715 * x * x * x);
        *g = x / (1.0 + simd::exp(-two_u)) * u;
    }
}

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
    fn gelu_tanh_matches_its_definition() {
        let mut g: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) * 0.2).collect();
        let want: Vec<f64> = g
            .iter()
            .map(|&x| {
                let x = x as f64;
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh()) * 3.0
            })
            .collect();
        super::gelu_tanh_mul(&mut g, &[3.0; 100]);
        for (a, b) in g.iter().zip(&want) {
            assert!(
                (*a as f64 - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{a} vs {b}"
            );
        }
    }

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
