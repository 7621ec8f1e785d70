//! One run of (token, head) pairs against one KV block: scores, the online-softmax step and
//! the weighted values, in a generic form and unrolled per instruction set and head size.

use super::prefetch::{prefetch, prefetch_l2};
use super::softmax::SoftmaxState;
use super::{LANES, MAX_BLOCK_SIZE};
use crate::cpu::kv_dtype::sealed::Isa;
use crate::cpu::kv_dtype::KvElem;
use crate::cpu::simd;

/// Most pairs of one token that go through a block together.
pub(super) const MAX_RUN: usize = 4;

/// One (block, KV head) of a layer's cache: its keys (transposed, `[head_dim, block_size]`),
/// values (`[block_size, head_dim]`) and, for a scaled type, each slot's key and value scale
/// (`[block_size]`; empty for the float types).
#[derive(Clone, Copy)]
pub(super) struct BlockKv<'a, E> {
    pub(super) keys: &'a [E],
    pub(super) vals: &'a [E],
    pub(super) k_scales: &'a [f32],
    pub(super) v_scales: &'a [f32],
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

/// A block's raw score of key `j` (the dot product with the stored key) as attention uses it:
/// times the key's scale for a scaled type, then times `scale`.
#[inline(always)]
fn scaled_score<E: KvElem>(raw: f32, k_scales: &[f32], j: usize, scale: f32) -> f32 {
    if E::SCALED {
        raw * k_scales[j] * scale
    } else {
        raw * scale
    }
}

/// Key `j`'s softmax weight as it multiplies the stored values: times the value's scale for a
/// scaled type.
#[inline(always)]
fn value_weight<E: KvElem>(prob: f32, v_scales: &[f32], j: usize) -> f32 {
    if E::SCALED {
        prob * v_scales[j]
    } else {
        prob
    }
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
    block_scores_any(qv, blk.keys, bs, &mut scores[..bs]);
    for (j, sc) in scores[..bs].iter_mut().enumerate() {
        *sc = scaled_score::<E>(*sc, blk.k_scales, j, scale);
    }
    if let Some(cap) = softcap {
        scores[..bs]
            .iter_mut()
            .for_each(|sc| *sc = cap * (*sc / cap).tanh());
    }
    let block_max = visible_max(&scores[..bs], range);
    softmax_step(block_max, &scores[..bs], range, s, acc, &mut probs[..bs]);
    let (lo, hi) = range;
    for (j, p) in probs[..bs].iter_mut().enumerate() {
        *p = value_weight::<E>(*p, blk.v_scales, j);
    }
    weighted_values_any(acc, &probs[lo..hi], &blk.vals[lo * hd..hi * hd]);
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
    // Scores: per pair four partial sums over dimensions d ≡ r (mod 4), as `block_scores`.
    let mut part = [[[0f32; BS]; 4]; NP];
    // No prefetch in this loop: a prefetch here keeps the compiler from holding `part` in
    // registers (it stored every accumulator on every step, which cost a quarter of the time).
    for (c, k4) in keys[..HD * BS].chunks_exact(4 * BS).enumerate() {
        for r in 0..4 {
            let krow = E::widen16::<W>(&k4[r * BS..(r + 1) * BS]);
            for k in 0..NP {
                let qd = qs[k][4 * c + r];
                for j in 0..BS {
                    part[k][r][j] = qd.mul_add(krow[j], part[k][r][j]);
                }
            }
        }
    }
    let mut probs = [[0f32; BS]; NP];
    for k in 0..NP {
        let mut scores = [0f32; BS];
        for j in 0..BS {
            let raw = (part[k][0][j] + part[k][1][j]) + (part[k][2][j] + part[k][3][j]);
            scores[j] = scaled_score::<E>(raw, blk.k_scales, j, scale);
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
        // The denominator has its weights: from here on they multiply the stored values.
        for (j, pr) in probs[k].iter_mut().enumerate() {
            *pr = value_weight::<E>(*pr, blk.v_scales, j);
        }
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
                let pr = probs[k][j];
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

/// `acc += Σ_k probs[k] · vals[k]`, key by key.
#[inline(always)]
pub(super) fn weighted_values_any<E: KvElem>(acc: &mut [f32], probs: &[f32], vals: &[E]) {
    for (&p, v) in probs.iter().zip(vals.chunks_exact(acc.len())) {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a = p.mul_add(x.to_f32(), *a);
        }
    }
}
