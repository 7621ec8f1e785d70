//! One run of (token, head) pairs against one KV block: scores, the online-softmax step and
//! the weighted values, in a generic form and unrolled per instruction set and head size.

use super::prefetch::{prefetch, prefetch_l2};
use super::softmax::SoftmaxState;
use super::{LANES, MAX_BLOCK_SIZE};
use crate::cpu::kv_dtype::sealed::{Isa, Widen16};
use crate::cpu::kv_dtype::{KvElem, SCALE_GROUP};
use crate::cpu::simd;
use half::f16;

/// Most pairs of one token that go through a block together.
pub(super) const MAX_RUN: usize = 4;

/// One (block, KV head) of a layer's cache: its keys (transposed, `[head_dim, block_size]`),
/// values (`[block_size, head_dim]`) and, for a scaled type, the scales of each slot's key and
/// value groups (`[groups, block_size]`; empty for the float types).
#[derive(Clone, Copy)]
pub(super) struct BlockKv<'a, E> {
    pub(super) keys: &'a [E],
    pub(super) vals: &'a [E],
    pub(super) k_scales: &'a [f16],
    pub(super) v_scales: &'a [f16],
}

impl<E> BlockKv<'_, E> {
    /// Hints every line of the block towards L1.
    #[inline(always)]
    pub(super) fn prefetch(&self) {
        prefetch(self.keys);
        prefetch(self.vals);
        prefetch(self.k_scales);
        prefetch(self.v_scales);
    }

    /// Hints every line of the block towards L2.
    #[inline(always)]
    pub(super) fn prefetch_l2(&self) {
        prefetch_l2(self.keys);
        prefetch_l2(self.vals);
        prefetch_l2(self.k_scales);
        prefetch_l2(self.v_scales);
    }
}

/// Pairs of one token against one block: `first` is the index of the first pair, `range` the
/// visible keys of the block.
pub(super) struct Run<'a, E> {
    pub(super) pairs: &'a [(usize, usize)],
    pub(super) first: usize,
    pub(super) range: (usize, usize),
    /// The block that comes next, to prefetch meanwhile.
    pub(super) next: Option<BlockKv<'a, E>>,
    /// A block further on, to bring into L2 meanwhile.
    pub(super) far: Option<BlockKv<'a, E>>,
}

/// The maximum of a block's visible scores (keys `lo..hi`): lane maxima, then their fold
/// (exact in any order; minus infinity when none is visible).
#[inline(always)]
pub(super) fn visible_max(scores: &[f32], (lo, hi): (usize, usize)) -> f32 {
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    for (j, &sc) in scores.iter().enumerate() {
        let v = if j >= lo && j < hi {
            sc
        } else {
            f32::NEG_INFINITY
        };
        lane_max[j % LANES] = lane_max[j % LANES].max(v);
    }
    lane_max.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// The softmax step of one pair over a block's scaled `scores` (keys `lo..hi` visible) whose
/// visible maximum is `block_max`: rescaling when the running maximum grows, then `probs`
/// (zero outside the visible keys) added to the denominator lanes.
#[inline(always)]
pub(super) fn softmax_step(
    block_max: f32,
    scores: &[f32],
    range: (usize, usize),
    s: &mut SoftmaxState,
    acc: &mut [f32],
    probs: &mut [f32],
) {
    let (lo, hi) = range;
    if block_max > s.max {
        let correction = simd::exp(s.max - block_max);
        s.denom.iter_mut().for_each(|d| *d *= correction);
        acc.iter_mut().for_each(|a| *a *= correction);
        s.max = block_max;
    }
    let m = s.max;
    for (j, (pr, &sc)) in probs.iter_mut().zip(scores).enumerate() {
        let e = simd::exp(sc - m);
        *pr = if j >= lo && j < hi { e } else { 0.0 };
    }
    for (j, &pr) in probs.iter().enumerate() {
        s.denom[j % LANES] += pr;
    }
}

/// One pair against a block of any size (the reference arithmetic), with soft-capping.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn block_any<E: KvElem>(
    qv: &[f32],
    blk: BlockKv<'_, E>,
    bs: usize,
    range: (usize, usize),
    scale: f32,
    softcap: Option<f32>,
    s: &mut SoftmaxState,
    acc: &mut [f32],
) {
    let hd = qv.len();
    let mut scores = [0f32; MAX_BLOCK_SIZE];
    let mut probs = [0f32; MAX_BLOCK_SIZE];
    if E::SCALED {
        block_scores_scaled(qv, blk.keys, blk.k_scales, bs, &mut scores[..bs]);
    } else {
        block_scores_any(qv, blk.keys, bs, &mut scores[..bs]);
    }
    scores[..bs].iter_mut().for_each(|sc| *sc *= scale);
    if let Some(cap) = softcap {
        scores[..bs]
            .iter_mut()
            .for_each(|sc| *sc = cap * (*sc / cap).tanh());
    }
    let block_max = visible_max(&scores[..bs], range);
    softmax_step(block_max, &scores[..bs], range, s, acc, &mut probs[..bs]);
    let (lo, hi) = range;
    if E::SCALED {
        weighted_values_scaled(acc, &probs[..bs], blk.vals, blk.v_scales, range);
    } else {
        weighted_values_any(acc, &probs[lo..hi], &blk.vals[lo * hd..hi * hd]);
    }
}

/// `NP` pairs of one token against a block of 16 keys with head size `HD`: the block's keys
/// and values are loaded once for all of them, and their accumulators give independent chains.
/// Each pair's arithmetic is exactly [`block_any`]'s.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // register arrays read best indexed
#[inline(always)]
pub(super) fn block_fast<E: KvElem, W: Isa, const HD: usize, const NP: usize>(
    run: &Run<'_, E>,
    q: &[f32],
    t: usize,
    nh: usize,
    blk: BlockKv<'_, E>,
    scale: f32,
    st: &mut [SoftmaxState],
    out: &mut [f32],
) {
    const BS: usize = 16;
    let (keys, vals) = (blk.keys, blk.vals);
    let qs: [&[f32; HD]; NP] = std::array::from_fn(|k| {
        let at = (t * nh + run.pairs[k].1) * HD;
        q[at..at + HD].try_into().expect("HD values")
    });
    // Without a next block, the prefetches touch this one (in cache): no branch in the loops.
    let next_blk = run.next.unwrap_or(blk);
    let far_blk = run.far.unwrap_or(blk);
    // Their scales are a line or two: hinted at once.
    prefetch(next_blk.k_scales);
    prefetch(next_blk.v_scales);
    prefetch_l2(far_blk.k_scales);
    prefetch_l2(far_blk.v_scales);
    let (next_k, next_v) = (next_blk.keys, next_blk.vals);
    let (far_k, far_v) = (far_blk.keys, far_blk.vals);
    // A scaled block's scales, widened once: `[group][key]`.
    const GROUPS: usize = super::MAX_HEAD_DIM / SCALE_GROUP;
    let (mut ksf, mut vsf) = ([[0f32; BS]; GROUPS], [[0f32; BS]; GROUPS]);
    if E::SCALED {
        for g in 0..HD / SCALE_GROUP {
            ksf[g] = f16::widen16::<W>(&blk.k_scales[g * BS..(g + 1) * BS]);
            vsf[g] = f16::widen16::<W>(&blk.v_scales[g * BS..(g + 1) * BS]);
        }
    }
    // Scores: per pair four partial sums over dimensions d ≡ r (mod 4), as `block_scores_any`
    // (a scaled block: per group of dimensions, then the groups' scaled sums in order, as
    // `block_scores_scaled`).
    let mut raw = [[0f32; BS]; NP];
    // Each group's four partial sums, folded into `raw`.
    let fold = |raw: &mut [[f32; BS]; NP], part: &[[[f32; BS]; 4]; NP], g: usize| {
        for k in 0..NP {
            for j in 0..BS {
                let sum = (part[k][0][j] + part[k][1][j]) + (part[k][2][j] + part[k][3][j]);
                raw[k][j] = if E::SCALED {
                    ksf[g][j].mul_add(sum, raw[k][j])
                } else {
                    sum
                };
            }
        }
    };
    let group = if E::SCALED { SCALE_GROUP } else { HD };
    for g in 0..HD / group {
        let mut part = [[[0f32; BS]; 4]; NP];
        // No prefetch in this loop: a prefetch here keeps the compiler from holding `part` in
        // registers (it stored every accumulator on every step, which cost a quarter of the
        // time).
        let dims = g * group..(g + 1) * group;
        for (c, k4) in keys[dims.start * BS..dims.end * BS]
            .chunks_exact(4 * BS)
            .enumerate()
        {
            for r in 0..4 {
                let krow = E::widen16::<W>(&k4[r * BS..(r + 1) * BS]);
                for k in 0..NP {
                    let qd = qs[k][dims.start + 4 * c + r];
                    for j in 0..BS {
                        part[k][r][j] = qd.mul_add(krow[j], part[k][r][j]);
                    }
                }
            }
        }
        fold(&mut raw, &part, g);
    }
    let mut probs = [[0f32; BS]; NP];
    for k in 0..NP {
        let mut scores = [0f32; BS];
        for j in 0..BS {
            scores[j] = raw[k][j] * scale;
        }
        let p = run.first + k;
        // The block's maximum as the build does it best (the same value as `visible_max`'s).
        let block_max = W::visible_max16(&scores, run.range.0, run.range.1);
        softmax_step(
            block_max,
            &scores,
            run.range,
            &mut st[p],
            &mut out[p * HD..(p + 1) * HD],
            &mut probs[k],
        );
    }
    // Weighted values, key by key, every pair's accumulator in registers.
    let (lo, hi) = run.range;
    let mut a = [[0f32; HD]; NP];
    for k in 0..NP {
        let p = run.first + k;
        a[k].copy_from_slice(&out[p * HD..(p + 1) * HD]);
    }
    let value_steps = vals[lo * HD..hi * HD].chunks_exact(HD);
    // The next block's keys and values, a sixteenth of each per step (its keys cut into
    // sixteen equal runs of lines: which lines go when does not matter).
    let next = next_k[lo * HD..hi * HD]
        .chunks_exact(HD)
        .zip(next_v[lo * HD..hi * HD].chunks_exact(HD));
    let far = far_k[lo * HD..hi * HD]
        .chunks_exact(HD)
        .zip(far_v[lo * HD..hi * HD].chunks_exact(HD));
    for (j, (v, ((nk, nv), (fk, fv)))) in (lo..hi).zip(value_steps.zip(next.zip(far))) {
        prefetch(nk);
        prefetch(nv);
        prefetch_l2(fk);
        prefetch_l2(fv);
        for c in 0..HD / 16 {
            let w = E::widen16::<W>(&v[c * 16..(c + 1) * 16]);
            for k in 0..NP {
                // A scaled block's weight for this group of values, as
                // `weighted_values_scaled`.
                let pr = if E::SCALED {
                    probs[k][j] * vsf[c * 16 / SCALE_GROUP][j]
                } else {
                    probs[k][j]
                };
                for d in 0..16 {
                    a[k][c * 16 + d] = pr.mul_add(w[d], a[k][c * 16 + d]);
                }
            }
        }
    }
    for k in 0..NP {
        let p = run.first + k;
        out[p * HD..(p + 1) * HD].copy_from_slice(&a[k]);
    }
}

/// Scores of one query against the `bs` keys of a transposed block: per key, four partial sums
/// over the dimensions `d ≡ r (mod 4)` in increasing `d`, then `(s0 + s1) + (s2 + s3)`.
#[inline(always)]
pub(super) fn block_scores_any<E: KvElem>(q: &[f32], keys: &[E], bs: usize, out: &mut [f32]) {
    let mut part = [[0f32; MAX_BLOCK_SIZE]; 4];
    for (d, (&qd, krow)) in q.iter().zip(keys.chunks_exact(bs)).enumerate() {
        for (a, &k) in part[d % 4][..bs].iter_mut().zip(krow) {
            *a = qd.mul_add(k.to_f32(), *a);
        }
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = (part[0][j] + part[1][j]) + (part[2][j] + part[3][j]);
    }
}

/// [`block_scores_any`] for a scaled block (`k_scales`: `[groups, bs]`): per group of
/// [`SCALE_GROUP`] dimensions its four partial sums and their sum `g`, then
/// `score = fma(scale_g, g, score)` over the groups in order.
#[inline(always)]
pub(super) fn block_scores_scaled<E: KvElem>(
    q: &[f32],
    keys: &[E],
    k_scales: &[f16],
    bs: usize,
    out: &mut [f32],
) {
    out.fill(0.0);
    for (g, qg) in q.chunks(SCALE_GROUP).enumerate() {
        let mut part = [[0f32; MAX_BLOCK_SIZE]; 4];
        let kg = &keys[g * SCALE_GROUP * bs..];
        for (d, (&qd, krow)) in qg.iter().zip(kg.chunks_exact(bs)).enumerate() {
            for (a, &k) in part[d % 4][..bs].iter_mut().zip(krow) {
                *a = qd.mul_add(k.to_f32(), *a);
            }
        }
        for (j, o) in out.iter_mut().enumerate() {
            let sum = (part[0][j] + part[1][j]) + (part[2][j] + part[3][j]);
            *o = k_scales[g * bs + j].to_f32().mul_add(sum, *o);
        }
    }
}

/// `acc += Σ_k probs[k] · vals[k]` over the visible keys of a scaled block, key by key, each
/// group of values weighted by `probs[k] · v_scales[group][k]` (`v_scales`: `[groups, bs]`).
#[inline(always)]
pub(super) fn weighted_values_scaled<E: KvElem>(
    acc: &mut [f32],
    probs: &[f32],
    vals: &[E],
    v_scales: &[f16],
    (lo, hi): (usize, usize),
) {
    let (hd, bs) = (acc.len(), probs.len());
    for j in lo..hi {
        let v = &vals[j * hd..(j + 1) * hd];
        for (g, (ag, vg)) in acc
            .chunks_mut(SCALE_GROUP)
            .zip(v.chunks(SCALE_GROUP))
            .enumerate()
        {
            let w = probs[j] * v_scales[g * bs + j].to_f32();
            for (a, &x) in ag.iter_mut().zip(vg) {
                *a = w.mul_add(x.to_f32(), *a);
            }
        }
    }
}

/// `acc += Σ_k probs[k] · vals[k]`, key by key.
#[inline(always)]
pub(super) fn weighted_values_any<E: KvElem>(acc: &mut [f32], probs: &[f32], vals: &[E]) {
    for (&p, v) in probs.iter().zip(vals.chunks_exact(acc.len())) {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a = p.mul_add(x.to_f32(), *a);
        }
    }
}
