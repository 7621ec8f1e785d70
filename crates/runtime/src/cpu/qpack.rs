//! Block-quantized weights repacked once at load for the integer kernels ([`super::qdot`]).
//!
//! Every supported format is rewritten as the same thing: unsigned integer codes `u`, a scale
//! per 32 (or, for Q6_K, per 16) elements and optionally a minimum per 32 elements, so that
//! `w = scale * (u - bias) + min` exactly reproduces the format's own decoding (`bias`: Q4_0 8,
//! Q5_0 16, Q8_0 128, Q6_K 32, else 0). K-quant super-block scales are folded into f32
//! sub-block scales (`d * sc`, exact in f32), and f16 scales are widened once here instead of
//! once per block per activation row.
//!
//! Rows are cut into groups of [`GROUP`] = 64 elements, laid out as the 64 bytes of one
//! 512-bit register (two 256-bit halves on AVX2). Byte `p` sits in 32-bit lane `i = p / 4`,
//! which covers four elements of 16-element sub-block `s(i) = 2 (i % 2) + (i % 4) / 2`, so lane
//! `i` belongs to 32-element block `i % 2`: a group's two block scales are one 64-bit
//! broadcast, and Q6_K's four sub-block scales (stored in lane order `s0, s2, s1, s3`) one
//! 128-bit broadcast. Storage per row:
//!
//! | codes | unit | bytes |
//! | --- | --- | --- |
//! | 4-bit (Q4_0, Q4_1, Q4_K) | two groups | 64 (group `2j` in the low nibbles, `2j + 1` in the high) + 4 f32 scales |
//! | 5-bit (Q5_0, Q5_1, Q5_K) | two groups | as 4-bit, plus one `u64` per group whose bit `p` is bit 4 of byte `p`, before the scales |
//! | 8-bit (Q8_0, Q6_K) | one group | 64 + 2 (Q6_K: 4) f32 scales |
//!
//! A last unpaired 4/5-bit group is 32 bytes (byte `p % 32`: low nibble for `p < 32`, high
//! nibble else), its `u64` and 2 scales. Minimums live in a separate `[rows, min_stride]`
//! array, zero-padded to a multiple of 16 per row. A row whose length is not a multiple of 64
//! is padded with zero codes and zero scales, which contribute exact zeros.

use super::qacts::{GROUP, LANES};
use crate::dtype::QK_K;
use crate::quant::scale_min_k4;
use crate::{DType, Result, RuntimeError, Tensor, ThreadPool};
use half::f16;

/// How a format's codes are stored in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codes {
    Nib4,
    Nib5,
    Byte,
}

/// The repacked form of one weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackFormat {
    pub codes: Codes,
    /// Four scales per group (per 16 elements) instead of two (per 32).
    pub scales4: bool,
    /// `log2(bias)`, 0 for formats without a bias.
    pub bias_shift: u32,
    pub has_min: bool,
}

impl PackFormat {
    /// The repacked form of `dtype`, when it has an integer kernel.
    pub fn of(dtype: DType) -> Option<PackFormat> {
        let f = |codes, scales4, bias_shift, has_min| {
            Some(PackFormat {
                codes,
                scales4,
                bias_shift,
                has_min,
            })
        };
        match dtype {
            DType::Q4_0 => f(Codes::Nib4, false, 3, false),
            DType::Q4_1 | DType::Q4_K => f(Codes::Nib4, false, 0, true),
            DType::Q5_0 => f(Codes::Nib5, false, 4, false),
            DType::Q5_1 | DType::Q5_K => f(Codes::Nib5, false, 0, true),
            DType::Q8_0 => f(Codes::Byte, false, 7, false),
            DType::Q6_K => f(Codes::Byte, true, 5, false),
            DType::F32 | DType::F16 | DType::BF16 => None,
        }
    }

    /// Whether two 4/5-bit groups share one 64-byte code block.
    pub const fn paired(self) -> bool {
        !matches!(self.codes, Codes::Byte)
    }

    /// Bytes of the per-group high-bit mask (5-bit codes).
    pub const fn mask_bytes(self) -> usize {
        if matches!(self.codes, Codes::Nib5) {
            8
        } else {
            0
        }
    }

    /// Bytes of scales per group.
    pub const fn scale_bytes(self) -> usize {
        if self.scales4 {
            16
        } else {
            8
        }
    }

    /// Bytes of a storage unit: two groups when paired, else one.
    pub const fn unit_bytes(self) -> usize {
        if self.paired() {
            64 + 2 * self.mask_bytes() + 2 * self.scale_bytes()
        } else {
            64 + self.scale_bytes()
        }
    }

    /// Bytes of a row of `groups` groups.
    pub const fn row_bytes(self, groups: usize) -> usize {
        if self.paired() {
            groups / 2 * self.unit_bytes()
                + (groups % 2) * (32 + self.mask_bytes() + self.scale_bytes())
        } else {
            groups * self.unit_bytes()
        }
    }
}

/// Sub-block (of 16 elements) covered by 32-bit lane `i`.
#[inline]
pub const fn lane_sub_block(i: usize) -> usize {
    2 * (i % 2) + (i % 4) / 2
}

/// Element of a group held by register byte `p`.
#[inline]
pub const fn element_of(p: usize) -> usize {
    let i = p / 4;
    16 * lane_sub_block(i) + 4 * (i / 4) + p % 4
}

/// [`element_of`] for every register byte.
pub const ORDER: [usize; GROUP] = {
    let mut o = [0; GROUP];
    let mut p = 0;
    while p < GROUP {
        o[p] = element_of(p);
        p += 1;
    }
    o
};

/// A weight matrix `[rows, cols]` in the repacked layout.
#[derive(Debug, Clone)]
pub struct PackedWeight {
    dtype: DType,
    format: PackFormat,
    rows: usize,
    cols: usize,
    groups: usize,
    /// `[rows, groups * group_bytes]`.
    data: Vec<u8>,
    /// `[rows, min_stride]`, empty for formats without minimums.
    mins: Vec<f32>,
    min_stride: usize,
}

/// Minimum entries per row: one per 32 elements, padded to a multiple of [`LANES`].
pub fn min_stride(groups: usize) -> usize {
    (2 * groups).div_ceil(LANES) * LANES
}

impl PackedWeight {
    /// Repacks `t` (`[rows, cols]`, a format with [`PackFormat::of`]); rows are split over
    /// `pool`.
    pub fn pack(t: &Tensor, pool: &ThreadPool) -> Result<PackedWeight> {
        let dtype = t.dtype();
        let format = PackFormat::of(dtype).ok_or_else(|| {
            RuntimeError::Shape(format!("{dtype} weights have no integer kernel"))
        })?;
        let (rows, cols) = (t.rows(), t.cols());
        let groups = cols.div_ceil(GROUP);
        let rb = format.row_bytes(groups);
        let ms = min_stride(groups);
        let mut data = vec![0u8; rows * rb];
        let mut mins = if format.has_min {
            vec![0f32; rows * ms]
        } else {
            Vec::new()
        };
        let data_rows = super::DisjointMut::new(&mut data);
        let min_rows = super::DisjointMut::new(&mut mins);
        pool.parallel_ranges(rows, 16, |range| {
            let mut parts = RowParts::new(groups * GROUP);
            for r in range {
                parts.decode(dtype, t.row(r));
                // SAFETY: each row's byte and minimum ranges belong to this task alone.
                let dst = unsafe { data_rows.slice(r * rb, rb) };
                parts.write(format, groups, dst);
                if format.has_min {
                    // SAFETY: as above.
                    let m = unsafe { min_rows.slice(r * ms, ms) };
                    m[..parts.mins.len()].copy_from_slice(&parts.mins);
                }
            }
        });
        Ok(PackedWeight {
            dtype,
            format,
            rows,
            cols,
            groups,
            data,
            mins,
            min_stride: ms,
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

    pub fn groups(&self) -> usize {
        self.groups
    }

    /// The groups of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let n = self.format.row_bytes(self.groups);
        &self.data[r * n..(r + 1) * n]
    }

    /// The minimums of row `r` (`min_stride` values), empty without minimums.
    pub fn row_mins(&self, r: usize) -> &[f32] {
        if self.format.has_min {
            &self.mins[r * self.min_stride..(r + 1) * self.min_stride]
        } else {
            &[]
        }
    }

    /// Bytes held.
    pub fn num_bytes(&self) -> usize {
        self.data.len() + 4 * self.mins.len()
    }
}

/// One row decoded into codes and per-16 scales (and per-32 minimums).
struct RowParts {
    codes: Vec<u8>,
    scales16: Vec<f32>,
    mins: Vec<f32>,
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

impl RowParts {
    fn new(padded: usize) -> RowParts {
        RowParts {
            codes: vec![0; padded],
            scales16: vec![0.0; padded / 16],
            mins: vec![0.0; padded / 32],
        }
    }

    /// Decodes one stored row (`cols` elements) into codes, scales and minimums; the padding
    /// stays zero.
    fn decode(&mut self, dtype: DType, row: &[u8]) {
        self.codes.fill(0);
        self.scales16.fill(0.0);
        self.mins.fill(0.0);
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

    fn set32(&mut self, block: usize, scale: f32, min: f32) {
        self.scales16[2 * block] = scale;
        self.scales16[2 * block + 1] = scale;
        self.mins[block] = min;
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
        let min = if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
            f16_at(b, 2)
        } else {
            0.0
        };
        self.set32(bi, f16_at(b, 0), min);
    }

    /// Q4_K and Q5_K: a super-block of eight 32-element sub-blocks with 6-bit scales and mins.
    fn k4_block(&mut self, dtype: DType, bi: usize, b: &[u8]) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
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
                let (sc, m) = scale_min_k4(sub, scales);
                self.set32(base / 32 + sub, d * sc as f32, -(dmin * m as f32));
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
        let d = f16_at(b, 208);
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
            for s in 0..8 {
                self.scales16[base / 16 + 8 * n + s] = d * (sc_all[8 * n + s] as i8) as f32;
            }
        }
    }

    /// Writes the row's groups in the register layout.
    fn write(&self, format: PackFormat, groups: usize, dst: &mut [u8]) {
        let codes = |g: usize, p: usize| self.codes[g * GROUP + ORDER[p]];
        let mut at = 0;
        let mut put = |dst: &mut [u8], bytes: &[u8]| {
            dst[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        let mask = |g: usize| {
            let mut high = 0u64;
            for p in 0..GROUP {
                high |= (((codes(g, p) >> 4) & 1) as u64) << p;
            }
            high.to_le_bytes()
        };
        let mut g = 0;
        while g < groups {
            let pair = format.paired() && g + 1 < groups;
            let mut block = [0u8; GROUP];
            match format.codes {
                Codes::Byte => (0..GROUP).for_each(|p| block[p] = codes(g, p)),
                _ if pair => (0..GROUP).for_each(|p| {
                    block[p] = (codes(g, p) & 0x0F) | ((codes(g + 1, p) & 0x0F) << 4)
                }),
                _ => (0..32).for_each(|p| {
                    block[p] = (codes(g, p) & 0x0F) | ((codes(g, p + 32) & 0x0F) << 4)
                }),
            }
            let code_len = if format.paired() && !pair { 32 } else { GROUP };
            put(dst, &block[..code_len]);
            let both = [g, g + 1];
            let unit = if pair { &both[..] } else { &both[..1] };
            if format.codes == Codes::Nib5 {
                for &u in unit {
                    put(dst, &mask(u));
                }
            }
            for &u in unit {
                let sc = &self.scales16[u * 4..u * 4 + 4];
                let vals: &[f32] = if format.scales4 {
                    // Lane order: lane i % 4 holds sub-block 2 (i % 2) + (i % 4) / 2.
                    &[sc[0], sc[2], sc[1], sc[3]]
                } else {
                    &[sc[0], sc[2]]
                };
                for v in vals {
                    put(dst, &v.to_le_bytes());
                }
            }
            g += unit.len();
        }
    }
}

/// Where group `g` of a row lives: (codes offset, nibble shift or `None` for bytes, whether
/// a lone group's 32-byte nibble layout, mask offset, scales offset).
pub fn group_offsets(
    f: PackFormat,
    g: usize,
    groups: usize,
) -> (usize, Option<u32>, bool, usize, usize) {
    if !f.paired() {
        let base = g * f.unit_bytes();
        return (base, None, false, base + 64, base + 64);
    }
    let base = g / 2 * f.unit_bytes();
    if g.is_multiple_of(2) && g + 1 == groups {
        let m = base + 32;
        return (base, Some(0), true, m, m + f.mask_bytes());
    }
    let h = g % 2;
    let m = base + 64 + h * f.mask_bytes();
    let sc = base + 64 + 2 * f.mask_bytes() + h * f.scale_bytes();
    (base, Some(4 * h as u32), false, m, sc)
}

/// The 64 unsigned codes of group `g` of a packed row, in register order, and its scales
/// (two, or Q6_K's four, in lane order).
pub fn group_parts(f: PackFormat, row: &[u8], g: usize, groups: usize) -> ([u8; GROUP], [f32; 4]) {
    let (co, shift, lone, mo, so) = group_offsets(f, g, groups);
    let mut c = [0u8; GROUP];
    match shift {
        None => c.copy_from_slice(&row[co..co + GROUP]),
        Some(sh) => {
            let high = if f.codes == Codes::Nib5 {
                let mut b = [0u8; 8];
                b.copy_from_slice(&row[mo..mo + 8]);
                u64::from_le_bytes(b)
            } else {
                0
            };
            for (p, c) in c.iter_mut().enumerate() {
                let nib = if lone {
                    if p < 32 {
                        row[co + p] & 0x0F
                    } else {
                        row[co + p - 32] >> 4
                    }
                } else {
                    (row[co + p] >> sh) & 0x0F
                };
                *c = nib | ((((high >> p) & 1) as u8) << 4);
            }
        }
    }
    let mut sc = [0f32; 4];
    for (j, v) in sc.iter_mut().enumerate().take(f.scale_bytes() / 4) {
        let o = so + 4 * j;
        *v = f32::from_le_bytes([row[o], row[o + 1], row[o + 2], row[o + 3]]);
    }
    (c, sc)
}

/// Scale of lane `i` from a group's scales.
#[inline]
pub fn lane_scale(f: PackFormat, sc: &[f32; 4], i: usize) -> f32 {
    if f.scales4 {
        sc[i % 4]
    } else {
        sc[i % 2]
    }
}

/// Decodes packed row `r` back to f32 (`cols` values), for tests: the repacking is exact.
pub fn unpack_row(w: &PackedWeight, r: usize, out: &mut [f32]) {
    let f = w.format;
    let bias = if f.bias_shift > 0 {
        1i32 << f.bias_shift
    } else {
        0
    };
    let mins = w.row_mins(r);
    for g in 0..w.groups {
        let (codes, sc) = group_parts(f, w.row(r), g, w.groups);
        for (p, &u) in codes.iter().enumerate() {
            let e = element_of(p);
            let min = if f.has_min { mins[2 * g + e / 32] } else { 0.0 };
            let idx = g * GROUP + e;
            if idx < out.len() {
                out[idx] = lane_scale(f, &sc, p / 4) * (u as i32 - bias) as f32 + min;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_a_permutation_of_a_group() {
        let mut seen = [false; GROUP];
        for p in 0..GROUP {
            seen[element_of(p)] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // Lane 5 covers elements 4..8 of sub-block 2; lane 2 the first four of sub-block 1.
        assert_eq!(element_of(20), 32 + 4);
        assert_eq!(element_of(8), 16);
        // Every lane stays inside one 32-element block, the block of its parity.
        for p in 0..GROUP {
            assert_eq!(element_of(p) / 32, (p / 4) % 2);
        }
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
