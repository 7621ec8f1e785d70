//! Writing new tokens' keys and values into their cache slots, rounded to the cache's type.

use super::AttentionShape;
use crate::cpu::kv_dtype::KvElem;
use crate::cpu::DisjointMut;
use crate::ThreadPool;

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
pub(super) unsafe fn write_head<E: KvElem>(
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
