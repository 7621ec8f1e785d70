//! Activation rows quantized to 8 bits for the integer kernels, once per row per layer input.
//!
//! Per 32-element block: `d = max|x| / 127`, codes `q = round(x / d)` (`|q| <= 127`). Codes are
//! stored in the register layout of [`super::qpack`] (groups of 64, byte `p` holding element
//! [`super::qpack::element_of`]`(p)`), next to what the kernels need: per 32-bit lane the
//! negated sum of its four codes (the weights' bias correction), per group the two block scales
//! `d` (lane `i` belongs to block `i % 2`), and per 32-element block `d * Σq` for the weights'
//! minimums. Columns past `k` up to a multiple
//! of 64 are zero codes with zero scales.

use super::qpack::{min_stride, ORDER};
use super::simd::multiversion;

/// Elements per group: one 512-bit register of 8-bit codes.
pub const GROUP: usize = 64;
/// 32-bit lanes per group.
pub const LANES: usize = 16;

/// `[m, k]` activation rows, quantized.
#[derive(Debug, Default, Clone)]
pub struct Q8Acts {
    k: usize,
    m: usize,
    groups: usize,
    /// `[m, groups * 64]` codes in register layout.
    qs: Vec<i8>,
    /// `[m, groups * 16]`: minus the sum of each lane's four codes.
    neg_lane_sums: Vec<i32>,
    /// `[m, groups * 2]`: the scales of each group's two blocks.
    scales: Vec<f32>,
    /// `[m, min_stride]`: `d * Σq` per 32-element block, zero-padded.
    block_sums: Vec<f32>,
}

/// One quantized activation row.
#[derive(Debug, Clone, Copy)]
pub struct ActRow<'a> {
    pub qs: &'a [i8],
    pub neg_lane_sums: &'a [i32],
    pub scales: &'a [f32],
    pub block_sums: &'a [f32],
}

impl Q8Acts {
    /// Quantizes `x` (`[m, k]`, `k > 0`, `k` a multiple of 32), reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], k: usize) {
        assert!(
            k.is_multiple_of(32) && k > 0 && x.len().is_multiple_of(k),
            "Q8Acts: bad shape"
        );
        let m = x.len() / k;
        let groups = k.div_ceil(GROUP);
        let ms = min_stride(groups);
        self.k = k;
        self.m = m;
        self.groups = groups;
        self.qs.resize(m * groups * GROUP, 0);
        self.neg_lane_sums.resize(m * groups * LANES, 0);
        self.scales.resize(m * groups * 2, 0.0);
        self.block_sums.resize(m * ms, 0.0);
        for (r, xr) in x.chunks_exact(k).enumerate() {
            quantize_row(
                xr,
                &mut self.qs[r * groups * GROUP..(r + 1) * groups * GROUP],
                &mut self.neg_lane_sums[r * groups * LANES..(r + 1) * groups * LANES],
                &mut self.scales[r * groups * 2..(r + 1) * groups * 2],
                &mut self.block_sums[r * ms..(r + 1) * ms],
            );
        }
    }

    pub fn rows(&self) -> usize {
        self.m
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    pub fn groups(&self) -> usize {
        self.groups
    }

    pub fn row(&self, i: usize) -> ActRow<'_> {
        let (g, ms) = (self.groups, min_stride(self.groups));
        ActRow {
            qs: &self.qs[i * g * GROUP..(i + 1) * g * GROUP],
            neg_lane_sums: &self.neg_lane_sums[i * g * LANES..(i + 1) * g * LANES],
            scales: &self.scales[i * g * 2..(i + 1) * g * 2],
            block_sums: &self.block_sums[i * ms..(i + 1) * ms],
        }
    }
}

multiversion! {
    /// One row: codes, lane sums, block scales and block sums (see the module docs).
    fn quantize_row(
        xr: &[f32],
        qs: &mut [i8],
        nls: &mut [i32],
        sc: &mut [f32],
        bs: &mut [f32],
    ) = quantize_row_impl;
}

#[inline(always)]
fn quantize_row_impl(xr: &[f32], qs: &mut [i8], nls: &mut [i32], sc: &mut [f32], bs: &mut [f32]) {
    let k = xr.len();
    bs.fill(0.0);
    for g in 0..qs.len() / GROUP {
        let mut codes = [0i8; GROUP];
        let mut d = [0f32; 2];
        for b in 0..2 {
            let start = g * GROUP + 32 * b;
            if start >= k {
                break;
            }
            let xs = &xr[start..start + 32];
            let mut amax = [0f32; 8];
            for c in xs.chunks_exact(8) {
                for j in 0..8 {
                    amax[j] = amax[j].max(c[j].abs());
                }
            }
            let amax = amax.iter().fold(0f32, |a, &v| a.max(v));
            let db = amax / 127.0;
            let id = if db > 0.0 { 1.0 / db } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in codes[32 * b..32 * b + 32].iter_mut().zip(xs) {
                *q = (v * id).round() as i8;
                sum += *q as i32;
            }
            d[b] = db;
            bs[2 * g + b] = db * sum as f32;
        }
        let gq = &mut qs[g * GROUP..(g + 1) * GROUP];
        for (q, &e) in gq.iter_mut().zip(&ORDER) {
            *q = codes[e];
        }
        for lane in 0..LANES {
            let s: i32 = gq[4 * lane..4 * lane + 4].iter().map(|&q| q as i32).sum();
            nls[g * LANES + lane] = -s;
        }
        sc[2 * g..2 * g + 2].copy_from_slice(&d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::qpack::element_of;

    #[test]
    fn quantization_round_trips_within_half_a_step() {
        let x: Vec<f32> = (0..96).map(|i| (i as f32 - 20.0) * 0.5).collect();
        let mut a = Q8Acts::default();
        a.quantize(&x, 96);
        assert_eq!(a.groups(), 2);
        let r = a.row(0);
        for p in 0..2 * GROUP {
            let (g, e) = (p / GROUP, element_of(p % GROUP));
            let lane = p / 4;
            let d = r.scales[2 * g + lane % 2];
            let idx = g * GROUP + e;
            if idx < 96 {
                assert!((r.qs[p] as f32 * d - x[idx]).abs() <= d * 0.5 + 1e-6);
            } else {
                assert_eq!((r.qs[p], d), (0, 0.0), "padding at {p}");
            }
        }
        for lane in 0..2 * LANES {
            let s: i32 = r.qs[4 * lane..4 * lane + 4].iter().map(|&q| q as i32).sum();
            assert_eq!(r.neg_lane_sums[lane], -s);
        }
        assert_eq!(r.block_sums.len(), 16);
        assert_eq!(r.block_sums[3], 0.0);
        a.quantize(&[0.0; 32], 32);
        assert_eq!(a.row(0).scales[0], 0.0);
        assert!(a.row(0).qs.iter().all(|&q| q == 0));
    }
}
