//! Writing new tokens' keys and values into their cache slots, rounded to the cache's type
//! (for int8, each (token, KV head) row quantized by groups, their scales stored beside it).

use super::{AttentionShape, MAX_HEAD_DIM};
use crate::cpu::kv_dtype::{KvElem, SCALE_GROUP};
use crate::cpu::DisjointMut;
use crate::ThreadPool;
use half::f16;

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
    assert!(
        !E::SCALED,
        "a scaled cache needs its scales: write_kv_scaled"
    );
    write_kv_scaled(
        None,
        k,
        v,
        slot_mapping,
        shape,
        (k_cache, v_cache, &mut [], &mut []),
    )
}

/// Batches of at least this many tokens write their keys and values in parallel.
pub(super) const PAR_WRITE_TOKENS: usize = 8;

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
    assert!(
        !E::SCALED,
        "a scaled cache needs its scales: write_kv_scaled"
    );
    write_kv_scaled(
        Some(pool),
        k,
        v,
        slot_mapping,
        shape,
        (k_cache, v_cache, &mut [], &mut []),
    )
}

/// [`write_kv`] (on the calling thread without a pool, else as [`write_kv_par`]) into a cache
/// of any type: `cache` is the keys, the values and, for a scaled type, their rows' scales
/// (`[num_blocks, num_kv_heads, groups, block_size]` each; unused and possibly empty otherwise).
pub fn write_kv_scaled<E: KvElem>(
    pool: Option<&ThreadPool>,
    k: &[f32],
    v: &[f32],
    slot_mapping: &[u32],
    shape: &AttentionShape,
    cache: (&mut [E], &mut [E], &mut [f16], &mut [f16]),
) {
    let (k_cache, v_cache, k_scales, v_scales) = cache;
    if E::SCALED {
        let n = k_cache.len() / shape.head_dim.max(1) * shape.scale_groups();
        assert!(
            k_scales.len() == n && v_scales.len() == n,
            "a scale per group of each cached row"
        );
    }
    let (kc, vc) = (DisjointMut::new(k_cache), DisjointMut::new(v_cache));
    let (ks, vs) = (DisjointMut::new(k_scales), DisjointMut::new(v_scales));
    let dst = |keys: bool| if keys { (k, &kc, &ks) } else { (v, &vc, &vs) };
    match pool {
        Some(pool) if slot_mapping.len() >= PAR_WRITE_TOKENS && pool.num_threads() > 1 => {
            pool.parallel_for(2 * shape.num_kv_heads, |i| {
                let (g, keys) = (i / 2, i % 2 == 0);
                let (src, cache, scales) = dst(keys);
                // SAFETY: task (g, cache) writes only head g's regions of that cache and its
                // scales, and no other task writes those.
                unsafe { write_head(src, slot_mapping, shape, g, (cache, scales), keys) };
            });
        }
        _ => {
            for g in 0..shape.num_kv_heads {
                for keys in [true, false] {
                    let (src, cache, scales) = dst(keys);
                    // SAFETY: one thread writes everything, one region at a time.
                    unsafe { write_head(src, slot_mapping, shape, g, (cache, scales), keys) };
                }
            }
        }
    }
}

/// Writes KV head `g` of every token (`src`: `[num_tokens, num_kv_heads * head_dim]`) into
/// `cache`: transposed within its block (`keys`) or as a row, with the row's scale for a scaled
/// type.
///
/// # Safety
/// No other thread touches head `g`'s regions of `cache` (or its scales) meanwhile.
pub(super) unsafe fn write_head<E: KvElem>(
    src: &[f32],
    slot_mapping: &[u32],
    shape: &AttentionShape,
    g: usize,
    (cache, scales): (&DisjointMut<E>, &DisjointMut<f16>),
    keys: bool,
) {
    let (hd, bs) = (shape.head_dim, shape.block_size);
    let row = shape.num_kv_heads * hd;
    let groups = shape.scale_groups();
    let mut sc = [f16::ZERO; MAX_HEAD_DIM / SCALE_GROUP];
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let (block, offset) = (slot as usize / bs, slot as usize % bs);
        let x = &src[t * row + g * hd..][..hd];
        // SAFETY: (block, head g) is one region of `cache`; the caller owns head g's regions.
        let region = unsafe { cache.slice(shape.block_base(block, g), bs * hd) };
        if keys {
            // Keys are transposed within the block: encoded into a row first.
            let mut r = [E::from_f32(0.0); MAX_HEAD_DIM];
            E::encode_row(x, &mut r[..hd], &mut sc[..groups]);
            for (d, &e) in r[..hd].iter().enumerate() {
                region[d * bs + offset] = e;
            }
        } else {
            E::encode_row(
                x,
                &mut region[offset * hd..(offset + 1) * hd],
                &mut sc[..groups],
            );
        }
        if E::SCALED {
            // SAFETY: (block, head g)'s scales are one region; the caller owns head g's.
            let dst = unsafe { scales.slice(shape.scale_base(block, g), groups * bs) };
            for (gi, &s) in sc[..groups].iter().enumerate() {
                dst[gi * bs + offset] = s;
            }
        }
    }
}
