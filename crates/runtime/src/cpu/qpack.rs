//! Block-quantized weights repacked once at load for the integer kernels ([`super::qdot`]),
//! in exactly as many bytes as the file's own blocks.
//!
//! Decode of a model larger than the cache is bound by the bytes read per token, so the repacked
//! form keeps each format's own scale encoding (f16 block scales; K-quants' f16 super-block
//! factors with 6-bit or 8-bit sub-block scales) and its code bits (Q6_K as a 4-bit and a 2-bit
//! plane); only the order changes. The kernels widen scales in registers: a K-quant sub-block
//! scale is `d * sc` (and its minimum `-(dmin * m)`), computed in f32, where it is exact (an
//! f16 significand times a 6- or 8-bit integer), so the decoded weights are bit for bit the
//! format's own (`w = scale * (u - bias) + min`; `bias`: Q4_0 8, Q5_0 16, Q8_0 128, Q6_K 32,
//! else 0) and the products are those of the kernels' one arithmetic ([`super::qdot`]).
//!
//! Rows are interleaved in tiles of [`TILE`] = 16, one row per 32-bit lane of a 512-bit
//! register (two 256-bit halves on AVX2): lane `r` of a code register holds four consecutive
//! codes of tile row `r`, so one integer dot-product instruction against four activation bytes
//! broadcast to every lane advances sixteen rows at once, and a block's result per row is
//! already whole in its lane (no horizontal sums). A tile is its groups in order (a group: one
//! 32-element block for Q4_0 .. Q8_0, one 256-element super-block of eight blocks for K-quants),
//! each group its blocks' codes in order, then the group's scales. A block's codes:
//!
//! | codes | bytes | content |
//! | --- | --- | --- |
//! | 4-bit (Q4_0, Q4_1, Q4_K) | 256 | register `j` (0..4): byte `p = 4r + i` holds element `8j + i` of row `r` in its low nibble and element `8j + 4 + i` in its high nibble |
//! | 5-bit (Q5_0, Q5_1, Q5_K) | 256 + 64 | as 4-bit, then per register `j` two `u64` masks (low nibbles, high nibbles) whose bit `p` is bit 4 of the code in byte `p` |
//! | 6-bit (Q6_K) | 256 + 128 | as 4-bit (the codes' low four bits), then two 64-byte planes of the high two bits: plane `k`, byte `p`, bits `4h .. 4h + 4` are register `j = 2k + h`'s: bits 0-1 of the low-nibble element, bits 2-3 of the high-nibble one |
//! | 8-bit (Q8_0) | 512 | register `t` (0..8): byte `4r + i` holds element `4t + i` of row `r` |
//!
//! A group's scales, per row `r` (f16 values little-endian, `[a][r]` arrays row-minor):
//!
//! | scales | bytes | content |
//! | --- | --- | --- |
//! | block (Q4_0, Q5_0, Q8_0) | 32 | `d[r]` f16 |
//! | block with minimum (Q4_1, Q5_1) | 64 | `d[r]` f16, then `m[r]` f16 |
//! | 6-bit (Q4_K, Q5_K) | 256 | `d[r]` f16, `dmin[r]` f16, `lo[8][r]`: `sc & 15 \| (m & 15) << 4` of sub-blocks 0, 2, 4, 6, 1, 3, 5, 7, `hi[4][r]`: sub-block `2k` in bits 0-3 and `2k + 1` in bits 4-7, each nibble `sc >> 4 \| (m >> 4) << 2` |
//! | 8-bit (Q6_K) | 288 | `d[r]` f16, `sc[16][r]` i8 per 16 elements |
//!
//! So a tile of sixteen rows is exactly sixteen rows of the file's blocks. Rows past the end of
//! the matrix (the last tile's padding) have zero codes and scales, so they compute exact zeros
//! that no one reads.

use super::aligned::Aligned;
use crate::dtype::QK_K;
use crate::quant::scale_min_k4;
use crate::{DType, Result, RuntimeError, Tensor, ThreadPool};
use half::f16;

/// Weight rows per tile: the 32-bit lanes of a 512-bit register.
pub const TILE: usize = 16;
/// Elements per block: what one activation scale covers and one kernel step takes.
pub const QK: usize = 32;

/// How a format's codes are stored in a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codes {
    Nib4,
    Nib5,
    /// Q6_K: a 4-bit plane and a 2-bit plane.
    Nib6,
    Byte,
}

/// How a format's scales are stored in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scales {
    /// An f16 scale (and an f16 minimum) per row per 32-element block.
    Block,
    /// Q4_K, Q5_K: per row an f16 `d` and `dmin` per super-block and a 6-bit scale and minimum
    /// per 32-element sub-block (the minimum is `-(dmin * m)`).
    K6,
    /// Q6_K: per row an f16 `d` per super-block and an i8 scale per 16 elements.
    K8,
}

/// The repacked form of one weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackFormat {
    pub codes: Codes,
    pub scales: Scales,
    /// `log2(bias)`, 0 for formats without a bias.
    pub bias_shift: u32,
    pub has_min: bool,
}

impl PackFormat {
    /// The repacked form of `dtype`, when it has an integer kernel.
    pub fn of(dtype: DType) -> Option<PackFormat> {
        let f = |codes, scales, bias_shift, has_min| {
            Some(PackFormat {
                codes,
                scales,
                bias_shift,
                has_min,
            })
        };
        match dtype {
            DType::Q4_0 => f(Codes::Nib4, Scales::Block, 3, false),
            DType::Q4_1 => f(Codes::Nib4, Scales::Block, 0, true),
            DType::Q4_K => f(Codes::Nib4, Scales::K6, 0, true),
            DType::Q5_0 => f(Codes::Nib5, Scales::Block, 4, false),
            DType::Q5_1 => f(Codes::Nib5, Scales::Block, 0, true),
            DType::Q5_K => f(Codes::Nib5, Scales::K6, 0, true),
            DType::Q8_0 => f(Codes::Byte, Scales::Block, 7, false),
            DType::Q6_K => f(Codes::Nib6, Scales::K8, 5, false),
            DType::F32 | DType::F16 | DType::BF16 => None,
        }
    }

    /// Bytes of a block's codes (and 5-bit masks, 6-bit planes) for a whole tile.
    pub const fn code_bytes(self) -> usize {
        match self.codes {
            Codes::Nib4 => 256,
            Codes::Nib5 => 256 + 64,
            Codes::Nib6 => 256 + 128,
            Codes::Byte => 512,
        }
    }

    /// A scale per 16 elements (two per block) instead of per 32.
    pub const fn sub16(self) -> bool {
        matches!(self.scales, Scales::K8)
    }

    /// Scales per row per block.
    pub const fn num_scales(self) -> usize {
        if self.sub16() {
            2
        } else {
            1
        }
    }

    /// 32-element blocks per group.
    pub const fn group_blocks(self) -> usize {
        match self.scales {
            Scales::Block => 1,
            Scales::K6 | Scales::K8 => QK_K / QK,
        }
    }

    /// Offset of a group's scales from its start.
    pub const fn scales_at(self) -> usize {
        self.group_blocks() * self.code_bytes()
    }

    /// Bytes of a group's scales for a whole tile.
    pub const fn scale_bytes(self) -> usize {
        match self.scales {
            Scales::Block => 2 * TILE * if self.has_min { 2 } else { 1 },
            Scales::K6 => 4 * TILE + 8 * TILE + 4 * TILE,
            Scales::K8 => 2 * TILE + 16 * TILE,
        }
    }

    /// Bytes of one group of a tile.
    pub const fn group_bytes(self) -> usize {
        self.scales_at() + self.scale_bytes()
    }

    /// The bias subtracted from the codes.
    pub const fn bias(self) -> i32 {
        if self.bias_shift > 0 {
            1 << self.bias_shift
        } else {
            0
        }
    }
}

/// A weight matrix `[rows, cols]` in the tiled layout.
#[derive(Debug, Clone)]
pub struct PackedWeight {
    dtype: DType,
    format: PackFormat,
    rows: usize,
    cols: usize,
    /// `[tiles, cols / (32 * group_blocks), group_bytes]`.
    data: Aligned<u8>,
}

/// Source bytes packed between two releases of their pages (see [`PackedWeight::pack`]).
const RELEASE_BYTES: usize = 8 << 20;

impl PackedWeight {
    /// Repacks `t` (`[rows, cols]`, a format with [`PackFormat::of`]); tiles are split over
    /// `pool`. A mapped `t`'s pages are given back as it is packed (they fault back in if its
    /// stored bytes are read again).
    pub fn pack(t: &Tensor, pool: &ThreadPool) -> Result<PackedWeight> {
        let dtype = t.dtype();
        let format = PackFormat::of(dtype).ok_or_else(|| {
            RuntimeError::Shape(format!("{dtype} weights have no integer kernel"))
        })?;
        let (rows, cols) = (t.rows(), t.cols());
        let group = QK * format.group_blocks();
        if !cols.is_multiple_of(group) {
            return Err(RuntimeError::Shape(format!(
                "{dtype} weights of {cols} columns are not whole blocks of {group}"
            )));
        }
        let tiles = rows.div_ceil(TILE);
        let tb = cols / group * format.group_bytes();
        let mut data = Aligned::<u8>::zeroed(tiles * tb);
        let tiles_mut = super::DisjointMut::new(&mut data[..]);
        // Tiles in slices of about `RELEASE_BYTES` of the source: each slice's source pages are
        // given back as soon as it is packed, so a large weight (a tied embedding packed for the
        // LM head) is never resident twice over, in the file's pages and in its packed copy.
        // (Enough tiles a slice to keep every thread busy, however wide the rows.)
        let slice_tiles =
            (RELEASE_BYTES / (TILE * t.row_bytes()).max(1)).max(4 * pool.num_threads());
        for first in (0..tiles).step_by(slice_tiles) {
            let end = (first + slice_tiles).min(tiles);
            pool.parallel_ranges(end - first, 1, |range| {
                let mut parts: Vec<RowParts> = (0..TILE).map(|_| RowParts::new(cols)).collect();
                for tile in range.start + first..range.end + first {
                    let live = (rows - tile * TILE).min(TILE);
                    for (l, p) in parts.iter_mut().enumerate() {
                        if l < live {
                            p.decode(dtype, t.row(tile * TILE + l));
                        } else {
                            p.clear();
                        }
                    }
                    // SAFETY: each tile's bytes belong to this task alone.
                    let dst = unsafe { tiles_mut.slice(tile * tb, tb) };
                    write_tile(format, &parts, dst);
                }
            });
            let (row0, row1) = (first * TILE, (end * TILE).min(rows));
            t.release_row_pages(row0, row1 - row0);
        }
        Ok(PackedWeight {
            dtype,
            format,
            rows,
            cols,
            data,
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn format(&self) -> PackFormat {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// 32-element blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Groups per row (of [`PackFormat::group_blocks`] blocks each).
    pub fn groups(&self) -> usize {
        self.blocks() / self.format.group_blocks()
    }

    /// Tiles of [`TILE`] rows (the last one padded).
    pub fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE)
    }

    /// The bytes of tile `t`: its groups in order.
    pub fn tile(&self, t: usize) -> &[u8] {
        let n = self.tile_bytes();
        &self.data[t * n..(t + 1) * n]
    }

    /// Bytes of one tile.
    pub fn tile_bytes(&self) -> usize {
        self.groups() * self.format.group_bytes()
    }

    /// All tiles' bytes, in order.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Bytes held.
    pub fn num_bytes(&self) -> usize {
        self.data.len()
    }
}

/// Writes one tile's groups from its rows' decoded parts.
fn write_tile(f: PackFormat, parts: &[RowParts], dst: &mut [u8]) {
    let (gb, nbg, cb) = (f.group_bytes(), f.group_blocks(), f.code_bytes());
    for (g, grp) in dst.chunks_exact_mut(gb).enumerate() {
        for (k, blk) in grp[..nbg * cb].chunks_exact_mut(cb).enumerate() {
            write_codes(f, parts, g * nbg + k, blk);
        }
        let s = &mut grp[f.scales_at()..];
        let put16 = |s: &mut [u8], at: usize, r: usize, v: u16| {
            s[at + 2 * r..at + 2 * r + 2].copy_from_slice(&v.to_le_bytes())
        };
        for (r, p) in parts.iter().enumerate() {
            put16(s, 0, r, p.d[g]);
            match f.scales {
                Scales::Block => {
                    if f.has_min {
                        put16(s, 2 * TILE, r, p.dm[g]);
                    }
                }
                Scales::K6 => {
                    put16(s, 2 * TILE, r, p.dm[g]);
                    for sub in 0..8 {
                        let (sc, m) = (p.sc[8 * g + sub], p.mn[8 * g + sub]);
                        s[4 * TILE + TILE * k6_slot(sub) + r] = (sc & 15) | ((m & 15) << 4);
                        let hi = ((sc >> 4) & 3) | (((m >> 4) & 3) << 2);
                        s[12 * TILE + TILE * (sub / 2) + r] |= hi << (4 * (sub % 2));
                    }
                }
                Scales::K8 => {
                    for sub in 0..16 {
                        s[2 * TILE + TILE * sub + r] = p.sc[16 * g + sub];
                    }
                }
            }
        }
    }
}

/// Where sub-block `sub`'s low bits sit in a K6 group's `lo` array: the even sub-blocks first,
/// then the odd ones, so that `lo`'s first and second 64 bytes line up, sub-block for
/// sub-block, with the low and high nibbles of `hi` (the kernels decode a group's scales in
/// three registers).
pub const fn k6_slot(sub: usize) -> usize {
    (sub % 2) * 4 + sub / 2
}

/// Writes block `b`'s codes of every row of a tile.
fn write_codes(f: PackFormat, parts: &[RowParts], b: usize, blk: &mut [u8]) {
    let code = |r: usize, e: usize| parts[r].codes[b * QK + e];
    match f.codes {
        Codes::Nib4 | Codes::Nib5 | Codes::Nib6 => {
            for j in 0..4 {
                let mut masks = [0u64; 2];
                for r in 0..TILE {
                    for i in 0..4 {
                        let p = 4 * r + i;
                        let (lo, hi) = (code(r, 8 * j + i), code(r, 8 * j + 4 + i));
                        blk[64 * j + p] = (lo & 0x0F) | ((hi & 0x0F) << 4);
                        masks[0] |= u64::from((lo >> 4) & 1) << p;
                        masks[1] |= u64::from((hi >> 4) & 1) << p;
                        if f.codes == Codes::Nib6 {
                            let two = ((lo >> 4) & 3) | (((hi >> 4) & 3) << 2);
                            blk[256 + 64 * (j / 2) + p] |= two << (4 * (j % 2));
                        }
                    }
                }
                if f.codes == Codes::Nib5 {
                    for (h, m) in masks.iter().enumerate() {
                        let o = 256 + 16 * j + 8 * h;
                        blk[o..o + 8].copy_from_slice(&m.to_le_bytes());
                    }
                }
            }
        }
        Codes::Byte => {
            for t in 0..8 {
                for r in 0..TILE {
                    for i in 0..4 {
                        blk[64 * t + 4 * r + i] = code(r, 4 * t + i);
                    }
                }
            }
        }
    }
}

/// Block `b` (counted over the whole row) of row `r` of a tile's bytes, read back: its 32
/// unsigned codes, its scales (the second one only for 16-element sub-blocks) and its minimum
/// (0 without minimums), as the kernels compute them.
pub fn block_parts(f: PackFormat, tile: &[u8], b: usize, r: usize) -> ([u8; QK], [f32; 2], f32) {
    let nbg = f.group_blocks();
    let (g, k) = (b / nbg, b % nbg);
    let grp = &tile[g * f.group_bytes()..(g + 1) * f.group_bytes()];
    let blk = &grp[k * f.code_bytes()..(k + 1) * f.code_bytes()];
    let mut c = [0u8; QK];
    for (e, c) in c.iter_mut().enumerate() {
        *c = match f.codes {
            Codes::Byte => blk[64 * (e / 4) + 4 * r + e % 4],
            Codes::Nib4 | Codes::Nib5 | Codes::Nib6 => {
                let (j, h, i) = (e / 8, (e % 8) / 4, e % 4);
                let p = 4 * r + i;
                let nib = (blk[64 * j + p] >> (4 * h)) & 0x0F;
                let high = match f.codes {
                    Codes::Nib5 => {
                        let o = 256 + 16 * j + 8 * h;
                        let m = u64::from_le_bytes(blk[o..o + 8].try_into().unwrap_or([0; 8]));
                        (((m >> p) & 1) as u8) << 4
                    }
                    Codes::Nib6 => {
                        let two = blk[256 + 64 * (j / 2) + p] >> (4 * (j % 2) + 2 * h);
                        (two & 3) << 4
                    }
                    _ => 0,
                };
                nib | high
            }
        };
    }
    let s = &grp[f.scales_at()..];
    let f16_at = |o: usize| f16::from_bits(u16::from_le_bytes([s[o], s[o + 1]])).to_f32();
    let d = f16_at(2 * r);
    let mut sc = [0f32; 2];
    let mut min = 0.0;
    match f.scales {
        Scales::Block => {
            sc[0] = d;
            if f.has_min {
                min = f16_at(2 * TILE + 2 * r);
            }
        }
        Scales::K6 => {
            let (lo, hi) = (
                s[4 * TILE + TILE * k6_slot(k) + r],
                s[12 * TILE + TILE * (k / 2) + r],
            );
            let hi = hi >> (4 * (k % 2));
            let (scale, m) = ((lo & 15) | ((hi & 3) << 4), (lo >> 4) | ((hi & 12) << 2));
            sc[0] = d * scale as f32;
            min = -(f16_at(2 * TILE + 2 * r) * m as f32);
        }
        Scales::K8 => {
            for (h, v) in sc.iter_mut().enumerate() {
                *v = d * (s[2 * TILE + TILE * (2 * k + h) + r] as i8) as f32;
            }
        }
    }
    (c, sc, min)
}

/// Decodes packed row `r` back to f32 (`cols` values), for tests: the repacking is exact.
pub fn unpack_row(w: &PackedWeight, r: usize, out: &mut [f32]) {
    let f = w.format;
    let tile = w.tile(r / TILE);
    for b in 0..w.blocks() {
        let (codes, sc, min) = block_parts(f, tile, b, r % TILE);
        for (e, &u) in codes.iter().enumerate() {
            let s = if f.sub16() { sc[e / 16] } else { sc[0] };
            out[b * QK + e] = s * (u as i32 - f.bias()) as f32 + min;
        }
    }
}

/// One row decoded into codes and its format's scale fields, as stored.
struct RowParts {
    /// `[cols]` unsigned codes.
    codes: Vec<u8>,
    /// f16 bits of `d` per group.
    d: Vec<u16>,
    /// f16 bits of the minimum (Q4_1, Q5_1) or `dmin` (Q4_K, Q5_K) per group.
    dm: Vec<u16>,
    /// Sub-block scales: 6-bit per 32 elements (Q4_K, Q5_K), i8 per 16 (Q6_K).
    sc: Vec<u8>,
    /// 6-bit sub-block minimums per 32 elements (Q4_K, Q5_K).
    mn: Vec<u8>,
}

#[inline]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

impl RowParts {
    fn new(cols: usize) -> RowParts {
        RowParts {
            codes: vec![0; cols],
            d: vec![0; cols / QK],
            dm: vec![0; cols / QK],
            sc: vec![0; cols / 16],
            mn: vec![0; cols / QK],
        }
    }

    /// All zero: a padding row.
    fn clear(&mut self) {
        self.codes.fill(0);
        self.d.fill(0);
        self.dm.fill(0);
        self.sc.fill(0);
        self.mn.fill(0);
    }

    /// Decodes one stored row (`cols` elements) into codes and scale fields.
    fn decode(&mut self, dtype: DType, row: &[u8]) {
        let bb = dtype.block_bytes();
        for (bi, b) in row.chunks_exact(bb).enumerate() {
            match dtype {
                DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => {
                    self.small_block(dtype, bi, b)
                }
                DType::Q4_K | DType::Q5_K => self.k4_block(dtype, bi, b),
                DType::Q6_K => self.q6_k_block(bi, b),
                DType::F32 | DType::F16 | DType::BF16 => unreachable!("not a packed format"),
            }
        }
    }

    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: one 32-element block.
    fn small_block(&mut self, dtype: DType, bi: usize, b: &[u8]) {
        let c = &mut self.codes[bi * 32..bi * 32 + 32];
        match dtype {
            DType::Q4_0 | DType::Q4_1 => {
                let qs = if dtype == DType::Q4_0 {
                    &b[2..18]
                } else {
                    &b[4..20]
                };
                for j in 0..16 {
                    c[j] = qs[j] & 0x0F;
                    c[j + 16] = qs[j] >> 4;
                }
            }
            DType::Q5_0 | DType::Q5_1 => {
                let o = if dtype == DType::Q5_0 { 2 } else { 4 };
                let qh = u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
                let qs = &b[o + 4..o + 20];
                for j in 0..16 {
                    c[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                    c[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                }
            }
            _ => {
                for (c, &q) in c.iter_mut().zip(&b[2..34]) {
                    *c = (q as i8 as i16 + 128) as u8;
                }
            }
        }
        self.d[bi] = u16_at(b, 0);
        if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
            self.dm[bi] = u16_at(b, 2);
        }
    }

    /// Q4_K and Q5_K: a super-block of eight 32-element sub-blocks with 6-bit scales and mins.
    fn k4_block(&mut self, dtype: DType, bi: usize, b: &[u8]) {
        (self.d[bi], self.dm[bi]) = (u16_at(b, 0), u16_at(b, 2));
        let scales = &b[4..16];
        let (qh, qs) = if dtype == DType::Q5_K {
            (Some(&b[16..48]), &b[48..176])
        } else {
            (None, &b[16..144])
        };
        let base = bi * QK_K;
        for chunk in 0..4 {
            for half in 0..2 {
                let sub = 2 * chunk + half;
                (self.sc[8 * bi + sub], self.mn[8 * bi + sub]) = scale_min_k4(sub, scales);
                for l in 0..32 {
                    let q = qs[32 * chunk + l];
                    let mut u = if half == 0 { q & 0x0F } else { q >> 4 };
                    if let Some(qh) = qh {
                        if qh[l] & (1u8 << sub) != 0 {
                            u += 16;
                        }
                    }
                    self.codes[base + 32 * sub + l] = u;
                }
            }
        }
    }

    /// Q6_K: a super-block of sixteen 16-element sub-blocks with i8 scales.
    fn q6_k_block(&mut self, bi: usize, b: &[u8]) {
        let (ql_all, qh_all, sc_all) = (&b[0..128], &b[128..192], &b[192..208]);
        self.d[bi] = u16_at(b, 208);
        let base = bi * QK_K;
        for n in 0..2 {
            let (ql, qh) = (&ql_all[64 * n..64 * n + 64], &qh_all[32 * n..32 * n + 32]);
            for l in 0..32 {
                let e = base + 128 * n + l;
                self.codes[e] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                self.codes[e + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                self.codes[e + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                self.codes[e + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        self.sc[16 * bi..16 * bi + 16].copy_from_slice(sc_all);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tile_holds_sixteen_rows_and_pads_the_last() {
        // 20 rows of Q8_0: two tiles, the second with 4 live rows and 12 zero rows.
        let (rows, cols) = (20, 64);
        let mut bytes = Vec::new();
        for r in 0..rows {
            for b in 0..cols / 32 {
                let d = half::f16::from_f32(0.5 + r as f32);
                bytes.extend_from_slice(&d.to_bits().to_le_bytes());
                bytes.extend((0..32).map(|e| (e as i8 - 16 + b as i8) as u8));
            }
        }
        let t = Tensor::new(DType::Q8_0, vec![rows, cols], crate::Storage::owned(bytes))
            .expect("tensor");
        let p = PackedWeight::pack(&t, &ThreadPool::new(2).expect("pool")).expect("pack");
        assert_eq!((p.tiles(), p.blocks()), (2, 2));
        let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
        for r in 0..rows {
            t.dequantize_row(r, &mut want);
            unpack_row(&p, r, &mut got);
            assert_eq!(got, want, "row {r}");
        }
        let f = p.format();
        let (codes, sc, _) = block_parts(f, p.tile(1), 0, 5);
        assert_eq!((codes, sc[0]), ([0u8; QK], 0.0));
        // Element 4t + i of row r sits in byte 64t + 4r + i: element 5 of row 3 is byte 77.
        let (codes, _, _) = block_parts(f, p.tile(0), 0, 3);
        assert_eq!(codes[5], p.tile(0)[77]);
    }

    #[test]
    fn repacking_is_exact_for_every_format() {
        // Rows of each type from llama.cpp's quantizer; repacking must decode to the same
        // values as the format's reference decoder, bit for bit.
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/quant/blocks.safetensors");
        let bytes = std::fs::read(&fixtures).expect("quant fixtures");
        let pool = ThreadPool::new(2).expect("pool");
        let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("header")) as usize;
        let header: serde_json::Value =
            serde_json::from_slice(&bytes[8..8 + header_len]).expect("json");
        let data = &bytes[8 + header_len..];
        let mut checked = 0;
        for dtype in DType::ALL
            .into_iter()
            .filter(|d| PackFormat::of(*d).is_some())
        {
            let raw = &header[format!("{dtype}.raw")];
            let shape: Vec<usize> = raw["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|v| v.as_u64().expect("dim") as usize)
                .collect();
            let off: Vec<usize> = raw["data_offsets"]
                .as_array()
                .expect("offsets")
                .iter()
                .map(|v| v.as_u64().expect("offset") as usize)
                .collect();
            let (rows, row_bytes) = (shape[0], shape[1]);
            let cols = row_bytes / dtype.block_bytes() * dtype.block_size();
            let t = Tensor::new(
                dtype,
                vec![rows, cols],
                crate::Storage::owned(data[off[0]..off[1]].to_vec()),
            )
            .expect("tensor");
            let p = PackedWeight::pack(&t, &pool).expect("pack");
            assert_eq!(p.tiles(), rows.div_ceil(TILE));
            // Exactly the file's bytes: a tile is sixteen stored rows.
            assert_eq!(p.tile_bytes(), TILE * row_bytes, "{dtype}: bytes per tile");
            let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                t.dequantize_row(r, &mut want);
                unpack_row(&p, r, &mut got);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a - b).abs() <= 1e-6 * b.abs(),
                        "{dtype} row {r} col {i}: {a} vs {b}"
                    );
                }
            }
            checked += 1;
        }
        assert_eq!(checked, 8);
    }
}
