//! The online softmax of one (token, head) pair: its running state over the keys seen so far,
//! the fold of two parts' states (in order), and the final normalization.

use super::LANES;
use crate::cpu::simd;

/// The online-softmax state of one pair over some keys: the running maximum of the scores
/// and the denominator lanes (the weighted values live beside it, unnormalized).
#[derive(Debug, Clone, Copy)]
pub(super) struct SoftmaxState {
    pub(super) max: f32,
    pub(super) denom: [f32; LANES],
}

impl SoftmaxState {
    pub(super) const EMPTY: SoftmaxState = SoftmaxState {
        max: f32::NEG_INFINITY,
        denom: [0.0; LANES],
    };
}

/// Folds part `(ps, pacc)` into the running `(rs, racc)`, parts in order: both rescaled to the
/// larger maximum. A part without visible keys changes nothing; into an empty running state a
/// part is copied.
pub(super) fn fold(rs: &mut SoftmaxState, racc: &mut [f32], ps: &SoftmaxState, pacc: &[f32]) {
    if ps.max == f32::NEG_INFINITY {
        return;
    }
    if rs.max == f32::NEG_INFINITY {
        *rs = *ps;
        racc.copy_from_slice(pacc);
        return;
    }
    let m = rs.max.max(ps.max);
    let (c1, c2) = (simd::exp(rs.max - m), simd::exp(ps.max - m));
    for (r, p) in rs.denom.iter_mut().zip(&ps.denom) {
        *r = *r * c1 + *p * c2;
    }
    for (r, p) in racc.iter_mut().zip(pacc) {
        *r = *r * c1 + *p * c2;
    }
    rs.max = m;
}

/// Writes `acc / denominator` into `out`.
pub(super) fn normalize(st: &SoftmaxState, acc: &[f32], out: &mut [f32]) {
    let d = &st.denom;
    let r8: [f32; 8] = std::array::from_fn(|i| d[i] + d[i + 8]);
    let r4: [f32; 4] = std::array::from_fn(|i| r8[i] + r8[i + 4]);
    let denom = (r4[0] + r4[2]) + (r4[1] + r4[3]);
    let inv = if denom > 0.0 { 1.0 / denom } else { 0.0 };
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a * inv;
    }
}
