//! Paged attention over a block-table KV cache, with online softmax.
//!
//! Cache layout, per layer: `[num_blocks, num_kv_heads, block_size, head_dim]`, so the keys of one
//! head in one block are contiguous. Token `j` of a sequence lives in block `block_table[j /
//! block_size]` at offset `j % block_size`. The query at position `p` attends to keys `0..=p`
//! (causal), and with a sliding window `w` only to keys `j` with `p - j < w`. Keys are read in
//! place through the block table: nothing is gathered. Work is split over (token, head) pairs.

use super::simd::{self, multiversion};
use super::{dot, DisjointMut};
use crate::ThreadPool;
use ferrum_types::batch::SeqSlice;

/// Largest head size the kernel's stack buffers hold.
pub const MAX_HEAD_DIM: usize = 512;
/// Largest KV block size the kernel's stack buffers hold.
pub const MAX_BLOCK_SIZE: usize = 256;

/// Sizes of an attention layer and its cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Multiplier of `q·k`, usually `1/sqrt(head_dim)`.
    pub scale: f32,
    /// Keys further back than this many positions are masked.
    pub sliding_window: Option<usize>,
}

impl AttentionShape {
    fn cache_index(&self, block: usize, kv_head: usize, offset: usize) -> usize {
        ((block * self.num_kv_heads + kv_head) * self.block_size + offset) * self.head_dim
    }
}

/// Writes the new tokens' keys and values (`[num_tokens, num_kv_heads * head_dim]`) into their
/// cache slots (`slot = block * block_size + offset`). Slots were validated against the cache.
pub fn write_kv(
    k: &[f32],
    v: &[f32],
    slot_mapping: &[u32],
    shape: &AttentionShape,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) {
    let hd = shape.head_dim;
    let row = shape.num_kv_heads * hd;
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let (block, offset) = (
            slot as usize / shape.block_size,
            slot as usize % shape.block_size,
        );
        for g in 0..shape.num_kv_heads {
            let dst = shape.cache_index(block, g, offset);
            let src = t * row + g * hd;
            k_cache[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
            v_cache[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
        }
    }
}

/// `out[t, h, :] = softmax(scale · q[t, h]·K) · V` over the keys visible to token `t`, for all
/// tokens of all sequences in `seqs` (`q`, `out`: `[num_tokens, num_heads * head_dim]`).
///
/// Preconditions (checked by `ForwardBatch::validate`): the slices of `seqs` tile
/// `0..num_tokens` in order, each sequence's block table covers its `context_len`, and the new
/// tokens' K/V are already written.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    pool: &ThreadPool,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[SeqSlice],
    block_tables: &[u32],
    shape: &AttentionShape,
    out: &mut [f32],
) {
    let (nh, hd) = (shape.num_heads, shape.head_dim);
    let group = nh / shape.num_kv_heads;
    let num_tokens = q.len() / (nh * hd);
    let out_shared = DisjointMut::new(out);
    pool.parallel_ranges(num_tokens * nh, 8, |items| {
        let mut seq_idx = 0;
        for item in items {
            let (t, h) = (item / nh, item % nh);
            while seqs[seq_idx].query_start + seqs[seq_idx].query_len <= t {
                seq_idx += 1;
            }
            let seq = &seqs[seq_idx];
            let table = &block_tables[seq.block_table_start..][..seq.num_blocks];
            let pos = seq.context_len - seq.query_len + (t - seq.query_start);
            let first = match shape.sliding_window {
                Some(w) => (pos + 1).saturating_sub(w),
                None => 0,
            };
            let qv = &q[(t * nh + h) * hd..][..hd];
            // SAFETY: each (token, head) item owns its head_dim-wide output slice.
            let o = unsafe { out_shared.slice((t * nh + h) * hd, hd) };
            attend_one(
                qv,
                k_cache,
                v_cache,
                table,
                first,
                pos + 1,
                h / group,
                shape,
                o,
            );
        }
    });
}

multiversion! {
    /// Attention of one query head over keys `first..end` of one sequence.
    #[allow(clippy::too_many_arguments)]
    fn attend_one(
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        table: &[u32],
        first: usize,
        end: usize,
        kv_head: usize,
        shape: &AttentionShape,
        out: &mut [f32],
    ) = attend_one_impl;
}

/// One pass of online softmax over the keys, a block at a time: scores, the running maximum
/// (rescaling what was summed so far when it grows), then the weighted values.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_one_impl(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    table: &[u32],
    first: usize,
    end: usize,
    kv_head: usize,
    shape: &AttentionShape,
    out: &mut [f32],
) {
    let (bs, hd) = (shape.block_size, shape.head_dim);
    let mut acc = [0f32; MAX_HEAD_DIM];
    let acc = &mut acc[..hd];
    let mut scores = [0f32; MAX_BLOCK_SIZE];
    let mut running_max = f32::NEG_INFINITY;
    let mut denom = 0f32;
    let mut j = first;
    while j < end {
        let (bi, off) = (j / bs, j % bs);
        let n = (bs - off).min(end - j);
        let base = shape.cache_index(table[bi] as usize, kv_head, off);
        let keys = &k_cache[base..base + n * hd];
        let vals = &v_cache[base..base + n * hd];
        let mut block_max = f32::NEG_INFINITY;
        for (s, k) in scores[..n].iter_mut().zip(keys.chunks_exact(hd)) {
            *s = dot(q, k) * shape.scale;
            block_max = block_max.max(*s);
        }
        if block_max > running_max {
            let correction = simd::exp(running_max - block_max);
            denom *= correction;
            acc.iter_mut().for_each(|a| *a *= correction);
            running_max = block_max;
        }
        for s in scores[..n].iter_mut() {
            *s = simd::exp(*s - running_max);
        }
        for (&p, v) in scores[..n].iter().zip(vals.chunks_exact(hd)) {
            denom += p;
            for (a, &x) in acc.iter_mut().zip(v) {
                *a += p * x;
            }
        }
        j += n;
    }
    let inv = if denom > 0.0 { 1.0 / denom } else { 0.0 };
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dense causal attention for one sequence whose cache blocks are laid out in `table` order.
    #[test]
    fn matches_dense_softmax_through_a_shuffled_block_table() {
        let shape = AttentionShape {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            block_size: 4,
            scale: 0.5,
            sliding_window: Some(5),
        };
        let len = 11;
        let table = [2u32, 0, 3];
        let kvw = shape.num_kv_heads * shape.head_dim;
        let f = |i: usize, s: f32| ((i as f32) * s).sin();
        let k: Vec<f32> = (0..len * kvw).map(|i| f(i, 0.7)).collect();
        let v: Vec<f32> = (0..len * kvw).map(|i| f(i, 1.3)).collect();
        let q: Vec<f32> = (0..len * 32).map(|i| f(i, 0.3)).collect();
        let slots: Vec<u32> = (0..len)
            .map(|j| table[j / 4] * 4 + (j % 4) as u32)
            .collect();
        let cache_len = 4 * shape.num_kv_heads * 4 * shape.head_dim;
        let (mut kc, mut vc) = (vec![0f32; cache_len], vec![0f32; cache_len]);
        write_kv(&k, &v, &slots, &shape, &mut kc, &mut vc);
        let seqs = [SeqSlice {
            query_start: 0,
            query_len: len,
            context_len: len,
            block_table_start: 0,
            num_blocks: 3,
        }];
        let pool = ThreadPool::new(2).unwrap();
        let mut out = vec![0f32; q.len()];
        paged_attention(&pool, &q, &kc, &vc, &seqs, &table, &shape, &mut out);
        for t in 0..len {
            for h in 0..4 {
                let g = h / 2;
                let qv = &q[(t * 4 + h) * 8..][..8];
                let lo = (t + 1).saturating_sub(5);
                let s: Vec<f64> = (lo..=t)
                    .map(|j| dot(qv, &k[j * kvw + g * 8..][..8]) as f64 * 0.5)
                    .collect();
                let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..8 {
                    let want: f64 = (lo..=t)
                        .zip(&e)
                        .map(|(j, p)| p / z * v[j * kvw + g * 8 + d] as f64)
                        .sum();
                    let got = out[(t * 4 + h) * 8 + d] as f64;
                    assert!((got - want).abs() < 1e-5, "t{t} h{h} d{d}: {got} vs {want}");
                }
            }
        }
    }
}
