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
//!
//! The cache holds f32 or a half type ([`KvElem`]); keys and values are widened to f32 as they
//! are loaded, and everything after that is the same f32 arithmetic.

use super::kv_dtype::sealed::{Isa, Portable};
use super::kv_dtype::KvElem;
use super::simd;
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
/// cache slots (`slot = block * block_size + offset`), rounded to the cache's type. Slots were
/// validated against the cache.
pub fn write_kv<E: KvElem>(
    k: &[f32],
    v: &[f32],
    slot_mapping: &[u32],
    shape: &AttentionShape,
    k_cache: &mut [E],
    v_cache: &mut [E],
) {
    let (kc, vc) = (DisjointMut::new(k_cache), DisjointMut::new(v_cache));
    for g in 0..shape.num_kv_heads {
        // SAFETY: one thread writes everything, one region at a time.
        unsafe {
            write_head(k, slot_mapping, shape, g, &kc, true);
            write_head(v, slot_mapping, shape, g, &vc, false);
        }
    }
}

/// Batches of at least this many tokens write their keys and values in parallel.
const PAR_WRITE_TOKENS: usize = 8;

/// [`write_kv`] split over `pool` (for 8 tokens or more): a task per KV head
/// and cache, so no two tasks ever write the same memory, whatever the slots. Each value is
/// rounded as in `write_kv`: the same bits.
#[allow(clippy::too_many_arguments)]
pub fn write_kv_par<E: KvElem>(
    pool: &ThreadPool,
    k: &[f32],
    v: &[f32],
    slot_mapping: &[u32],
    shape: &AttentionShape,
    k_cache: &mut [E],
    v_cache: &mut [E],
) {
    if slot_mapping.len() < PAR_WRITE_TOKENS || pool.num_threads() == 1 {
        return write_kv(k, v, slot_mapping, shape, k_cache, v_cache);
    }
    let (kc, vc) = (DisjointMut::new(k_cache), DisjointMut::new(v_cache));
    pool.parallel_for(2 * shape.num_kv_heads, |i| {
        let (g, keys) = (i / 2, i % 2 == 0);
        let (src, dst) = if keys { (k, &kc) } else { (v, &vc) };
        // SAFETY: task (g, cache) writes only head g's regions of that cache, and no other
        // task writes those.
        unsafe { write_head(src, slot_mapping, shape, g, dst, keys) };
    });
}

/// Writes KV head `g` of every token (`src`: `[num_tokens, num_kv_heads * head_dim]`) into
/// `cache`: transposed within its block (`keys`) or as a row.
///
/// # Safety
/// No other thread touches head `g`'s regions of `cache` meanwhile.
unsafe fn write_head<E: KvElem>(
    src: &[f32],
    slot_mapping: &[u32],
    shape: &AttentionShape,
    g: usize,
    cache: &DisjointMut<E>,
    keys: bool,
) {
    let (hd, bs) = (shape.head_dim, shape.block_size);
    let row = shape.num_kv_heads * hd;
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let (block, offset) = (slot as usize / bs, slot as usize % bs);
        let x = &src[t * row + g * hd..][..hd];
        // SAFETY: (block, head g) is one region of `cache`; the caller owns head g's regions.
        let region = unsafe { cache.slice(shape.block_base(block, g), bs * hd) };
        if keys {
            // Keys are transposed within the block: rounded 64 at a time into a row first.
            for d0 in (0..hd).step_by(64) {
                let n = (hd - d0).min(64);
                let mut r = [E::from_f32(0.0); 64];
                E::narrow_row(&x[d0..d0 + n], &mut r[..n]);
                for (d, &e) in (d0..d0 + n).zip(&r[..n]) {
                    region[d * bs + offset] = e;
                }
            }
        } else {
            E::narrow_row(x, &mut region[offset * hd..(offset + 1) * hd]);
        }
    }
}

/// Positions per softmax partition: every (token, head) pair's keys are cut at multiples of
/// this, each part gets its own online softmax, and the parts are folded in order
/// ([`fold`]). A decode's parts can so run on different threads with the same result.
pub const PART: usize = 256;
/// Lanes of a pair's softmax denominator: key `j` of a block adds to lane `j % LANES`.
const LANES: usize = 16;
/// Decode-like sequences (at most this many new tokens) over more than one part are split by
/// part across the pool.
const SPLIT_MAX_TOKENS: usize = 4;

/// One work item of a sequence: its tokens `tokens.0..tokens.1`, query heads
/// `heads.0..heads.1` and softmax parts `parts.0..parts.1`.
#[derive(Debug, Clone, Copy)]
struct Item {
    tokens: (usize, usize),
    heads: (usize, usize),
    parts: (usize, usize),
}

/// The online-softmax state of one pair over some keys: the running maximum of the scores
/// and the denominator lanes (the weighted values live beside it, unnormalized).
#[derive(Debug, Clone, Copy)]
struct SoftmaxState {
    max: f32,
    denom: [f32; LANES],
}

impl SoftmaxState {
    const EMPTY: SoftmaxState = SoftmaxState {
        max: f32::NEG_INFINITY,
        denom: [0.0; LANES],
    };
}

/// Folds part `(ps, pacc)` into the running `(rs, racc)`, parts in order: both rescaled to the
/// larger maximum. A part without visible keys changes nothing; into an empty running state a
/// part is copied.
fn fold(rs: &mut SoftmaxState, racc: &mut [f32], ps: &SoftmaxState, pacc: &[f32]) {
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
fn normalize(st: &SoftmaxState, acc: &[f32], out: &mut [f32]) {
    let d = &st.denom;
    let r8: [f32; 8] = std::array::from_fn(|i| d[i] + d[i + 8]);
    let r4: [f32; 4] = std::array::from_fn(|i| r8[i] + r8[i + 4]);
    let denom = (r4[0] + r4[2]) + (r4[1] + r4[3]);
    let inv = if denom > 0.0 { 1.0 / denom } else { 0.0 };
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a * inv;
    }
}

/// How one sequence is cut into items.
#[derive(Debug, Clone, Copy)]
struct SeqPlan {
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
        attend_item(q, k_cache, v_cache, table, s, it, shape, dst);
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

/// The first `len` values of `buf`, zeroed; the rest stays untouched (the buffers are sized for
/// the largest heads, and zeroing them whole cost more than a short decode's attention).
fn zeroed(
    buf: &mut std::mem::MaybeUninit<[f32; MAX_PAIRS * MAX_HEAD_DIM]>,
    len: usize,
) -> &mut [f32] {
    assert!(len <= MAX_PAIRS * MAX_HEAD_DIM);
    let ptr = buf.as_mut_ptr() as *mut f32;
    // SAFETY: `len` values fit in the buffer, and all of them are written before the slice is
    // made.
    unsafe {
        std::ptr::write_bytes(ptr, 0, len);
        std::slice::from_raw_parts_mut(ptr, len)
    }
}

/// Where an item's results go: normalized outputs, or one part's states for the later fold.
#[derive(Clone, Copy)]
enum Dest<'a> {
    Out(&'a DisjointMut<f32>),
    Partials {
        shared: &'a DisjointMut<f32>,
        base: usize,
        parts: usize,
    },
}

/// Runs one item. Its heads may span two KV heads only when single heads are items, so the
/// loop goes KV head by KV head.
#[allow(clippy::too_many_arguments)]
fn attend_item<E: KvElem>(
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    table: &[u32],
    seq: &SeqSlice,
    it: Item,
    shape: &AttentionShape,
    dst: Dest<'_>,
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
        let pairs = &pairs[..n];
        let first_pos = seq.context_len - seq.query_len;
        let origin = (seq.query_start, first_pos);
        let mut part_buf = std::mem::MaybeUninit::uninit();
        let part_acc = zeroed(&mut part_buf, n * hd);
        let mut part_st = [SoftmaxState::EMPTY; MAX_PAIRS];
        let job = |part| PairsJob {
            q,
            k_cache,
            v_cache,
            table,
            pairs,
            origin,
            kv_head,
            shape,
            part,
        };
        match dst {
            Dest::Partials {
                shared,
                base,
                parts,
            } => {
                let p = it.parts.0;
                let acc = &mut *part_acc;
                attend_pairs(&job(p), &mut part_st, acc);
                let stride = hd + 1 + LANES;
                for (k, &(t, hh)) in pairs.iter().enumerate() {
                    let o = base + (((t - seq.query_start) * nh + hh) * parts + p) * stride;
                    // SAFETY: each (token, head, part) slot belongs to exactly one item.
                    let slot = unsafe { shared.slice(o, stride) };
                    slot[..hd].copy_from_slice(&acc[k * hd..(k + 1) * hd]);
                    slot[hd] = part_st[k].max;
                    slot[hd + 1..].copy_from_slice(&part_st[k].denom);
                }
            }
            Dest::Out(out) if it.parts.1 - it.parts.0 == 1 => {
                // One part: its state is the whole state (folding it into an empty one would
                // copy it), normalized straight from its buffers.
                let acc = &mut *part_acc;
                attend_pairs(&job(it.parts.0), &mut part_st, acc);
                for (k, &(t, hh)) in pairs.iter().enumerate() {
                    // SAFETY: each (token, head) pair belongs to exactly one item.
                    let o = unsafe { out.slice((t * nh + hh) * hd, hd) };
                    normalize(&part_st[k], &acc[k * hd..(k + 1) * hd], o);
                }
            }
            Dest::Out(out) => {
                let mut run_buf = std::mem::MaybeUninit::uninit();
                let run_acc = zeroed(&mut run_buf, n * hd);
                let mut run_st = [SoftmaxState::EMPTY; MAX_PAIRS];
                for p in it.parts.0..it.parts.1 {
                    let acc = &mut *part_acc;
                    if p > it.parts.0 {
                        acc.fill(0.0);
                    }
                    attend_pairs(&job(p), &mut part_st, acc);
                    for k in 0..n {
                        let span = k * hd..(k + 1) * hd;
                        fold(
                            &mut run_st[k],
                            &mut run_acc[span.clone()],
                            &part_st[k],
                            &acc[span],
                        );
                    }
                }
                for (k, &(t, hh)) in pairs.iter().enumerate() {
                    // SAFETY: each (token, head) pair belongs to exactly one item.
                    let o = unsafe { out.slice((t * nh + hh) * hd, hd) };
                    normalize(&run_st[k], &run_acc[k * hd..(k + 1) * hd], o);
                }
            }
        }
        h = h_end;
    }
}

/// Attention of `pairs` (token, query head), all on `kv_head`, over the keys of softmax part
/// `part`; token `t` sits at position `t - origin.0 + origin.1`.
struct PairsJob<'a, E> {
    q: &'a [f32],
    k_cache: &'a [E],
    v_cache: &'a [E],
    table: &'a [u32],
    pairs: &'a [(usize, usize)],
    origin: (usize, usize),
    kv_head: usize,
    shape: &'a AttentionShape,
    part: usize,
}

/// Runs `job`, setting each pair's state and accumulating its unnormalized weighted values
/// into `acc` (`[pairs, head_dim]`, zero on entry: the callers zero it once), in the widest
/// build this CPU has (plain loops compiled with AVX-512 or AVX2, as `simd::multiversion!`
/// does, plus the build's own f16 widening). Every build gives the same bits.
fn attend_pairs<E: KvElem>(job: &PairsJob<'_, E>, st: &mut [SoftmaxState], acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::kv_dtype::sealed::{Avx2, Avx512};
        #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
        unsafe fn wide512<E: KvElem>(
            job: &PairsJob<'_, E>,
            st: &mut [SoftmaxState],
            acc: &mut [f32],
        ) {
            attend_pairs_impl::<E, Avx512>(job, st, acc)
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn wide256<E: KvElem>(
            job: &PairsJob<'_, E>,
            st: &mut [SoftmaxState],
            acc: &mut [f32],
        ) {
            attend_pairs_impl::<E, Avx2>(job, st, acc)
        }
        match simd::level() {
            // SAFETY: the CPU has the features these builds enable (`level` checks F16C too).
            simd::SimdLevel::Avx512 => return unsafe { wide512(job, st, acc) },
            // SAFETY: as above.
            simd::SimdLevel::Avx2 => return unsafe { wide256(job, st, acc) },
            simd::SimdLevel::Baseline => {}
        }
    }
    attend_pairs_impl::<E, Portable>(job, st, acc)
}

/// Online softmax, a block at a time, for every pair: scores over the block's visible keys,
/// the running maximum (rescaling what was summed so far when it grows), then the weighted
/// values. Each pair's arithmetic depends only on its own query and keys.
#[inline(always)]
fn attend_pairs_impl<E: KvElem, W: Isa>(
    job: &PairsJob<'_, E>,
    st: &mut [SoftmaxState],
    out: &mut [f32],
) {
    let &PairsJob {
        q,
        k_cache,
        v_cache,
        table,
        pairs,
        origin,
        kv_head,
        shape,
        part,
    } = job;
    let (bs, hd, nh) = (shape.block_size, shape.head_dim, shape.num_heads);
    st.iter_mut().for_each(|s| *s = SoftmaxState::EMPTY);
    let pos = |t: usize| t - origin.0 + origin.1;
    let last_pos = pairs.iter().map(|&(t, _)| pos(t)).max().unwrap_or(0);
    let first_pos = pairs.iter().map(|&(t, _)| pos(t)).min().unwrap_or(0);
    let lowest = match shape.sliding_window {
        Some(w) => (first_pos + 1).saturating_sub(w),
        None => 0,
    };
    // Keys of this part, clipped to what any pair sees.
    let (part_lo, part_hi) = (part * PART, (part + 1) * PART);
    let (key_lo, key_hi) = (lowest.max(part_lo), (last_pos + 1).min(part_hi));
    if key_lo >= key_hi {
        return;
    }
    let (b_lo, b_hi) = (key_lo / bs, (key_hi - 1) / bs);
    // Each (block, KV head) is its own few KiB somewhere in the cache, and the hardware
    // prefetcher does not cross into it: the first run through a block fetches the keys and
    // values of the block AHEAD places on into L1, and of the block FAR places on into L2, while
    // it computes (one block's work is shorter than a trip to memory, and more lines in flight
    // keep memory busier: 16 sequences' decode ran 1.15x faster with the L2 lead than without);
    // the blocks before those are fetched here. The item before this one brought the first
    // WARM_BLOCKS towards L2 already.
    const AHEAD: usize = 2;
    const FAR: usize = 4;
    let block_kv = |bi: usize| {
        let n = shape.block_base(table[bi] as usize, kv_head);
        (&k_cache[n..n + bs * hd], &v_cache[n..n + bs * hd])
    };
    for bi in b_lo + 1..(b_lo + AHEAD).min(b_hi + 1) {
        let (k, v) = block_kv(bi);
        prefetch(k);
        prefetch(v);
    }
    for bi in b_lo + AHEAD..(b_lo + FAR).min(b_hi + 1) {
        let (k, v) = block_kv(bi);
        prefetch_l2(k);
        prefetch_l2(v);
    }
    for bi in b_lo..=b_hi {
        let (keys, vals) = block_kv(bi);
        let mut next = (bi + AHEAD <= b_hi).then(|| block_kv(bi + AHEAD));
        let mut far = (bi + FAR <= b_hi).then(|| block_kv(bi + FAR));
        let block_start = bi * bs;
        // Runs of pairs of one token (its query heads on this KV head) see the same keys and
        // go through the block together, up to MAX_RUN at a time.
        let mut k0 = 0;
        while k0 < pairs.len() {
            let t = pairs[k0].0;
            let mut k1 = k0 + 1;
            while k1 < pairs.len() && k1 - k0 < MAX_RUN && pairs[k1].0 == t {
                k1 += 1;
            }
            let pos = pos(t);
            let first = match shape.sliding_window {
                Some(w) => (pos + 1).saturating_sub(w),
                None => 0,
            };
            let lo = first.max(block_start).max(part_lo);
            let hi = (pos + 1).min(block_start + bs).min(part_hi);
            if lo < hi {
                let run = Run {
                    pairs: &pairs[k0..k1],
                    first: k0,
                    range: (lo - block_start, hi - block_start),
                    next: next.take(),
                    far: far.take(),
                };
                let qv = |h: usize| &q[(t * nh + h) * hd..][..hd];
                match (bs, hd, run.pairs.len()) {
                    (16, 64, 1) => {
                        block_fast::<E, W, 64, 1>(&run, q, t, nh, keys, vals, shape.scale, st, out)
                    }
                    (16, 64, 2) => {
                        block_fast::<E, W, 64, 2>(&run, q, t, nh, keys, vals, shape.scale, st, out)
                    }
                    (16, 64, 3) => {
                        block_fast::<E, W, 64, 3>(&run, q, t, nh, keys, vals, shape.scale, st, out)
                    }
                    (16, 64, 4) => {
                        block_fast::<E, W, 64, 4>(&run, q, t, nh, keys, vals, shape.scale, st, out)
                    }
                    (16, 128, 1) => {
                        block_fast::<E, W, 128, 1>(&run, q, t, nh, keys, vals, shape.scale, st, out)
                    }
                    (16, 128, 2) => {
                        block_fast::<E, W, 128, 2>(&run, q, t, nh, keys, vals, shape.scale, st, out)
                    }
                    (16, 128, 3) => {
                        block_fast::<E, W, 128, 3>(&run, q, t, nh, keys, vals, shape.scale, st, out)
                    }
                    (16, 128, 4) => {
                        block_fast::<E, W, 128, 4>(&run, q, t, nh, keys, vals, shape.scale, st, out)
                    }
                    _ => {
                        if let Some((nk, nv)) = run.next {
                            prefetch(nk);
                            prefetch(nv);
                        }
                        if let Some((fk, fv)) = run.far {
                            prefetch_l2(fk);
                            prefetch_l2(fv);
                        }
                        for (k, &(_, h)) in run.pairs.iter().enumerate() {
                            let p = run.first + k;
                            block_any(
                                qv(h),
                                keys,
                                vals,
                                bs,
                                run.range,
                                shape.scale,
                                &mut st[p],
                                &mut out[p * hd..(p + 1) * hd],
                            );
                        }
                    }
                }
            }
            k0 = k1;
        }
    }
}

/// Asks for every cache line of `data` to be brought towards the core (a hint: no effect on
/// results, none at all off x86-64).
#[inline(always)]
fn prefetch<E>(data: &[E]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_with::<{ std::arch::x86_64::_MM_HINT_T0 }, E>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// [`prefetch`] into L2 only.
#[inline(always)]
fn prefetch_l2<E>(data: &[E]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_with::<{ std::arch::x86_64::_MM_HINT_T1 }, E>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Prefetches every cache line of `data` with hint `HINT`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_with<const HINT: i32, E>(data: &[E]) {
    for line in data.chunks(64 / std::mem::size_of::<E>()) {
        // SAFETY: a prefetch reads nothing architecturally, and the address is inside `data`.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(line.as_ptr() as *const i8) };
    }
}

/// Sequences of a batch whose first items are indexed for [`paged_attention`]'s items to find.
const INDEXED: usize = 256;

/// Blocks of the next item brought towards L2 while an item runs.
const WARM_BLOCKS: usize = 2;

/// Most pairs of one token that go through a block together.
const MAX_RUN: usize = 4;

/// Pairs of one token against one block: `first` is the index of the first pair, `range` the
/// visible keys of the block.
struct Run<'a, E> {
    pairs: &'a [(usize, usize)],
    first: usize,
    range: (usize, usize),
    /// Keys and values of the block that comes next, to prefetch meanwhile.
    next: Option<(&'a [E], &'a [E])>,
    /// Keys and values of a block further on, to bring into L2 meanwhile.
    far: Option<(&'a [E], &'a [E])>,
}

/// The maximum of a block's visible scores (keys `lo..hi`): lane maxima, then their fold
/// (exact in any order; minus infinity when none is visible).
#[inline(always)]
fn visible_max(scores: &[f32], (lo, hi): (usize, usize)) -> f32 {
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
fn softmax_step(
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

/// One pair against a block of any size (the reference arithmetic).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn block_any<E: KvElem>(
    qv: &[f32],
    keys: &[E],
    vals: &[E],
    bs: usize,
    range: (usize, usize),
    scale: f32,
    s: &mut SoftmaxState,
    acc: &mut [f32],
) {
    let hd = qv.len();
    let mut scores = [0f32; MAX_BLOCK_SIZE];
    let mut probs = [0f32; MAX_BLOCK_SIZE];
    block_scores_any(qv, keys, bs, &mut scores[..bs]);
    scores[..bs].iter_mut().for_each(|sc| *sc *= scale);
    let block_max = visible_max(&scores[..bs], range);
    softmax_step(block_max, &scores[..bs], range, s, acc, &mut probs[..bs]);
    let (lo, hi) = range;
    weighted_values_any(acc, &probs[lo..hi], &vals[lo * hd..hi * hd]);
}

/// `NP` pairs of one token against a block of 16 keys with head size `HD`: the block's keys
/// and values are loaded once for all of them, and their accumulators give independent chains.
/// Each pair's arithmetic is exactly [`block_any`]'s.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // register arrays read best indexed
#[inline(always)]
fn block_fast<E: KvElem, W: Isa, const HD: usize, const NP: usize>(
    run: &Run<'_, E>,
    q: &[f32],
    t: usize,
    nh: usize,
    keys: &[E],
    vals: &[E],
    scale: f32,
    st: &mut [SoftmaxState],
    out: &mut [f32],
) {
    const BS: usize = 16;
    let qs: [&[f32; HD]; NP] = std::array::from_fn(|k| {
        let at = (t * nh + run.pairs[k].1) * HD;
        q[at..at + HD].try_into().expect("HD values")
    });
    // Without a next block, the prefetches touch this one (in cache): no branch in the loops.
    let (next_k, next_v) = run.next.unwrap_or((keys, vals));
    let (far_k, far_v) = run.far.unwrap_or((keys, vals));
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
            scores[j] = ((part[k][0][j] + part[k][1][j]) + (part[k][2][j] + part[k][3][j])) * scale;
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
fn block_scores_any<E: KvElem>(q: &[f32], keys: &[E], bs: usize, out: &mut [f32]) {
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
fn weighted_values_any<E: KvElem>(acc: &mut [f32], probs: &[f32], vals: &[E]) {
    for (&p, v) in probs.iter().zip(vals.chunks_exact(acc.len())) {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a = p.mul_add(x.to_f32(), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dense causal attention for one sequence whose cache blocks are laid out in `table` order.
    #[test]
    fn parallel_kv_writes_equal_serial_ones() {
        // 24 tokens over shuffled blocks, f16 and f32 caches: the same bits either way.
        let shape = AttentionShape {
            num_heads: 6,
            num_kv_heads: 3,
            head_dim: 64,
            block_size: 4,
            scale: 0.125,
            sliding_window: None,
        };
        let n = 24;
        let row = shape.num_kv_heads * shape.head_dim;
        let k: Vec<f32> = (0..n * row).map(|i| (i as f32 * 0.37).sin()).collect();
        let v: Vec<f32> = (0..n * row).map(|i| (i as f32 * 0.91).cos()).collect();
        let slots: Vec<u32> = (0..n as u32).map(|j| (j / 4 * 5 % 7) * 4 + j % 4).collect();
        let len = 7 * row * shape.block_size;
        let pool = ThreadPool::new(2).expect("pool");
        fn check<E: KvElem + PartialEq + std::fmt::Debug>(
            pool: &ThreadPool,
            k: &[f32],
            v: &[f32],
            slots: &[u32],
            shape: &AttentionShape,
            len: usize,
        ) {
            let zero = E::from_f32(0.0);
            let (mut ks, mut vs) = (vec![zero; len], vec![zero; len]);
            write_kv(k, v, slots, shape, &mut ks, &mut vs);
            let (mut kp, mut vp) = (vec![zero; len], vec![zero; len]);
            write_kv_par(pool, k, v, slots, shape, &mut kp, &mut vp);
            assert!(ks == kp && vs == vp);
            assert!(ks.iter().any(|&x| x != zero));
        }
        check::<f32>(&pool, &k, &v, &slots, &shape, len);
        check::<half::f16>(&pool, &k, &v, &slots, &shape, len);
    }

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
        paged_attention(
            &pool,
            &q,
            &kc,
            &vc,
            &seqs,
            &table,
            &shape,
            &mut out,
            &mut Vec::new(),
        );
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
            paged_attention(
                &pool,
                q,
                &kc,
                &vc,
                seqs,
                table,
                &shape,
                &mut out,
                &mut Vec::new(),
            );
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
    fn more_sequences_than_indexed_find_their_items() {
        // 300 one-token decodes (past INDEXED, whose items the walk finds) over one shared
        // cache: each sequence's rows equal the sequence run alone.
        let shape = AttentionShape {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim: 16,
            block_size: 4,
            scale: 0.25,
            sliding_window: None,
        };
        let f = |i: usize, s: f32| ((i as f32) * s).sin();
        let cache_len = 5 * 2 * 4 * 16;
        let kc: Vec<f32> = (0..cache_len).map(|i| f(i, 0.7)).collect();
        let vc: Vec<f32> = (0..cache_len).map(|i| f(i, 1.1)).collect();
        let n = INDEXED + 44;
        let tables: Vec<u32> = (0..n)
            .flat_map(|s| (0..3).map(move |b| ((s + b) % 5) as u32))
            .collect();
        let seq = |s: usize, start: usize, table_start: usize| SeqSlice {
            query_start: start,
            query_len: 1,
            context_len: 9 + s % 4,
            block_table_start: table_start,
            num_blocks: 3,
        };
        let seqs: Vec<SeqSlice> = (0..n).map(|s| seq(s, s, 3 * s)).collect();
        let q: Vec<f32> = (0..n * 6 * 16).map(|i| f(i, 0.3)).collect();
        let pool = ThreadPool::new(2).unwrap();
        let mut all = vec![0f32; q.len()];
        let mut partials = Vec::new();
        paged_attention(
            &pool,
            &q,
            &kc,
            &vc,
            &seqs,
            &tables,
            &shape,
            &mut all,
            &mut partials,
        );
        for s in 0..n {
            let mut one = vec![0f32; 96];
            paged_attention(
                &pool,
                &q[s * 96..(s + 1) * 96],
                &kc,
                &vc,
                &[seq(s, 0, 0)],
                &tables[3 * s..3 * s + 3],
                &shape,
                &mut one,
                &mut partials,
            );
            assert_eq!(one, all[s * 96..(s + 1) * 96], "sequence {s}");
        }
    }

    /// A decode over several softmax parts (split across the pool, folded after) gives the
    /// same bits as the same token inside a prefill (parts folded in the item), for the fast
    /// and the general block and head sizes, with and without a sliding window.
    #[test]
    fn split_decodes_equal_prefill_rows() {
        for (bs, hd, window) in [(16, 64, None), (8, 16, None), (16, 64, Some(300))] {
            let shape = AttentionShape {
                num_heads: 6,
                num_kv_heads: 2,
                head_dim: hd,
                block_size: bs,
                scale: 0.3,
                sliding_window: window,
            };
            let len = 2 * PART + 37;
            let kvw = 2 * hd;
            let nb = len.div_ceil(bs);
            // Blocks in reverse order, to go through the table.
            let table: Vec<u32> = (0..nb as u32).rev().collect();
            let f = |i: usize, s: f32| ((i as f32) * s).sin();
            let k: Vec<f32> = (0..len * kvw).map(|i| f(i, 0.7)).collect();
            let v: Vec<f32> = (0..len * kvw).map(|i| f(i, 1.1)).collect();
            let slots: Vec<u32> = (0..len)
                .map(|j| table[j / bs] * bs as u32 + (j % bs) as u32)
                .collect();
            let cache_len = nb * kvw * bs;
            let (mut kc, mut vc) = (vec![0f32; cache_len], vec![0f32; cache_len]);
            write_kv(&k, &v, &slots, &shape, &mut kc, &mut vc);
            let row = 6 * hd;
            let q: Vec<f32> = (0..len * row).map(|i| f(i, 0.013)).collect();
            let pool = ThreadPool::new(2).unwrap();
            let mut prefill = vec![0f32; q.len()];
            let whole = SeqSlice {
                query_start: 0,
                query_len: len,
                context_len: len,
                block_table_start: 0,
                num_blocks: nb,
            };
            let mut partials = Vec::new();
            paged_attention(
                &pool,
                &q,
                &kc,
                &vc,
                &[whole],
                &table,
                &shape,
                &mut prefill,
                &mut partials,
            );
            // The last two tokens as a 2-token decode, and a middle one alone.
            for (first, n) in [(len - 2, 2), (PART + 3, 1)] {
                let seq = SeqSlice {
                    query_start: 0,
                    query_len: n,
                    context_len: first + n,
                    block_table_start: 0,
                    num_blocks: nb,
                };
                let mut out = vec![0f32; n * row];
                paged_attention(
                    &pool,
                    &q[first * row..(first + n) * row],
                    &kc,
                    &vc,
                    &[seq],
                    &table,
                    &shape,
                    &mut out,
                    &mut partials,
                );
                assert_eq!(
                    out,
                    prefill[first * row..(first + n) * row],
                    "bs {bs} hd {hd} window {window:?} tokens {first}+{n}"
                );
            }
        }
    }

    /// Attention over an f16 or bf16 cache gives exactly the bits of attention over an f32
    /// cache holding the same rounded values, on the fast and the general block paths, for a
    /// prefill and for decodes split by part.
    #[test]
    fn half_caches_equal_an_f32_cache_of_the_rounded_values() {
        fn check<E: KvElem>() {
            for (bs, hd, window) in [(16, 64, None), (8, 16, Some(100)), (16, 128, None)] {
                let shape = AttentionShape {
                    num_heads: 6,
                    num_kv_heads: 2,
                    head_dim: hd,
                    block_size: bs,
                    scale: 0.3,
                    sliding_window: window,
                };
                let len = PART + 45;
                let kvw = 2 * hd;
                let nb = len.div_ceil(bs);
                let table: Vec<u32> = (0..nb as u32).rev().collect();
                let f = |i: usize, s: f32| ((i as f32) * s).sin() * 3.0;
                let k: Vec<f32> = (0..len * kvw).map(|i| f(i, 0.7)).collect();
                let v: Vec<f32> = (0..len * kvw).map(|i| f(i, 1.1)).collect();
                let rounded = |x: &[f32]| -> Vec<f32> {
                    x.iter().map(|&x| E::from_f32(x).to_f32()).collect()
                };
                let (kr, vr) = (rounded(&k), rounded(&v));
                assert_ne!(kr, k, "{:?} should round", E::DTYPE);
                let slots: Vec<u32> = (0..len)
                    .map(|j| table[j / bs] * bs as u32 + (j % bs) as u32)
                    .collect();
                let cache_len = nb * kvw * bs;
                let (mut kh, mut vh) = (
                    super::super::zeroed_vec::<E>(cache_len),
                    super::super::zeroed_vec::<E>(cache_len),
                );
                write_kv(&k, &v, &slots, &shape, &mut kh, &mut vh);
                let (mut kf, mut vf) = (vec![0f32; cache_len], vec![0f32; cache_len]);
                write_kv(&kr, &vr, &slots, &shape, &mut kf, &mut vf);
                let row = 6 * hd;
                let q: Vec<f32> = (0..len * row).map(|i| f(i, 0.013)).collect();
                let pool = ThreadPool::new(2).unwrap();
                let mut partials = Vec::new();
                // The whole prompt, then its last token as a decode (split by part).
                for (first, n) in [(0, len), (len - 1, 1)] {
                    let seq = SeqSlice {
                        query_start: 0,
                        query_len: n,
                        context_len: first + n,
                        block_table_start: 0,
                        num_blocks: nb,
                    };
                    let qs = &q[first * row..(first + n) * row];
                    let mut half = vec![0f32; n * row];
                    let mut full = vec![0f32; n * row];
                    paged_attention(
                        &pool,
                        qs,
                        &kh,
                        &vh,
                        &[seq],
                        &table,
                        &shape,
                        &mut half,
                        &mut partials,
                    );
                    paged_attention(
                        &pool,
                        qs,
                        &kf,
                        &vf,
                        &[seq],
                        &table,
                        &shape,
                        &mut full,
                        &mut partials,
                    );
                    assert_eq!(
                        half,
                        full,
                        "{:?} bs {bs} hd {hd} tokens {first}+{n}",
                        E::DTYPE
                    );
                }
            }
        }
        check::<half::f16>();
        check::<half::bf16>();
    }

    #[test]
    fn fast_paths_equal_the_general_ones() {
        let f = |i: usize, s: f32| ((i as f32) * s).sin();
        let q: Vec<f32> = (0..4 * 64).map(|i| f(i, 0.37)).collect();
        let keys: Vec<f32> = (0..64 * 16).map(|i| f(i, 0.11)).collect();
        let vals: Vec<f32> = (0..64 * 16).map(|i| f(i, 0.23)).collect();
        let pairs = [(0usize, 0usize), (0, 1), (0, 2), (0, 3)];
        for range in [(0, 16), (3, 11)] {
            // Two blocks in a row, so the second one rescales.
            let mut want_st = [SoftmaxState::EMPTY; 4];
            let mut want = vec![0f32; 4 * 64];
            for _ in 0..2 {
                for (p, &(_, h)) in pairs.iter().enumerate() {
                    block_any(
                        &q[h * 64..(h + 1) * 64],
                        &keys,
                        &vals,
                        16,
                        range,
                        0.125,
                        &mut want_st[p],
                        &mut want[p * 64..(p + 1) * 64],
                    );
                }
            }
            let mut st = [SoftmaxState::EMPTY; 4];
            let mut got = vec![0f32; 4 * 64];
            for _ in 0..2 {
                let run = Run {
                    pairs: &pairs[..3],
                    first: 0,
                    range,
                    next: None,
                    far: None,
                };
                block_fast::<f32, Portable, 64, 3>(
                    &run, &q, 0, 4, &keys, &vals, 0.125, &mut st, &mut got,
                );
                let run = Run {
                    pairs: &pairs[3..],
                    first: 3,
                    range,
                    next: None,
                    far: None,
                };
                block_fast::<f32, Portable, 64, 1>(
                    &run, &q, 0, 4, &keys, &vals, 0.125, &mut st, &mut got,
                );
            }
            assert_eq!(got, want, "{range:?}");
            for (a, b) in st.iter().zip(&want_st) {
                assert_eq!((a.max, a.denom), (b.max, b.denom));
            }
        }
    }
}
