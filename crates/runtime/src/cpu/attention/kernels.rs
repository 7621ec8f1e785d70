//! The kernels of paged attention: one work item's (token, head) pairs against the blocks of
//! its sequence, with an online softmax per pair, in f32 whatever the cache's type; the
//! per-block score and value loops for each instruction set; prefetch hints.

use super::block::*;
use super::softmax::*;
use super::{AttentionShape, RowScales, LANES, MAX_HEAD_DIM, MAX_PAIRS, PART};
use crate::cpu::kv_dtype::sealed::{Isa, Portable};
use crate::cpu::kv_dtype::KvElem;
use crate::cpu::{simd, DisjointMut};
use ferrum_types::batch::SeqSlice;

/// One work item of a sequence: its tokens `tokens.0..tokens.1`, query heads
/// `heads.0..heads.1` and softmax parts `parts.0..parts.1`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    pub(super) tokens: (usize, usize),
    pub(super) heads: (usize, usize),
    pub(super) parts: (usize, usize),
}

/// The first `len` values of `buf`, zeroed; the rest stays untouched (the buffers are sized for
/// the largest heads, and zeroing them whole cost more than a short decode's attention).
pub(super) fn zeroed(
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
pub(super) enum Dest<'a> {
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
pub(super) fn attend_item<E: KvElem>(
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    scales: RowScales<'_>,
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
            scales,
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
pub(super) struct PairsJob<'a, E> {
    q: &'a [f32],
    k_cache: &'a [E],
    v_cache: &'a [E],
    scales: RowScales<'a>,
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
pub(super) fn attend_pairs<E: KvElem>(
    job: &PairsJob<'_, E>,
    st: &mut [SoftmaxState],
    acc: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu::kv_dtype::sealed::{Avx2, Avx512};
        /// # Safety
        /// The CPU supports AVX-512F, AVX-512BW, AVX2, FMA and F16C (the caller checked
        /// `simd::level`).
        #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
        unsafe fn wide512<E: KvElem>(
            job: &PairsJob<'_, E>,
            st: &mut [SoftmaxState],
            acc: &mut [f32],
        ) {
            attend_pairs_impl::<E, Avx512>(job, st, acc)
        }
        /// # Safety
        /// The CPU supports AVX2, FMA and F16C (the caller checked `simd::level`).
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
pub(super) fn attend_pairs_impl<E: KvElem, W: Isa>(
    job: &PairsJob<'_, E>,
    st: &mut [SoftmaxState],
    out: &mut [f32],
) {
    let &PairsJob {
        q,
        k_cache,
        v_cache,
        scales,
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
        let (k_scales, v_scales) = if E::SCALED {
            let at = shape.scale_base(table[bi] as usize, kv_head);
            let r = at..at + shape.scale_groups() * bs;
            (&scales.k[r.clone()], &scales.v[r])
        } else {
            (&[][..], &[][..])
        };
        BlockKv {
            keys: &k_cache[n..n + bs * hd],
            vals: &v_cache[n..n + bs * hd],
            k_scales,
            v_scales,
        }
    };
    for bi in b_lo + 1..(b_lo + AHEAD).min(b_hi + 1) {
        block_kv(bi).prefetch();
    }
    for bi in b_lo + AHEAD..(b_lo + FAR).min(b_hi + 1) {
        block_kv(bi).prefetch_l2();
    }
    for bi in b_lo..=b_hi {
        let blk = block_kv(bi);
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
                // Soft-capped scores take the reference path (Gemma 2 only).
                let fast_bs = if shape.softcap.is_some() { 0 } else { bs };
                match (fast_bs, hd, run.pairs.len()) {
                    (16, 64, 1) => {
                        block_fast::<E, W, 64, 1>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 64, 2) => {
                        block_fast::<E, W, 64, 2>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 64, 3) => {
                        block_fast::<E, W, 64, 3>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 64, 4) => {
                        block_fast::<E, W, 64, 4>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 128, 1) => {
                        block_fast::<E, W, 128, 1>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 128, 2) => {
                        block_fast::<E, W, 128, 2>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 128, 3) => {
                        block_fast::<E, W, 128, 3>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 128, 4) => {
                        block_fast::<E, W, 128, 4>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    // Gemma's head size.
                    (16, 256, 1) => {
                        block_fast::<E, W, 256, 1>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 256, 2) => {
                        block_fast::<E, W, 256, 2>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 256, 3) => {
                        block_fast::<E, W, 256, 3>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    (16, 256, 4) => {
                        block_fast::<E, W, 256, 4>(&run, q, t, nh, blk, shape.scale, st, out)
                    }
                    _ => {
                        if let Some(n) = run.next {
                            n.prefetch();
                        }
                        if let Some(f) = run.far {
                            f.prefetch_l2();
                        }
                        for (k, &(_, h)) in run.pairs.iter().enumerate() {
                            let p = run.first + k;
                            block_any(
                                qv(h),
                                blk,
                                bs,
                                run.range,
                                shape.scale,
                                shape.softcap,
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
