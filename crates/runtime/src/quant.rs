//! Block decoding for every supported storage type.
//!
//! The layouts are ggml's (see the GGUF specification): each block starts with its f16 scale(s)
//! and packs its quants after. Decoding follows ggml's reference arithmetic step by step, in
//! f32 and in the same order, so results are bit-identical to gguf-py and llama.cpp's reference
//! dequantizers. Kernels call [`dequantize_row`] on one row (or a part of one) at a time: whole
//! matrices are never expanded.

use crate::dtype::QK_K;
use crate::DType;
use half::{bf16, f16};

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Decodes `out.len()` elements stored as `dtype` in `src`.
///
/// `out.len()` must be a multiple of the block size and `src` must hold exactly that many
/// blocks; callers ([`crate::Tensor`]) guarantee both, and a mismatch panics as a logic error.
pub fn dequantize_row(dtype: DType, src: &[u8], out: &mut [f32]) {
    let bs = dtype.block_size();
    let bb = dtype.block_bytes();
    assert!(
        out.len().is_multiple_of(bs) && src.len() == out.len() / bs * bb,
        "dequantize_row: {} bytes of {dtype} cannot hold {} elements",
        src.len(),
        out.len()
    );
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        _ => {
            for (blk, y) in src.chunks_exact(bb).zip(out.chunks_exact_mut(bs)) {
                dequantize_block(dtype, blk, y);
            }
        }
    }
}

fn dequantize_block(dtype: DType, b: &[u8], y: &mut [f32]) {
    match dtype {
        DType::Q4_0 => {
            let d = f16_at(b, 0);
            let qs = &b[2..18];
            for j in 0..16 {
                let x0 = (qs[j] & 0x0F) as i32 - 8;
                let x1 = (qs[j] >> 4) as i32 - 8;
                y[j] = x0 as f32 * d;
                y[j + 16] = x1 as f32 * d;
            }
        }
        DType::Q4_1 => {
            let d = f16_at(b, 0);
            let m = f16_at(b, 2);
            let qs = &b[4..20];
            for j in 0..16 {
                y[j] = (qs[j] & 0x0F) as f32 * d + m;
                y[j + 16] = (qs[j] >> 4) as f32 * d + m;
            }
        }
        DType::Q5_0 => {
            let d = f16_at(b, 0);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let qs = &b[6..22];
            for j in 0..16 {
                let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                let x0 = ((qs[j] & 0x0F) | xh0) as i32 - 16;
                let x1 = ((qs[j] >> 4) | xh1) as i32 - 16;
                y[j] = x0 as f32 * d;
                y[j + 16] = x1 as f32 * d;
            }
        }
        DType::Q5_1 => {
            let d = f16_at(b, 0);
            let m = f16_at(b, 2);
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            let qs = &b[8..24];
            for j in 0..16 {
                let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                let x0 = (qs[j] & 0x0F) | xh0;
                let x1 = (qs[j] >> 4) | xh1;
                y[j] = x0 as f32 * d + m;
                y[j + 16] = x1 as f32 * d + m;
            }
        }
        DType::Q8_0 => {
            let d = f16_at(b, 0);
            for (o, &q) in y.iter_mut().zip(&b[2..34]) {
                *o = (q as i8) as f32 * d;
            }
        }
        DType::Q4_K => {
            let d = f16_at(b, 0);
            let dmin = f16_at(b, 2);
            let scales = &b[4..16];
            let qs = &b[16..144];
            for (chunk, (q, yy)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                let (sc1, m1) = scale_min_k4(2 * chunk, scales);
                let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
                let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
                let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
                for l in 0..32 {
                    yy[l] = d1 * (q[l] & 0x0F) as f32 - min1;
                    yy[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
                }
            }
        }
        DType::Q5_K => {
            let d = f16_at(b, 0);
            let dmin = f16_at(b, 2);
            let scales = &b[4..16];
            let qh = &b[16..48];
            let qs = &b[48..176];
            for (chunk, (ql, yy)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                let (sc1, m1) = scale_min_k4(2 * chunk, scales);
                let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
                let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
                let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
                let u1 = 1u8 << (2 * chunk);
                let u2 = 2u8 << (2 * chunk);
                for l in 0..32 {
                    let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                    let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                    yy[l] = d1 * ((ql[l] & 0x0F) + h1) as f32 - min1;
                    yy[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - min2;
                }
            }
        }
        DType::Q6_K => {
            let ql_all = &b[0..128];
            let qh_all = &b[128..192];
            let sc_all = &b[192..208];
            let d = f16_at(b, 208);
            for n in 0..QK_K / 128 {
                let ql = &ql_all[64 * n..64 * n + 64];
                let qh = &qh_all[32 * n..32 * n + 32];
                let sc = &sc_all[8 * n..8 * n + 8];
                let yy = &mut y[128 * n..128 * n + 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    let s = |i: usize| d * (sc[i] as i8) as f32;
                    yy[l] = s(is) * q1 as f32;
                    yy[l + 32] = s(is + 2) * q2 as f32;
                    yy[l + 64] = s(is + 4) * q3 as f32;
                    yy[l + 96] = s(is + 6) * q4 as f32;
                }
            }
        }
        DType::F32 | DType::F16 | DType::BF16 => {
            unreachable!("float types are decoded per element")
        }
    }
}

/// Scale and min of sub-block `j` (0..8) packed in 6 bits each in the 12 K-quant scale bytes.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_block_decodes_scale_times_quant() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2] = 4;
        b[3] = (-6i8) as u8;
        let mut y = [0f32; 32];
        dequantize_row(DType::Q8_0, &b, &mut y);
        assert_eq!(&y[..3], &[2.0, -3.0, 0.0]);
    }

    #[test]
    fn q4_0_nibbles_are_offset_by_eight() {
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(2.0).to_bits().to_le_bytes());
        b[2] = 0xF0;
        let mut y = [0f32; 32];
        dequantize_row(DType::Q4_0, &b, &mut y);
        assert_eq!(y[0], -16.0);
        assert_eq!(y[16], 14.0);
    }
}
