//! The planner of paged attention: how the batch's sequences are cut into work items (a run of
//! tokens, a group of query heads sharing a KV head, a range of softmax parts), how items find
//! their sequence, and the fold of split decodes' parts, in order, after the items ran.

use super::kernels::*;
use super::prefetch::prefetch_l2;
use super::softmax::*;
use super::{AttentionShape, RowScales, LANES, MAX_HEAD_DIM, MAX_PAIRS, PART};
use crate::cpu::kv_dtype::KvElem;
use crate::cpu::DisjointMut;
use crate::ThreadPool;
use ferrum_types::batch::SeqSlice;

/// Decode-like sequences (at most this many new tokens) over more than one part are split by
/// part across the pool.
const SPLIT_MAX_TOKENS: usize = 4;

/// How one sequence is cut into items.
#[derive(Debug, Clone, Copy)]
pub(super) struct SeqPlan {
    /// Softmax parts its keys span.
    parts: usize,
    /// Whether items are single parts (their states go to the partials, folded after).
    split: bool,
    tokens_per_item: usize,
    heads_per_item: usize,
}

impl SeqPlan {
    fn items(&self, s: &SeqSlice, nh: usize) -> usize {
        let runs = s.query_len.div_ceil(self.tokens_per_item);
        let chunks = nh.div_ceil(self.heads_per_item);
        runs * chunks * if self.split { self.parts } else { 1 }
    }

    /// Floats of partial state this sequence needs (split sequences only).
    fn partials(&self, s: &SeqSlice, nh: usize, hd: usize) -> usize {
        if self.split {
            s.query_len * nh * self.parts * (hd + 1 + LANES)
        } else {
            0
        }
    }
}

/// `out[t, h, :] = softmax(scale · q[t, h]·K) · V` over the keys visible to token `t`, for all
/// tokens of all sequences in `seqs` (`q`, `out`: `[num_tokens, num_heads * head_dim]`).
/// `partials` is scratch for decodes split by part (grown when needed, then reused).
///
/// Preconditions (checked by `ForwardBatch::validate`): the slices of `seqs` tile
/// `0..num_tokens` in order, each sequence's block table covers its `context_len`, and the new
/// tokens' K/V are already written.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<E: KvElem>(
    pool: &ThreadPool,
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    seqs: &[SeqSlice],
    block_tables: &[u32],
    shape: &AttentionShape,
    out: &mut [f32],
    partials: &mut Vec<f32>,
) {
    assert!(
        !E::SCALED,
        "a scaled cache needs its scales: paged_attention_scaled"
    );
    paged_attention_scaled(
        pool,
        q,
        (k_cache, v_cache, RowScales::default()),
        seqs,
        block_tables,
        shape,
        out,
        partials,
    )
}

/// [`paged_attention`] over a cache of any type: `cache` is the keys, the values and, for a
/// scaled type (int8), their rows' scales (`[num_blocks, num_kv_heads, groups, block_size]`
/// each).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_scaled<E: KvElem>(
    pool: &ThreadPool,
    q: &[f32],
    cache: (&[E], &[E], RowScales<'_>),
    seqs: &[SeqSlice],
    block_tables: &[u32],
    shape: &AttentionShape,
    out: &mut [f32],
    partials: &mut Vec<f32>,
) {
    let (k_cache, v_cache, scales) = cache;
    if E::SCALED {
        let n = k_cache.len() / shape.head_dim.max(1) * shape.scale_groups();
        assert!(
            scales.k.len() == n && scales.v.len() == n,
            "a scale per group of each cached row"
        );
    }
    let (nh, nkv, hd) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let group = nh / nkv;
    // Whole groups of heads when that gives enough items for the pool, else single heads;
    // decodes over several parts always go by whole groups, split by part.
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
    let plan = |s: &SeqSlice| {
        let parts = s.context_len.div_ceil(PART).max(1);
        let split = parts > 1 && s.query_len <= SPLIT_MAX_TOKENS && group <= MAX_PAIRS;
        let hpi = if split { group } else { heads_per_item };
        SeqPlan {
            parts,
            split,
            tokens_per_item: tokens_per_item(hpi),
            heads_per_item: hpi,
        }
    };
    let total: usize = seqs.iter().map(|s| plan(s).items(s, nh)).sum();
    let need: usize = seqs.iter().map(|s| plan(s).partials(s, nh, hd)).sum();
    // Where each of the first INDEXED sequences' items and partials start, so an item finds
    // its sequence by binary search (a batch of more sequences walks the rest).
    let mut index = [(0usize, 0usize); INDEXED];
    let indexed = seqs.len().min(INDEXED);
    let (mut at, mut pat) = (0, 0);
    for (e, s) in index.iter_mut().zip(seqs) {
        *e = (at, pat);
        let pl = plan(s);
        at += pl.items(s, nh);
        pat += pl.partials(s, nh, hd);
    }
    let index = &index[..indexed];
    if partials.len() < need {
        partials.resize(need, 0.0);
    }
    let out_shared = DisjointMut::new(out);
    let partials_shared = DisjointMut::new(partials);
    // Item `i`: its sequence, where that sequence's partials start, its plan, and the item.
    let locate = |mut i: usize| {
        // Find its sequence (and where its partials start), then its part, token run and head
        // chunk.
        let (mut si, mut pbase) = (0, 0);
        if let Some(k) = index
            .partition_point(|&(start, _)| start <= i)
            .checked_sub(1)
        {
            // The last indexed sequence starting at or before `i` (an empty one's successor
            // starts where it does, so this is the one `i` falls in, or one before the walk).
            (si, pbase) = (k, index[k].1);
            i -= index[k].0;
        }
        loop {
            let (s, pl) = (&seqs[si], plan(&seqs[si]));
            let n = pl.items(s, nh);
            if i < n {
                break;
            }
            i -= n;
            pbase += pl.partials(s, nh, hd);
            si += 1;
        }
        let s = &seqs[si];
        let pl = plan(s);
        let (part, i) = if pl.split {
            (i % pl.parts, i / pl.parts)
        } else {
            (0, i)
        };
        let head_chunks = nh.div_ceil(pl.heads_per_item);
        let (c, hc) = (i / head_chunks, i % head_chunks);
        let t0 = s.query_start + c * pl.tokens_per_item;
        let it = Item {
            tokens: (
                t0,
                (t0 + pl.tokens_per_item).min(s.query_start + s.query_len),
            ),
            heads: (
                hc * pl.heads_per_item,
                ((hc + 1) * pl.heads_per_item).min(nh),
            ),
            parts: if pl.split {
                (part, part + 1)
            } else {
                (0, pl.parts)
            },
        };
        (s, pbase, pl, it)
    };
    // Brings the first blocks an item reads towards L2 (a hint), while the item before it runs.
    let warm = |i: usize| {
        let (s, _, _, it) = locate(i);
        let table = &block_tables[s.block_table_start..][..s.num_blocks];
        let kv_head = it.heads.0 / group;
        let b0 = it.parts.0 * PART / shape.block_size;
        for &block in table.iter().skip(b0).take(WARM_BLOCKS) {
            let at = shape.block_base(block as usize, kv_head);
            let len = shape.block_size * hd;
            if let (Some(k), Some(v)) = (k_cache.get(at..at + len), v_cache.get(at..at + len)) {
                prefetch_l2(k);
                prefetch_l2(v);
            }
        }
    };
    let run_item = |i: usize| {
        if i + 1 < total {
            warm(i + 1);
        }
        let (s, pbase, pl, it) = locate(i);
        let table = &block_tables[s.block_table_start..][..s.num_blocks];
        let dst = if pl.split {
            Dest::Partials {
                shared: &partials_shared,
                base: pbase,
                parts: pl.parts,
            }
        } else {
            Dest::Out(&out_shared)
        };
        attend_item(q, k_cache, v_cache, scales, table, s, it, shape, dst);
    };
    // Each thread walks its own run of items (a sequence's KV heads, whose blocks sit side by
    // side in the cache), stealing the others' last ones when done.
    pool.parallel_segments(total, 1, |items| items.for_each(run_item));
    // Fold the split sequences' parts, in order, into their outputs.
    let mut pbase = 0;
    for s in seqs {
        let pl = plan(s);
        if !pl.split {
            continue;
        }
        let stride = hd + 1 + LANES;
        for t in 0..s.query_len {
            for h in 0..nh {
                let mut st = SoftmaxState::EMPTY;
                let mut acc = [0f32; MAX_HEAD_DIM];
                let acc = &mut acc[..hd];
                for p in 0..pl.parts {
                    let o = pbase + ((t * nh + h) * pl.parts + p) * stride;
                    let slot = &partials[o..o + stride];
                    let ps = SoftmaxState {
                        max: slot[hd],
                        denom: std::array::from_fn(|l| slot[hd + 1 + l]),
                    };
                    fold(&mut st, acc, &ps, &slot[..hd]);
                }
                let row = (s.query_start + t) * nh + h;
                normalize(&st, acc, &mut out[row * hd..(row + 1) * hd]);
            }
        }
        pbase += pl.partials(s, nh, hd);
    }
}

/// Sequences of a batch whose first items are indexed for [`paged_attention`]'s items to find.
pub(super) const INDEXED: usize = 256;

/// Blocks of the next item brought towards L2 while an item runs.
pub(super) const WARM_BLOCKS: usize = 2;
