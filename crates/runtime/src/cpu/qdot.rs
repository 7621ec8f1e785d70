//! Integer dot products of repacked weight tiles ([`PackedWeight`]) with 8-bit activation rows
//! ([`Q8Acts`]), for every block-quantized format.
//!
//! One arithmetic, every instruction set. For weight row `r` and activation row `a`, per
//! 32-element block `b` (per 16-element half for Q6_K's scales), the exact integer
//! `dot = Σ u·q - bias · Σq` is converted to f32 and accumulated with one fused multiply-add by
//! `w_scale * a_scale` (rounded product) into `acc`, blocks in order; formats with minimums
//! accumulate `min_b * (d_a Σq)_b` the same way into `macc`; the result is `acc + macc`. The
//! scalar reference spells this out per row; the SIMD kernels run sixteen rows at once, one
//! per 32-bit lane (AVX-512 VNNI: one register; AVX2: two halves), with the activation codes
//! broadcast four at a time, so all three agree to the bit, and a row's result never depends on
//! which other rows or activation rows share a call.
//!
//! A kernel call computes one tile of sixteen weight rows against one to four activation rows:
//! the tile's codes are unpacked once per block for all of them (prefill, batched decode).

pub use super::ahead::Ahead;
use super::dst::Dst;
pub use super::qacts::{ActRow, Q8Acts};
use super::qpack::{block_parts, k6_slot, Codes, PackFormat, PackedWeight, Scales, TILE};
pub use super::qpack::{QK, TILE as TILE_ROWS};
use super::DisjointMut;
use crate::DType;

/// Whether weights of `dtype` have an integer dot product here.
pub fn supports(dtype: DType) -> bool {
    PackFormat::of(dtype).is_some()
}

/// The instruction sets with a kernel, best first. NEON would slot in here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx512Vnni,
    Avx2,
    Scalar,
}

impl Isa {
    /// The best one this CPU has.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                return Isa::Avx512Vnni;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every set this CPU can run (for tests and benches).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        [Isa::Avx512Vnni, Isa::Avx2, Isa::Scalar]
            .into_iter()
            .filter(|&i| match best {
                Isa::Avx512Vnni => true,
                Isa::Avx2 => i != Isa::Avx512Vnni,
                Isa::Scalar => i == Isa::Scalar,
            })
            .collect()
    }
}

/// Activation rows one kernel call takes at most (the tile's codes are unpacked once for all).
pub const MAX_ACT_ROWS: usize = 4;

/// `out[j * acts.len() + i][l] = w[TILE * (tiles.start + j) + l] · acts[i]` for the sixteen
/// rows of every tile in `tiles` (padding rows give zeros) and one to four activation rows;
/// `isa` must be one of [`Isa::available`]. The AVX-512 kernel also prefetches `ahead`, a unit
/// per 32-element block (a hint only; the AVX2 one has not been measured with it).
pub fn dot_tiles(
    isa: Isa,
    w: &PackedWeight,
    tiles: std::ops::Range<usize>,
    acts: &[ActRow<'_>],
    ahead: Ahead,
    out: &mut [[f32; TILE]],
) {
    let na = acts.len();
    assert!(
        (1..=MAX_ACT_ROWS).contains(&na) && tiles.end <= w.tiles() && out.len() == tiles.len() * na,
        "dot_tiles: no product of tiles {tiles:?} of {} with {na} activation rows",
        w.tiles()
    );
    let nb = w.blocks();
    for a in acts {
        assert!(
            a.qs.len() == nb * QK
                && a.d.len() == nb
                && a.bsum.len() == nb
                && a.sum16.len() == 2 * nb,
            "dot_tiles: activations of {} elements against {nb} weight blocks",
            a.qs.len()
        );
    }
    let dst = Dst::buffer(out, na);
    // SAFETY: `isa` is available (the caller's contract), every row was checked against the
    // weight's blocks above, and `dst` addresses exactly `out`, whose length was checked.
    unsafe { call(isa, w, tiles, acts, ahead, dst) }
}

/// The kernel calls of [`dot_rows`] (checked by it): with at most [`MAX_ACT_ROWS`] rows one call
/// over all the tiles, else every group of `$group` tiles passed by the rows four at a time,
/// the group's last passes prefetching a share of the next. `|tiles, acts, ahead, dst| body`
/// makes each call. A macro, so that each instruction set's function expands the passes (and
/// its kernels) in its own build, crossing into it once per product share, not once per pass.
macro_rules! row_passes {
    ($w:expr, $tiles:expr, $acts:expr, $rows:expr, $group:expr, $out:expr,
     |$t:ident, $a:ident, $ah:ident, $d:ident| $body:expr) => {{
        let (w, tiles, acts, rows, out): (
            &PackedWeight,
            std::ops::Range<usize>,
            &Q8Acts,
            std::ops::Range<usize>,
            &DisjointMut<f32>,
        ) = ($w, $tiles, $acts, $rows, $out);
        let (n, nb) = (w.rows(), w.blocks());
        // `i` < `acts.rows()` and the tile's first column < `n`: inside `out`.
        let dst = |tiles: &std::ops::Range<usize>, i: usize| Dst::output(out, n, tiles.start, i);
        if rows.len() <= MAX_ACT_ROWS {
            let na = rows.len();
            let a = pass_rows(acts, rows.start, na);
            let ($t, $a, $ah, $d) = (
                tiles.clone(),
                &a[..na],
                Ahead::NONE,
                dst(&tiles, rows.start),
            );
            $body;
        } else {
            let passes = rows.len().div_ceil(MAX_ACT_ROWS);
            let group = ($group as usize).max(1);
            let mut t = tiles.start;
            while t < tiles.end {
                let g = t..(t + group).min(tiles.end);
                let mut i = rows.start;
                for pass in 0..passes {
                    let na = (rows.end - i).min(MAX_ACT_ROWS);
                    let a = pass_rows(acts, i, na);
                    let ahead = Ahead::split(g.clone(), w.tile_bytes(), nb, pass, passes);
                    let ($t, $a, $ah, $d) = (g.clone(), &a[..na], ahead, dst(&g, i));
                    $body;
                    i += na;
                }
                t = g.end;
            }
        }
    }};
}
/// Rows `i .. i + na` of `acts` (`na` from 1 to [`MAX_ACT_ROWS`]), the last repeated to fill
/// the array. Always inlined and spelled out: built once per pass, it was 1-2% of a serving
/// profile as a call.
#[inline(always)]
fn pass_rows(acts: &Q8Acts, i: usize, na: usize) -> [ActRow<'_>; MAX_ACT_ROWS] {
    const _: () = assert!(MAX_ACT_ROWS == 4, "pass_rows spells out four rows");
    let last = i + na - 1;
    [
        acts.row(i),
        acts.row((i + 1).min(last)),
        acts.row((i + 2).min(last)),
        acts.row((i + 3).min(last)),
    ]
}

/// `out[i, c] = w[c] · acts.row(i)` for every column `c` of the tiles `tiles` (columns at or
/// past the weight's rows are not written) and every activation row `i` in `rows`, where `out`
/// is `[acts.rows(), w.rows()]`. With at most [`MAX_ACT_ROWS`] rows (decode) one kernel call
/// covers all the tiles; with more, each group of `group` tiles stays in cache while the rows
/// pass it four at a time, the group's last passes prefetching a share of the next ([`Ahead`]).
/// Results go straight from the kernels' registers to `out`.
///
/// # Safety
/// Columns `TILE * tiles.start .. TILE * tiles.end` of rows `rows` of `out` belong to the
/// caller's task alone; `isa` is one of [`Isa::available`].
pub(super) unsafe fn dot_rows(
    isa: Isa,
    w: &PackedWeight,
    tiles: std::ops::Range<usize>,
    acts: &Q8Acts,
    rows: std::ops::Range<usize>,
    group: usize,
    out: &DisjointMut<f32>,
) {
    let (n, nb) = (w.rows(), w.blocks());
    assert!(
        tiles.end <= w.tiles()
            && rows.end <= acts.rows()
            && acts.cols() == nb * QK
            && out.len == acts.rows() * n,
        "dot_rows: no product of tiles {tiles:?} of [{n}, {}] with rows {rows:?} of [{}, {}]",
        w.cols(),
        acts.rows(),
        acts.cols()
    );
    if tiles.is_empty() || rows.is_empty() {
        return;
    }
    // SAFETY (of the calls below): `isa` is available (the caller's contract); rows come from
    // `acts`, whose width was checked against the weight's blocks; the stores stay in these
    // tiles' columns of these rows, the caller's alone.
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { x86::rows_vnni(w, tiles, acts, rows, group, out) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::rows_avx2(w, tiles, acts, rows, group, out) },
        _ => row_passes!(w, tiles, acts, rows, group, out, |t, a, ah, d| unsafe {
            call(Isa::Scalar, w, t, a, ah, d)
        }),
    }
}

/// One kernel call: the `isa` build of the tiles' product with `acts`, stored through `dst`.
///
/// # Safety
/// `isa` is available; every row of `acts` holds the weight's blocks; `dst` addresses writable
/// memory that is the caller's alone for every tile of `tiles` and row of `acts`.
unsafe fn call(
    isa: Isa,
    w: &PackedWeight,
    tiles: std::ops::Range<usize>,
    acts: &[ActRow<'_>],
    ahead: Ahead,
    dst: Dst,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded from the caller's contract.
        Isa::Avx512Vnni => unsafe { x86::tiles_vnni(w, tiles, acts, ahead, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::tiles_avx2(w, tiles, acts, ahead, dst) },
        _ => {
            for (j, tile) in tiles.enumerate() {
                for (i, a) in acts.iter().enumerate() {
                    let v: [f32; TILE] = std::array::from_fn(|l| dot_scalar(w, TILE * tile + l, a));
                    // SAFETY: forwarded from the caller's contract.
                    unsafe { dst.put(i, j, &v) };
                }
            }
        }
    }
}

/// The reference: the module's arithmetic in plain loops, for weight row `row` (a padding row
/// of the last tile gives 0).
pub fn dot_scalar(w: &PackedWeight, row: usize, a: &ActRow<'_>) -> f32 {
    let f = w.format();
    let r = row % TILE;
    let (mut acc, mut macc) = (0f32, 0f32);
    let subs = f.num_scales();
    let len = QK / subs;
    let tile = w.tile(row / TILE);
    for b in 0..w.blocks() {
        let (codes, sc, min) = block_parts(f, tile, b, r);
        for (s, &ws) in sc.iter().enumerate().take(subs) {
            let span = s * len..(s + 1) * len;
            let mut dot: i32 = codes[span.clone()]
                .iter()
                .zip(&a.qs[b * QK..][span])
                .map(|(&u, &q)| u as i32 * q as i32)
                .sum();
            let qsum = if subs == 2 {
                a.sum16[2 * b + s]
            } else {
                a.sum16[2 * b] + a.sum16[2 * b + 1]
            };
            dot -= f.bias() * qsum;
            acc = (dot as f32).mul_add(ws * a.d[b], acc);
        }
        if f.has_min {
            macc = min.mul_add(a.bsum[b], macc);
        }
    }
    acc + macc
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::qpack::unpack_row;
    use crate::{Storage, Tensor, ThreadPool};
    use half::f16;

    /// Random-looking bytes for `rows` rows of `nb` blocks of `dtype`, with sane f16 scales.
    fn random_tensor(dtype: DType, rows: usize, cols: usize, seed: u32) -> Tensor {
        let bb = dtype.block_bytes();
        let nb = rows * cols / dtype.block_size();
        let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
        let mut v: Vec<u8> = (0..nb * bb)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 7) as u8
            })
            .collect();
        // f16 scale fields at the format's offsets.
        let offsets: &[usize] = match dtype {
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q6_K => &[208],
            _ => &[0],
        };
        for (b, blk) in v.chunks_exact_mut(bb).enumerate() {
            for (s, &o) in offsets.iter().enumerate() {
                let val = f16::from_f32(
                    0.01 + 0.003 * ((b + s) % 7) as f32 * if s == 1 { -1.0 } else { 1.0 },
                );
                blk[o..o + 2].copy_from_slice(&val.to_bits().to_le_bytes());
            }
        }
        Tensor::new(dtype, vec![rows, cols], Storage::owned(v)).expect("tensor")
    }

    const TYPES: [DType; 8] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    #[test]
    fn every_isa_and_row_count_matches_the_scalar_reference_exactly() {
        let pool = ThreadPool::new(2).expect("pool");
        // 20 rows: a whole tile and one with 12 padding rows.
        for dtype in TYPES {
            let k = if dtype.block_size() == 256 { 512 } else { 288 };
            let rows = 20;
            let t = random_tensor(dtype, rows, k, dtype as u32 + 3);
            let w = PackedWeight::pack(&t, &pool).expect("pack");
            let x: Vec<f32> = (0..4 * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.07)
                .collect();
            let mut acts = Q8Acts::default();
            acts.quantize(&x, k);
            let act_rows: Vec<ActRow<'_>> = (0..4).map(|i| acts.row(i)).collect();
            for isa in Isa::available() {
                for na in 1..=MAX_ACT_ROWS {
                    for tiles in [0..w.tiles(), 1..2, 0..1] {
                        let mut out = vec![[f32::NAN; TILE]; na * tiles.len()];
                        dot_tiles(
                            isa,
                            &w,
                            tiles.clone(),
                            &act_rows[..na],
                            Ahead::split(tiles.clone(), w.tile_bytes(), w.blocks(), 1, 2),
                            &mut out,
                        );
                        for (j, o) in out.iter().enumerate() {
                            let (tile, i) = (tiles.start + j / na, j % na);
                            for (l, &v) in o.iter().enumerate() {
                                let r = TILE * tile + l;
                                let want = dot_scalar(&w, r, &act_rows[i]);
                                assert_eq!(
                                    v.to_bits(),
                                    want.to_bits(),
                                    "{dtype} {isa:?} na {na} {tiles:?} row {r} act {i}"
                                );
                                if r >= rows {
                                    assert_eq!(v, 0.0, "padding row {r}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn row_passes_store_straight_into_the_output() {
        // 20 weight rows (the last tile has 12 padding rows) against 11 activation rows: one
        // pass of three rows, or three passes (the last of three rows), each task's tiles in
        // turn. Every value is the scalar reference's, and the padding rows store nothing: the
        // last tile goes after the first, so a whole-tile store would overwrite the next row's
        // first columns.
        let pool = ThreadPool::new(1).expect("pool");
        let (n, m) = (20, 11);
        for dtype in [DType::Q4_1, DType::Q8_0, DType::Q6_K] {
            let k = if dtype.block_size() == 256 { 512 } else { 288 };
            let t = random_tensor(dtype, n, k, dtype as u32 + 11);
            let w = PackedWeight::pack(&t, &pool).expect("pack");
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.05)
                .collect();
            let mut acts = Q8Acts::default();
            acts.quantize(&x, k);
            for isa in Isa::available() {
                for (rows, group) in [(0..m, 1), (0..m, 4), (4..7, 2)] {
                    let mut out = vec![f32::NAN; m * n];
                    let shared = super::super::DisjointMut::new(&mut out);
                    for tiles in [0..1, 1..2] {
                        // SAFETY: `isa` is available, and the calls store in turn.
                        unsafe { dot_rows(isa, &w, tiles, &acts, rows.clone(), group, &shared) };
                    }
                    for i in 0..m {
                        for c in 0..n {
                            let got = out[i * n + c];
                            if rows.contains(&i) {
                                let want = dot_scalar(&w, c, &acts.row(i));
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{dtype} {isa:?} rows {rows:?} group {group}: [{i}, {c}]"
                                );
                            } else {
                                assert!(got.is_nan(), "{dtype} {isa:?}: row {i} written");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn close_to_the_float_product() {
        let pool = ThreadPool::new(1).expect("pool");
        for dtype in TYPES {
            let k = 512;
            let t = random_tensor(dtype, 1, k, 7);
            let w = PackedWeight::pack(&t, &pool).expect("pack");
            let x: Vec<f32> = (0..k).map(|i| ((i as f32) * 0.013).sin()).collect();
            let mut acts = Q8Acts::default();
            acts.quantize(&x, k);
            let mut wf = vec![0f32; k];
            unpack_row(&w, 0, &mut wf);
            let mut wd = vec![0f32; k];
            t.dequantize_row(0, &mut wd);
            assert_eq!(wf, wd, "{dtype}: repacked values");
            let exact: f64 = wf.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let norm: f64 = wf
                .iter()
                .zip(&x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let got = dot_scalar(&w, 0, &acts.row(0)) as f64;
            // 8-bit activations: error well under 1% of the sum of magnitudes.
            assert!(
                (got - exact).abs() < 0.01 * norm,
                "{dtype}: {got} vs {exact}"
            );
        }
    }
}
