//! Paged attention over a block-table KV cache, with online softmax.
//!
//! Cache layout, per layer: keys `[num_blocks, num_kv_heads, head_dim, block_size]` (each
//! block's keys transposed, so the scores of a query against a whole block are one vector
//! multiply-add per dimension) and values `[num_blocks, num_kv_heads, block_size, head_dim]`.
//! Token `j` of a sequence lives in block `block_table[j / block_size]` at offset
//! `j % block_size`. The query at position `p` attends to keys `0..=p` (causal), and with a
//! sliding window `w` only to keys `j` with `p - j < w`. Keys and values are read in place
//! through the block table: nothing is gathered.
//!
//! Work items are a sequence's query heads that share one KV head, for a run of its tokens, so a
//! block of keys and values is loaded once for all of them; when that gives too few items for the
//! pool, single heads. Every (token, head) pair runs the same arithmetic whatever item it is in,
//! so results never depend on the batch, the chunking of a prompt or the thread count.

use super::simd::{self, multiversion};
use super::DisjointMut;
use crate::ThreadPool;
use ferrum_types::batch::SeqSlice;

/// Largest head size the kernel's stack buffers hold.
pub const MAX_HEAD_DIM: usize = 512;
/// Largest KV block size the kernel's stack buffers hold.
pub const MAX_BLOCK_SIZE: usize = 256;
/// Most (token, head) pairs one work item carries.
const MAX_PAIRS: usize = 16;

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
    /// Start of (block, kv head) in either cache.
    fn block_base(&self, block: usize, kv_head: usize) -> usize {
        (block * self.num_kv_heads + kv_head) * self.block_size * self.head_dim
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
    let (hd, bs) = (shape.head_dim, shape.block_size);
    let row = shape.num_kv_heads * hd;
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let (block, offset) = (slot as usize / bs, slot as usize % bs);
        for g in 0..shape.num_kv_heads {
            let base = shape.block_base(block, g);
            let src = t * row + g * hd;
            for (d, &x) in k[src..src + hd].iter().enumerate() {
                k_cache[base + d * bs + offset] = x;
            }
            let dst = base + offset * hd;
            v_cache[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
        }
    }
}

/// One work item of a sequence: its tokens `tokens.0..tokens.1` and query heads
/// `heads.0..heads.1`.
#[derive(Debug, Clone, Copy)]
struct Item {
    tokens: (usize, usize),
    heads: (usize, usize),
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
    let (nh, nkv) = (shape.num_heads, shape.num_kv_heads);
    let group = nh / nkv;
    // Whole groups of heads when that gives enough items for the pool, else single heads.
    let tokens_per_item = |heads: usize| (MAX_PAIRS / heads).max(1);
    let grouped: usize = seqs
        .iter()
        .map(|s| nkv * s.query_len.div_ceil(tokens_per_item(group)))
        .sum();
    let heads_per_item = if grouped >= 4 * pool.num_threads() || group > MAX_PAIRS {
        group.min(MAX_PAIRS)
    } else {
        1
    };
    let tpi = tokens_per_item(heads_per_item);
    let head_chunks = nh.div_ceil(heads_per_item);
    let per_seq = |s: &SeqSlice| s.query_len.div_ceil(tpi) * head_chunks;
    let total: usize = seqs.iter().map(per_seq).sum();
    let out_shared = DisjointMut::new(out);
    pool.parallel_for(total, |mut i| {
        // Item `i`: find its sequence, then its token run and head chunk.
        let mut si = 0;
        while i >= per_seq(&seqs[si]) {
            i -= per_seq(&seqs[si]);
            si += 1;
        }
        let s = &seqs[si];
        let (c, hc) = (i / head_chunks, i % head_chunks);
        let t0 = s.query_start + c * tpi;
        let it = Item {
            tokens: (t0, (t0 + tpi).min(s.query_start + s.query_len)),
            heads: (hc * heads_per_item, ((hc + 1) * heads_per_item).min(nh)),
        };
        let table = &block_tables[s.block_table_start..][..s.num_blocks];
        attend_item(q, k_cache, v_cache, table, s, it, shape, &out_shared);
    });
}

/// Runs one item. Its heads may span two KV heads only when single heads are items, so the
/// loop goes KV head by KV head.
#[allow(clippy::too_many_arguments)]
fn attend_item(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    table: &[u32],
    seq: &SeqSlice,
    it: Item,
    shape: &AttentionShape,
    out: &DisjointMut<f32>,
) {
    let (nh, hd) = (shape.num_heads, shape.head_dim);
    let group = nh / shape.num_kv_heads;
    let mut h = it.heads.0;
    while h < it.heads.1 {
        let kv_head = h / group;
        let h_end = ((kv_head + 1) * group).min(it.heads.1);
        let mut pairs = [(0usize, 0usize); MAX_PAIRS];
        let mut n = 0;
        for t in it.tokens.0..it.tokens.1 {
            for hh in h..h_end {
                pairs[n] = (t, hh);
                n += 1;
            }
        }
        let mut buf = std::mem::MaybeUninit::<[f32; MAX_PAIRS * MAX_HEAD_DIM]>::uninit();
        let ptr = buf.as_mut_ptr() as *mut f32;
        // SAFETY: `n * hd <= MAX_PAIRS * MAX_HEAD_DIM` (at most MAX_PAIRS pairs, head_dim checked
        // at load); the first `n * hd` values are zeroed before the slice is made.
        let acc = unsafe {
            std::ptr::write_bytes(ptr, 0, n * hd);
            std::slice::from_raw_parts_mut(ptr, n * hd)
        };
        let first_pos = seq.context_len - seq.query_len;
        attend_pairs(
            q,
            k_cache,
            v_cache,
            table,
            &pairs[..n],
            (seq.query_start, first_pos),
            kv_head,
            shape,
            acc,
        );
        for (p, &(t, hh)) in pairs[..n].iter().enumerate() {
            // SAFETY: each (token, head) pair belongs to exactly one item.
            let o = unsafe { out.slice((t * nh + hh) * hd, hd) };
            o.copy_from_slice(&acc[p * hd..(p + 1) * hd]);
        }
        h = h_end;
    }
}

multiversion! {
    /// Attention of `pairs` (token, query head), all on `kv_head`; token `t` sits at position
    /// `t - origin.0 + origin.1`. Writes each pair's output row into `out` (`[pairs, head_dim]`).
    #[allow(clippy::too_many_arguments)]
    fn attend_pairs(
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        table: &[u32],
        pairs: &[(usize, usize)],
        origin: (usize, usize),
        kv_head: usize,
        shape: &AttentionShape,
        out: &mut [f32],
    ) = attend_pairs_impl;
}

/// Online softmax, a block at a time, for every pair: scores over the block's visible keys,
/// the running maximum (rescaling what was summed so far when it grows), then the weighted
/// values. Each pair's arithmetic depends only on its own query and keys.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_pairs_impl(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    table: &[u32],
    pairs: &[(usize, usize)],
    origin: (usize, usize),
    kv_head: usize,
    shape: &AttentionShape,
    out: &mut [f32],
) {
    let (bs, hd, nh) = (shape.block_size, shape.head_dim, shape.num_heads);
    let mut running_max = [f32::NEG_INFINITY; MAX_PAIRS];
    let mut denom = [0f32; MAX_PAIRS];
    let last_pos = pairs
        .iter()
        .map(|&(t, _)| t - origin.0 + origin.1)
        .max()
        .unwrap_or(0);
    let first_pos = pairs
        .iter()
        .map(|&(t, _)| t - origin.0 + origin.1)
        .min()
        .unwrap_or(0);
    let lowest = match shape.sliding_window {
        Some(w) => (first_pos + 1).saturating_sub(w),
        None => 0,
    };
    let mut scores = [0f32; MAX_BLOCK_SIZE];
    let blocks = lowest / bs..=last_pos / bs;
    for (bi, &block) in blocks.clone().zip(&table[blocks]) {
        let base = shape.block_base(block as usize, kv_head);
        let keys = &k_cache[base..base + bs * hd];
        let vals = &v_cache[base..base + bs * hd];
        let block_start = bi * bs;
        for (p, &(t, h)) in pairs.iter().enumerate() {
            let pos = t - origin.0 + origin.1;
            let first = match shape.sliding_window {
                Some(w) => (pos + 1).saturating_sub(w),
                None => 0,
            };
            let lo = first.max(block_start) - block_start;
            let hi = (pos + 1).min(block_start + bs).saturating_sub(block_start);
            if lo >= hi {
                continue;
            }
            let qv = &q[(t * nh + h) * hd..][..hd];
            // [bs]: q · every key of the block.
            if bs == 16 && hd.is_multiple_of(4) {
                block_scores::<16>(qv, keys, &mut scores[..16]);
            } else {
                block_scores_any(qv, keys, bs, &mut scores[..bs]);
            }
            let s = &mut scores[lo..hi];
            let mut block_max = f32::NEG_INFINITY;
            for sc in s.iter_mut() {
                *sc *= shape.scale;
                block_max = block_max.max(*sc);
            }
            let acc = &mut out[p * hd..(p + 1) * hd];
            if block_max > running_max[p] {
                let correction = simd::exp(running_max[p] - block_max);
                denom[p] *= correction;
                acc.iter_mut().for_each(|a| *a *= correction);
                running_max[p] = block_max;
            }
            for sc in s.iter_mut() {
                *sc = simd::exp(*sc - running_max[p]);
            }
            for &pr in s.iter() {
                denom[p] += pr;
            }
            let vals = &vals[lo * hd..hi * hd];
            match hd {
                64 => weighted_values::<64>(acc, s, vals),
                128 => weighted_values::<128>(acc, s, vals),
                _ => weighted_values_any(acc, s, vals),
            }
        }
    }
    for (p, acc) in out.chunks_exact_mut(hd).enumerate() {
        let inv = if denom[p] > 0.0 { 1.0 / denom[p] } else { 0.0 };
        acc.iter_mut().for_each(|a| *a *= inv);
    }
}

/// Scores of one query against the `BS` keys of a transposed block: per key, four partial sums
/// over the dimensions `d ≡ r (mod 4)` in increasing `d`, then `(s0 + s1) + (s2 + s3)`. The
/// accumulators stay in registers.
#[inline(always)]
fn block_scores<const BS: usize>(q: &[f32], keys: &[f32], out: &mut [f32]) {
    let mut part = [[0f32; BS]; 4];
    for (q4, k4) in q.chunks_exact(4).zip(keys.chunks_exact(4 * BS)) {
        for r in 0..4 {
            let krow = &k4[r * BS..(r + 1) * BS];
            for j in 0..BS {
                part[r][j] += q4[r] * krow[j];
            }
        }
    }
    for (j, o) in out.iter_mut().enumerate().take(BS) {
        *o = (part[0][j] + part[1][j]) + (part[2][j] + part[3][j]);
    }
}

/// [`block_scores`] for any block and head size (the same arithmetic, accumulators in memory).
#[inline(always)]
fn block_scores_any(q: &[f32], keys: &[f32], bs: usize, out: &mut [f32]) {
    let mut part = [[0f32; MAX_BLOCK_SIZE]; 4];
    for (d, (&qd, krow)) in q.iter().zip(keys.chunks_exact(bs)).enumerate() {
        for (a, &k) in part[d % 4][..bs].iter_mut().zip(krow) {
            *a += qd * k;
        }
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = (part[0][j] + part[1][j]) + (part[2][j] + part[3][j]);
    }
}

/// `acc += Σ_k probs[k] · vals[k]`, key by key, with `acc` (`HD` values) in registers.
#[inline(always)]
fn weighted_values<const HD: usize>(acc: &mut [f32], probs: &[f32], vals: &[f32]) {
    let mut a = [0f32; HD];
    a.copy_from_slice(&acc[..HD]);
    for (&p, v) in probs.iter().zip(vals.chunks_exact(HD)) {
        for d in 0..HD {
            a[d] += p * v[d];
        }
    }
    acc[..HD].copy_from_slice(&a);
}

/// [`weighted_values`] for any head size.
#[inline(always)]
fn weighted_values_any(acc: &mut [f32], probs: &[f32], vals: &[f32]) {
    for (&p, v) in probs.iter().zip(vals.chunks_exact(acc.len())) {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a += p * x;
        }
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
                    .map(|j| super::super::dot(qv, &k[j * kvw + g * 8..][..8]) as f64 * 0.5)
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

    /// Grouped items (one thread, many items) and single-head items (two threads, few items)
    /// give the same bits, and so does each sequence alone.
    #[test]
    fn results_do_not_depend_on_grouping_or_batch() {
        let shape = AttentionShape {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim: 16,
            block_size: 4,
            scale: 0.25,
            sliding_window: None,
        };
        let kvw = 2 * 16;
        let f = |i: usize, s: f32| ((i as f32) * s).sin();
        // Sequence 0: 9 cached + 5 new tokens; sequence 1: 3 new tokens. Blocks 0..4 and 4..5.
        let lens = [(14usize, 5usize), (3, 3)];
        let tables: [&[u32]; 2] = [&[3, 0, 2, 4], &[1]];
        let cache_len = 5 * 2 * 4 * 16;
        let (mut kc, mut vc) = (vec![0f32; cache_len], vec![0f32; cache_len]);
        for (s, &(ctx, _)) in lens.iter().enumerate() {
            let k: Vec<f32> = (0..ctx * kvw).map(|i| f(i + 100 * s, 0.7)).collect();
            let v: Vec<f32> = (0..ctx * kvw).map(|i| f(i + 100 * s, 1.1)).collect();
            let slots: Vec<u32> = (0..ctx)
                .map(|j| tables[s][j / 4] * 4 + (j % 4) as u32)
                .collect();
            write_kv(&k, &v, &slots, &shape, &mut kc, &mut vc);
        }
        let q: Vec<f32> = (0..8 * 6 * 16).map(|i| f(i, 0.3)).collect();
        let slice = |start: usize, s: usize, table_start: usize| SeqSlice {
            query_start: start,
            query_len: lens[s].1,
            context_len: lens[s].0,
            block_table_start: table_start,
            num_blocks: tables[s].len(),
        };
        let all_tables: Vec<u32> = tables.concat();
        let run = |threads: usize, seqs: &[SeqSlice], table: &[u32], q: &[f32]| {
            let pool = ThreadPool::new(threads).unwrap();
            let mut out = vec![0f32; q.len()];
            paged_attention(&pool, q, &kc, &vc, seqs, table, &shape, &mut out);
            out
        };
        let both = [slice(0, 0, 0), slice(5, 1, 4)];
        let one = run(1, &both, &all_tables, &q);
        let two = run(2, &both, &all_tables, &q);
        assert_eq!(one, two);
        let first = run(2, &[slice(0, 0, 0)], tables[0], &q[..5 * 96]);
        assert_eq!(first, one[..5 * 96]);
        let second = run(1, &[slice(0, 1, 0)], tables[1], &q[5 * 96..]);
        assert_eq!(second, one[5 * 96..]);
    }

    #[test]
    fn fast_paths_equal_the_general_ones() {
        let q: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let keys: Vec<f32> = (0..64 * 16).map(|i| (i as f32 * 0.11).cos()).collect();
        let (mut a, mut b) = ([0f32; 16], [0f32; 16]);
        block_scores::<16>(&q, &keys, &mut a);
        block_scores_any(&q, &keys, 16, &mut b);
        assert_eq!(a, b);
        let probs = [0.3f32, 0.5, 0.2];
        let (mut x, mut y) = (q.clone(), q.clone());
        weighted_values::<64>(&mut x, &probs, &keys[..3 * 64]);
        weighted_values_any(&mut y, &probs, &keys[..3 * 64]);
        assert_eq!(x, y);
    }
}
