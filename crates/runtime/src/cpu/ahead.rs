//! The share of the next tile group that a tiled matmul kernel call prefetches.
//!
//! With more activation rows than one kernel call takes (batched decode, prefill), a group of
//! tiles stays in cache while the rows pass it a call at a time. Each kernel also runs a fixed
//! lead over its own stream, which brings the group in on the first pass (and from L2 to L1 on
//! every pass once a group outgrows L1). But with few passes (a 16-row decode step: four), the
//! first pass then fetches the whole group from memory while the later ones fetch nothing, and
//! the first pass waits: such products ran 30% below their speed from cache. So each of a
//! group's last [`SPLIT`] passes also fetches a share of the next group, spreading the memory
//! traffic over them. With many passes ([`MAX_SPLIT_PASSES`]) the first pass's wait is a small
//! part of the group's time, and the extra prefetches cost more than they save.
//!
//! A call walks its tiles' units (a block of a block-quantized tile, a column pair of a bf16
//! tile) in order, and at its `i`-th unit fetches bytes `from + i * step .. + step` of the
//! weight's tile data. Prefetches are hints: they never change a result, addresses are formed
//! with wrapping arithmetic and never dereferenced, and ones past the weight's end are harmless.

/// A kernel call's share of the next group, in bytes of the weight's tile data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ahead {
    /// Where the first unit's share starts.
    pub from: usize,
    /// Bytes per unit (0: none).
    pub step: usize,
}

/// Bytes of a cache line.
const LINE: usize = 64;
/// How many of a group's last passes fetch the next group (earlier passes fetch nothing, so
/// the next group does not crowd the current one out of L1 while later passes still read it).
pub const SPLIT: usize = 4;
/// Groups passed more often than this fetch nothing ahead.
pub const MAX_SPLIT_PASSES: usize = 8;

impl Ahead {
    /// Nothing to fetch (a single pass: the kernel's own lead does it).
    pub const NONE: Ahead = Ahead { from: 0, step: 0 };

    /// Pass `pass` of `passes` over `tiles` (of `tile_bytes`, `units` units each): its share of
    /// the as many tiles that follow.
    pub fn split(
        tiles: std::ops::Range<usize>,
        tile_bytes: usize,
        units: usize,
        pass: usize,
        passes: usize,
    ) -> Ahead {
        let fetching = passes.clamp(1, SPLIT);
        let k = match (pass + fetching).checked_sub(passes) {
            Some(k) if passes > 1 && passes <= MAX_SPLIT_PASSES => k,
            _ => return Ahead::NONE,
        };
        let share = (tiles.len() * tile_bytes).div_ceil(fetching);
        Ahead {
            from: tiles.end * tile_bytes + k * share,
            step: share.div_ceil((tiles.len() * units).max(1)),
        }
    }

    /// The lines unit `i` fetches, as byte offsets (for tests).
    pub fn lines(&self, i: usize) -> impl Iterator<Item = usize> {
        let lo = self.from + i * self.step;
        (lo / LINE * LINE..lo + self.step).step_by(LINE)
    }

    /// Prefetches unit `i`'s lines (as [`Ahead::lines`], in a plain loop: this runs once per
    /// unit in the kernels' inner loop); `base` is the first byte of the weight's tile data.
    #[inline(always)]
    pub fn fetch(&self, base: *const u8, i: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.step > 0 {
            let lo = self.from + i * self.step;
            let mut at = lo / LINE * LINE;
            while at < lo + self.step {
                // SAFETY: a prefetch reads nothing architecturally and cannot fault; the
                // address is only formed (wrapping), never dereferenced.
                unsafe {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at) as *const i8);
                }
                at += LINE;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (base, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_passes_of_a_group_share_the_next_group_between_them() {
        // A group of 4 tiles (tiles 8..12) of 18 blocks of 384 bytes, passed `passes` times:
        // together the passes fetch every line of tiles 12..16, the last few a share each.
        let (tile_bytes, units) = (18 * 384, 18);
        for passes in [2, 3, 4, 7, 8] {
            let mut lines = std::collections::BTreeSet::new();
            let fetching = passes.min(SPLIT);
            for pass in 0..passes {
                let a = Ahead::split(8..12, tile_bytes, units, pass, passes);
                let mine: Vec<usize> = (0..4 * units).flat_map(|i| a.lines(i)).collect();
                if pass < passes - fetching {
                    assert!(mine.is_empty(), "pass {pass} of {passes} fetches");
                }
                // A pass fetches about its share, not the whole group.
                assert!(mine.len() * 64 <= 4 * tile_bytes / fetching + 4 * units * 64);
                lines.extend(mine);
            }
            let next = 12 * tile_bytes..16 * tile_bytes;
            for at in next.clone().step_by(64) {
                assert!(
                    lines.contains(&at),
                    "{passes} passes: line {at} never fetched"
                );
            }
        }
        // One pass, or many: nothing.
        for (pass, passes) in [(0, 1), (31, 32), (8, 9)] {
            let a = Ahead::split(8..12, tile_bytes, units, pass, passes);
            assert_eq!(a, Ahead::NONE);
            assert_eq!(a.lines(3).count(), 0);
        }
    }
}
