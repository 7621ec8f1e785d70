//! Activations.

/// `gate = silu(gate) * up`, elementwise (the SiLU-gated MLP's middle).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}
