//! Where a tiled product's kernel call stores its results.
//!
//! A call computes tiles of sixteen weight rows (output columns) against a few activation rows
//! and stores each tile's sixteen values straight from its registers, either into the product's
//! output `[m, n]` (production: no result buffer, no copy) or into a buffer of whole tiles
//! (tests). Invariant: a call stores only values whose column is under `cols` (counted from the
//! call's first tile), so the padding rows of a weight's last tile never reach the output and a
//! task writes nothing outside the columns it owns.

use super::qpack::TILE;
use super::DisjointMut;

/// The result of tile `tiles.start + j` against activation row `i` goes to
/// `base + i * row_stride + j * tile_stride`, those of its sixteen values whose column (counted
/// from the call's first tile) is under `cols`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dst {
    pub(super) base: *mut f32,
    pub(super) row_stride: usize,
    pub(super) tile_stride: usize,
    pub(super) cols: usize,
}

impl Dst {
    /// Into `out` (`[m, n]`, row-major) for a call whose first tile is `first_tile` and whose
    /// first activation row is row `i` of `out`. The address is formed with wrapping
    /// arithmetic; the caller's stores must stay inside `out` (`i < m`, `TILE * first_tile < n`).
    pub(super) fn output(out: &DisjointMut<f32>, n: usize, first_tile: usize, i: usize) -> Dst {
        Dst {
            base: out.ptr.wrapping_add(i * n + TILE * first_tile),
            row_stride: n,
            tile_stride: TILE,
            cols: n.saturating_sub(TILE * first_tile),
        }
    }

    /// Into whole tiles of `res`, tile `j` against row `i` at `res[j * rows + i]` (every value
    /// stored, padding rows included).
    pub(super) fn buffer(res: &mut [[f32; TILE]], rows: usize) -> Dst {
        Dst {
            base: res.as_mut_ptr() as *mut f32,
            row_stride: TILE,
            tile_stride: TILE * rows,
            cols: usize::MAX,
        }
    }

    /// Where tile `j`'s result against row `i` starts, and how many of its values are stored.
    #[inline(always)]
    pub(super) fn at(&self, i: usize, j: usize) -> (*mut f32, usize) {
        let live = self.cols.saturating_sub(TILE * j).min(TILE);
        (
            self.base
                .wrapping_add(i * self.row_stride + j * self.tile_stride),
            live,
        )
    }

    /// Stores `v` as tile `j`'s result against row `i` (its live values only).
    ///
    /// # Safety
    /// The live values' addresses are writable and nobody else's.
    #[inline(always)]
    pub(super) unsafe fn put(&self, i: usize, j: usize, v: &[f32; TILE]) {
        let (p, live) = self.at(i, j);
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p, live) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_addresses_stop_at_the_last_column() {
        // [4, 40]: tiles 0..3 (the last one 8 live columns).
        let mut out = vec![0f32; 4 * 40];
        let o = DisjointMut::new(&mut out);
        let d = Dst::output(&o, 40, 1, 2);
        let (p0, live0) = d.at(0, 0);
        let (p1, live1) = d.at(1, 1);
        assert_eq!((p0 as usize - o.ptr as usize) / 4, 2 * 40 + 16);
        assert_eq!(live0, 16);
        assert_eq!((p1 as usize - o.ptr as usize) / 4, 3 * 40 + 32);
        assert_eq!(live1, 8);
        assert_eq!(Dst::output(&o, 40, 3, 0).at(0, 0).1, 0);
    }

    #[test]
    fn buffer_addresses_are_tile_major() {
        let mut res = vec![[0f32; TILE]; 6];
        let base = res.as_ptr() as usize;
        let d = Dst::buffer(&mut res, 3);
        let (p, live) = d.at(2, 1);
        assert_eq!((p as usize - base) / 4, (3 + 2) * TILE);
        assert_eq!(live, TILE);
    }
}
