//! Rotary position embedding in the "rotate half" (GPT-NeoX / Hugging Face) layout: dimension
//! `i` of a head is paired with `i + head_dim/2`.
//!
//! Frequencies follow transformers' f32 arithmetic (`inv_freq = 1 / theta^(2i/d)`, angle =
//! `position * inv_freq` in f32), so angles agree with the reference bit for bit at small
//! positions. Scaling variants adjust `inv_freq` once at construction.
//!
//! transformers keeps `inv_freq` in the dtype the model is loaded in, so a checkpoint stored in
//! bf16 or f16 runs with frequencies rounded to that type (and the rounding moves logits by about
//! 1e-4). [`Rope::new`] takes that dtype to reproduce the reference numerics exactly.

use crate::DType;

/// How rotary frequencies are scaled for long context.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (equivalently, frequencies).
    Linear { factor: f32 },
    /// Llama 3.1's piecewise frequency scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: f32,
    },
}

/// Precomputed inverse frequencies for one head size.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// Frequencies for heads of `head_dim` (even), base `theta`, and `scaling`. `freq_factors`
    /// (one per pair, as GGUF's `rope_freqs` tensor stores them) divide the frequencies.
    /// `table_dtype` (F16 or BF16) rounds the final frequencies to that type.
    pub fn new(
        head_dim: usize,
        theta: f32,
        scaling: &RopeScaling,
        freq_factors: Option<&[f32]>,
        table_dtype: Option<DType>,
    ) -> Rope {
        let half = head_dim / 2;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        match *scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_len,
            } => {
                let low_wavelen = old_len / low_freq_factor;
                let high_wavelen = old_len / high_freq_factor;
                for f in &mut inv_freq {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (old_len / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        if let Some(ff) = freq_factors {
            for (f, d) in inv_freq.iter_mut().zip(ff) {
                *f /= d;
            }
        }
        match table_dtype {
            Some(DType::BF16) => inv_freq
                .iter_mut()
                .for_each(|f| *f = half::bf16::from_f32(*f).to_f32()),
            Some(DType::F16) => inv_freq
                .iter_mut()
                .for_each(|f| *f = half::f16::from_f32(*f).to_f32()),
            _ => {}
        }
        Rope { inv_freq }
    }

    /// Head size these frequencies are for.
    /// The inverse frequency of each dimension pair, as the angles use them (a GPU backend
    /// uploads them once and computes the angles in its kernel the same way).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    pub fn head_dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// Rotates `x` (`[num_tokens, num_heads * head_dim]`) in place; token `t` is at
    /// `positions[t]`.
    pub fn apply(&self, x: &mut [f32], positions: &[u32]) {
        let mut table = Vec::new();
        self.angles(positions, &mut table);
        self.apply_with(x, &table);
    }

    /// Fills `table` (`[num_tokens, head_dim/2, 2]`) with the cosine and sine of every token's
    /// angles, once per forward pass for all layers and both q and k.
    pub fn angles(&self, positions: &[u32], table: &mut Vec<f32>) {
        table.clear();
        for &pos in positions {
            for &f in &self.inv_freq {
                let (sin, cos) = (pos as f32 * f).sin_cos();
                table.extend_from_slice(&[cos, sin]);
            }
        }
    }

    /// [`Rope::apply`] with angles from [`Rope::angles`] (same results).
    pub fn apply_with(&self, x: &mut [f32], table: &[f32]) {
        rotate(x, table, self.head_dim());
    }
}

super::simd::multiversion! {
    /// Rotates every head (`hd` values) of every token row of `x` by its token's angles
    /// (`table`: `[num_tokens, hd / 2, 2]`, cosine then sine).
    fn rotate(x: &mut [f32], table: &[f32], hd: usize) = rotate_impl;
}

#[inline(always)]
fn rotate_impl(x: &mut [f32], table: &[f32], hd: usize) {
    let half = hd / 2;
    let num_tokens = table.len() / hd;
    let row = x.len() / num_tokens.max(1);
    for (xr, cs) in x.chunks_exact_mut(row).zip(table.chunks_exact(hd)) {
        for head in xr.chunks_exact_mut(hd) {
            let (lo, hi) = head.split_at_mut(half);
            for ((a, b), c) in lo.iter_mut().zip(hi.iter_mut()).zip(cs.chunks_exact(2)) {
                let (x0, x1) = (*a, *b);
                *a = x0 * c[0] - x1 * c[1];
                *b = x1 * c[0] + x0 * c[1];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let rope = Rope::new(8, 10000.0, &RopeScaling::None, None, None);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 - 3.0).collect();
        let mut x = orig.clone();
        rope.apply(&mut x, &[0, 5]);
        assert_eq!(&x[..8], &orig[..8]);
        let n0: f32 = orig[8..].iter().map(|v| v * v).sum();
        let n1: f32 = x[8..].iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let base = Rope::new(16, 500000.0, &RopeScaling::None, None, None);
        let scaled = Rope::new(16, 500000.0, &s, None, None);
        assert_eq!(scaled.inv_freq[0], base.inv_freq[0]);
        assert_eq!(scaled.inv_freq[7], base.inv_freq[7] / 8.0);
    }
}
