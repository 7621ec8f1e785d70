//! Rotary position embedding in the "rotate half" (GPT-NeoX / Hugging Face) layout: dimension
//! `i` of a head is paired with `i + head_dim/2`.
//!
//! Frequencies follow transformers' f32 arithmetic (`inv_freq = 1 / theta^(2i/d)`, angle =
//! `position * inv_freq` in f32), so angles agree with the reference bit for bit at small
//! positions. Scaling variants adjust `inv_freq` once at construction.
//!
//! Partial rotary (Phi-3's `partial_rotary_factor`) rotates the first `rotary_dim` elements of a
//! head (pairs `i` and `i + rotary_dim/2`) and leaves the rest. LongRoPE (Phi-3's `longrope`)
//! keeps two frequency sets, short and long, and multiplies cosine and sine by an attention
//! factor; transformers picks the set per forward pass from its largest position, Ferrum per
//! token from `max(prompt_len, position + 1)` (see `ferrum_types::SeqSlice::prompt_len`),
//! which is the same for a whole prompt and for every decode step, and independent of
//! chunking and batch mates.
//!
//! transformers keeps `inv_freq` in the dtype the model is loaded in, so a checkpoint stored in
//! bf16 or f16 runs with frequencies rounded to that type (and the rounding moves logits by about
//! 1e-4). [`Rope::new`] takes that dtype to reproduce the reference numerics exactly.

use crate::DType;
use ferrum_types::ForwardBatch;

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
    /// LongRoPE (Phi-3): per-pair divisors of the frequencies, one set within the original
    /// context and one beyond it, and a factor on cosine and sine.
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        attention_factor: f32,
    },
}

/// Precomputed inverse frequencies for one head size.
#[derive(Debug, Clone)]
pub struct Rope {
    /// One per rotated pair (`rotary_dim / 2`): the only set, or LongRoPE's short one.
    inv_freq: Vec<f32>,
    /// LongRoPE's long set and the original context past which it applies.
    long: Option<(Vec<f32>, usize)>,
    head_dim: usize,
    /// Factor on cosine and sine (LongRoPE's attention factor; 1 otherwise).
    mscale: f32,
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
        Rope::partial(
            head_dim,
            head_dim,
            theta,
            scaling,
            freq_factors,
            table_dtype,
        )
    }

    /// [`Rope::new`] rotating only the first `rotary_dim` (even, at most `head_dim`) elements
    /// of each head. LongRoPE's factor lists must hold `rotary_dim / 2` values (the config
    /// checks it); missing ones count as 1.
    pub fn partial(
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
        scaling: &RopeScaling,
        freq_factors: Option<&[f32]>,
        table_dtype: Option<DType>,
    ) -> Rope {
        let rotary_dim = rotary_dim.min(head_dim) & !1;
        let half = rotary_dim / 2;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary_dim as f32))
            .collect();
        let mut long = None;
        let mut mscale = 1.0;
        match scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor,
            } => {
                // transformers: 1 / (factor_i * theta^(2i/d)), in f32.
                let divide = |factors: &[f32]| -> Vec<f32> {
                    (0..half)
                        .map(|i| {
                            let denom = factors.get(i).copied().unwrap_or(1.0)
                                * theta.powf((2 * i) as f32 / rotary_dim as f32);
                            1.0 / denom
                        })
                        .collect()
                };
                inv_freq = divide(short_factor);
                long = Some((divide(long_factor), *original_max_position_embeddings));
                mscale = *attention_factor;
            }
            &RopeScaling::Llama3 {
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
        let round = |v: &mut Vec<f32>| match table_dtype {
            Some(DType::BF16) => v
                .iter_mut()
                .for_each(|f| *f = half::bf16::from_f32(*f).to_f32()),
            Some(DType::F16) => v
                .iter_mut()
                .for_each(|f| *f = half::f16::from_f32(*f).to_f32()),
            _ => {}
        };
        round(&mut inv_freq);
        if let Some((l, _)) = long.as_mut() {
            round(l);
        }
        Rope {
            inv_freq,
            long,
            head_dim,
            mscale,
        }
    }

    /// The inverse frequency of each rotated pair, as the angles use them (a GPU backend
    /// uploads them once and computes the angles in its kernel the same way); LongRoPE's short
    /// set.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// LongRoPE's long set and the original context past which it applies.
    pub fn long_inv_freq(&self) -> Option<(&[f32], usize)> {
        self.long.as_ref().map(|(f, n)| (f.as_slice(), *n))
    }

    /// Whether the token at `pos` of a sequence whose prompt has `prompt_len` tokens takes the
    /// long frequencies (LongRoPE past the original context; never otherwise).
    pub fn uses_long(&self, prompt_len: usize, pos: usize) -> bool {
        self.long
            .as_ref()
            .is_some_and(|&(_, orig)| prompt_len.max(pos + 1) > orig)
    }

    /// Factor on cosine and sine (1 but for LongRoPE).
    pub fn mscale(&self) -> f32 {
        self.mscale
    }

    /// Head size these frequencies are for.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rotated elements at the start of each head.
    pub fn rotary_dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// Rotates `x` (`[num_tokens, num_heads * head_dim]`) in place; token `t` is at
    /// `positions[t]`.
    pub fn apply(&self, x: &mut [f32], positions: &[u32]) {
        let mut table = Vec::new();
        self.angles(positions, &mut table);
        self.apply_with(x, &table);
    }

    /// Fills `table` (`[num_tokens, rotary_dim/2, 2]`) with the cosine and sine of every
    /// token's angles (times the attention factor), once per forward pass for all layers and
    /// both q and k. Every token counts as its own prompt (see [`Rope::angles_for`]).
    pub fn angles(&self, positions: &[u32], table: &mut Vec<f32>) {
        table.clear();
        for &pos in positions {
            self.push_angles(pos, pos as usize + 1, table);
        }
    }

    /// [`Rope::angles`] for every token of `batch`, LongRoPE's set picked per token from its
    /// sequence's prompt length and its position.
    pub fn angles_for(&self, batch: &ForwardBatch, table: &mut Vec<f32>) {
        table.clear();
        for s in &batch.seqs {
            let positions = batch
                .positions
                .get(s.query_start..s.query_start + s.query_len)
                .unwrap_or(&[]);
            for &pos in positions {
                self.push_angles(pos, s.prompt_len, table);
            }
        }
    }

    fn push_angles(&self, pos: u32, prompt_len: usize, table: &mut Vec<f32>) {
        let freqs = match &self.long {
            Some((long, _)) if self.uses_long(prompt_len, pos as usize) => long,
            _ => &self.inv_freq,
        };
        for &f in freqs {
            let (sin, cos) = (pos as f32 * f).sin_cos();
            table.extend_from_slice(&[cos * self.mscale, sin * self.mscale]);
        }
    }

    /// [`Rope::apply`] with angles from [`Rope::angles`] (same results).
    pub fn apply_with(&self, x: &mut [f32], table: &[f32]) {
        rotate(x, table, self.head_dim, self.rotary_dim());
    }
}

super::simd::multiversion! {
    /// Rotates the first `rot` values of every head (`hd` values) of every token row of `x`
    /// by its token's angles (`table`: `[num_tokens, rot / 2, 2]`, cosine then sine).
    fn rotate(x: &mut [f32], table: &[f32], hd: usize, rot: usize) = rotate_impl;
}

#[inline(always)]
fn rotate_impl(x: &mut [f32], table: &[f32], hd: usize, rot: usize) {
    let half = rot / 2;
    if half == 0 {
        return;
    }
    let num_tokens = table.len() / rot;
    let row = x.len() / num_tokens.max(1);
    for (xr, cs) in x.chunks_exact_mut(row).zip(table.chunks_exact(rot)) {
        for head in xr.chunks_exact_mut(hd) {
            let (lo, hi) = head[..rot].split_at_mut(half);
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
    fn partial_longrope_rotates_the_first_dims_by_the_chosen_set() {
        let s = RopeScaling::LongRope {
            short_factor: vec![1.0, 2.0, 4.0],
            long_factor: vec![3.0, 5.0, 7.0],
            original_max_position_embeddings: 8,
            attention_factor: 1.5,
        };
        // Head of 8, the first 6 rotated: i pairs with i + 3; 6 and 7 pass through.
        let rope = Rope::partial(8, 6, 100.0, &s, None, None);
        assert_eq!((rope.head_dim(), rope.rotary_dim()), (8, 6));
        let x0: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        for (prompt_len, pos, long) in [(4, 3, false), (4, 8, true), (20, 2, true)] {
            assert_eq!(rope.uses_long(prompt_len, pos), long);
            let mut x = x0.clone();
            let mut table = Vec::new();
            rope.push_angles(pos as u32, prompt_len, &mut table);
            rope.apply_with(&mut x, &table);
            let factors = if long {
                [3.0, 5.0, 7.0]
            } else {
                [1.0, 2.0, 4.0]
            };
            for i in 0..3 {
                let f = 1.0 / (factors[i] * 100f32.powf(2.0 * i as f32 / 6.0));
                let (sn, cs) = (pos as f32 * f).sin_cos();
                let a = (x0[i] * cs - x0[i + 3] * sn) * 1.5;
                let b = (x0[i + 3] * cs + x0[i] * sn) * 1.5;
                assert!((x[i] - a).abs() < 1e-5 && (x[i + 3] - b).abs() < 1e-5);
            }
            assert_eq!(&x[6..], &x0[6..]);
        }
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
