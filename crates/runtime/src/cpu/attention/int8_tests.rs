//! Attention over an int8 cache: rows quantized by groups within half a step, attention equal
//! (to f32 rounding) to dense attention over the dequantized keys and values, and the same bits
//! whatever the batching, the split of a decode, the block path or the thread count.

use super::block::*;
use super::softmax::*;
use super::*;
use crate::cpu::kv_dtype::sealed::Portable;
use crate::cpu::kv_dtype::SCALE_GROUP;
use crate::cpu::KvElem;
use half::f16;

/// 6 query heads on 2 KV heads, scale 0.3, no soft-cap (the tests' usual shape).
pub(super) fn shape6x2(hd: usize, bs: usize, window: Option<usize>) -> AttentionShape {
    AttentionShape {
        num_heads: 6,
        num_kv_heads: 2,
        head_dim: hd,
        block_size: bs,
        scale: 0.3,
        sliding_window: window,
        softcap: None,
    }
}

/// A sequence's keys and values (`[len, kv_heads * head_dim]`) written into a fresh int8
/// cache through `table`, with the dequantized values each row was stored as.
struct Cache {
    k: Vec<i8>,
    v: Vec<i8>,
    ks: Vec<f16>,
    vs: Vec<f16>,
    /// `[len, kv_heads * head_dim]`: what attention sees.
    k_deq: Vec<f32>,
    v_deq: Vec<f32>,
}

impl Cache {
    fn write(shape: &AttentionShape, table: &[u32], k: &[f32], v: &[f32]) -> Cache {
        let (bs, hd, nkv) = (shape.block_size, shape.head_dim, shape.num_kv_heads);
        let len = k.len() / (nkv * hd);
        let blocks = table.iter().max().map_or(0, |&b| b as usize + 1);
        let rows = blocks * nkv * bs;
        let groups = shape.scale_groups();
        let mut c = Cache {
            k: vec![0; rows * hd],
            v: vec![0; rows * hd],
            ks: vec![f16::ZERO; rows * groups],
            vs: vec![f16::ZERO; rows * groups],
            k_deq: Vec::new(),
            v_deq: Vec::new(),
        };
        let slots: Vec<u32> = (0..len)
            .map(|j| table[j / bs] * bs as u32 + (j % bs) as u32)
            .collect();
        let pool = ThreadPool::new(2).unwrap();
        write_kv_scaled(
            Some(&pool),
            k,
            v,
            &slots,
            shape,
            (&mut c.k, &mut c.v, &mut c.ks, &mut c.vs),
        );
        // Read the rows back through the layout: keys transposed within a block.
        for j in 0..len {
            let (b, o) = (table[j / bs] as usize, j % bs);
            for g in 0..nkv {
                let base = shape.block_base(b, g);
                let sc = |s: &[f16], d: usize| {
                    s[shape.scale_base(b, g) + d / SCALE_GROUP * bs + o].to_f32()
                };
                for d in 0..hd {
                    c.k_deq
                        .push(f32::from(c.k[base + d * bs + o]) * sc(&c.ks, d));
                }
                for d in 0..hd {
                    c.v_deq
                        .push(f32::from(c.v[base + o * hd + d]) * sc(&c.vs, d));
                }
            }
        }
        c
    }

    fn attend(
        &self,
        pool: &ThreadPool,
        q: &[f32],
        seqs: &[SeqSlice],
        table: &[u32],
        shape: &AttentionShape,
        partials: &mut Vec<f32>,
    ) -> Vec<f32> {
        let mut out = vec![0f32; q.len()];
        paged_attention_scaled(
            pool,
            q,
            (
                &self.k,
                &self.v,
                RowScales {
                    k: &self.ks,
                    v: &self.vs,
                },
            ),
            seqs,
            table,
            shape,
            &mut out,
            partials,
        );
        out
    }
}

#[test]
fn rows_round_trip_within_half_a_step() {
    let mut r = 0x9e37_79b9u32;
    let mut rnd = || {
        r ^= r << 13;
        r ^= r >> 17;
        r ^= r << 5;
        (r % 20001) as f32 * 1e-3 - 10.0
    };
    // Groups of very different sizes in one row (an outlier channel among small values), and
    // rows of every magnitude the f16 scale holds, subnormal ones included.
    for scale in [1e-9f32, 1e-3, 1.0, 300.0, 1e3] {
        let mut x: Vec<f32> = (0..128).map(|_| rnd() * scale).collect();
        x[70] = 400.0 * scale;
        let mut q = vec![0i8; 128];
        let mut s = vec![f16::ZERO; 4];
        i8::encode_row(&x, &mut q, &mut s);
        for g in 0..4 {
            let xs = &x[g * 32..(g + 1) * 32];
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let sg = s[g].to_f32();
            assert!(sg >= amax / 127.0, "the scale is rounded up");
            // f16 spacing (relative 2^-10, or 2^-24 absolute below the normal range).
            assert!(sg <= amax / 127.0 * (1.0 + 2f32.powi(-10)) + 2f32.powi(-24));
            for (a, &b) in xs.iter().zip(&q[g * 32..(g + 1) * 32]) {
                let err = (a - f32::from(b) * sg).abs();
                assert!(err <= sg * 0.5 * (1.0 + 1e-6), "{a} -> {b}·{sg}: {err}");
            }
        }
        // The outlier's group alone is coarse (above the smallest f16 scales).
        if scale >= 1e-3 {
            assert!(s[2].to_f32() > 10.0 * s[0].to_f32(), "{s:?}");
        }
    }
    let mut q = vec![5i8; 4];
    let mut s = [f16::ONE];
    i8::encode_row(&[0.0; 4], &mut q, &mut s);
    assert_eq!((q.as_slice(), s[0].to_f32()), (&[0i8; 4][..], 0.0));
    for bad in [f32::NAN, f32::INFINITY, 1e9] {
        i8::encode_row(&[1.0, bad, 2.0], &mut q[..3], &mut s);
        assert!(
            !s[0].to_f32().is_finite(),
            "{bad}: the group's scale is not finite"
        );
    }
}

/// int8 attention against dense f64 attention over the dequantized rows: fast and general
/// block paths, a sliding window, a prefill and a decode split by part.
#[test]
fn matches_dense_attention_of_the_dequantized_rows() {
    for (bs, hd, window) in [(16, 64, None), (8, 16, Some(100)), (16, 128, None)] {
        let shape = shape6x2(hd, bs, window);
        let len = PART + 45;
        let (kvw, nb) = (2 * hd, len.div_ceil(bs));
        let table: Vec<u32> = (0..nb as u32).rev().collect();
        let f = |i: usize, s: f32| ((i as f32) * s).sin() * 3.0;
        let k: Vec<f32> = (0..len * kvw).map(|i| f(i, 0.7)).collect();
        let v: Vec<f32> = (0..len * kvw).map(|i| f(i, 1.1)).collect();
        let c = Cache::write(&shape, &table, &k, &v);
        assert!(c.k_deq.iter().zip(&k).any(|(a, b)| a != b), "int8 rounds");
        let row = 6 * hd;
        let q: Vec<f32> = (0..len * row).map(|i| f(i, 0.013)).collect();
        let pool = ThreadPool::new(2).unwrap();
        let mut partials = Vec::new();
        for (first, n) in [(0, len), (len - 1, 1)] {
            let seq = SeqSlice {
                query_start: 0,
                query_len: n,
                context_len: first + n,
                block_table_start: 0,
                num_blocks: nb,
                prompt_len: 0,
            };
            let qs = &q[first * row..(first + n) * row];
            let out = c.attend(&pool, qs, &[seq], &table, &shape, &mut partials);
            for t in 0..n {
                let pos = first + t;
                for h in 0..6 {
                    let g = h / 3;
                    let qv = &qs[(t * 6 + h) * hd..][..hd];
                    let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let s: Vec<f64> = (lo..=pos)
                        .map(|j| {
                            let kr = &c.k_deq[j * kvw + g * hd..][..hd];
                            qv.iter()
                                .zip(kr)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                                * 0.3
                        })
                        .collect();
                    let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        let want: f64 = (lo..=pos)
                            .zip(&e)
                            .map(|(j, p)| p / z * c.v_deq[j * kvw + g * hd + d] as f64)
                            .sum();
                        let got = out[(t * 6 + h) * hd + d] as f64;
                        assert!(
                            (got - want).abs() < 2e-5 * 3.0,
                            "bs {bs} hd {hd} t{pos} h{h} d{d}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// A split decode equals its row in the prefill, a batch equals its sequences alone, and one
/// thread equals two: the same bits.
#[test]
fn results_do_not_depend_on_split_batch_or_threads() {
    for (bs, hd) in [(16, 64), (8, 16)] {
        let shape = shape6x2(hd, bs, None);
        let len = 2 * PART + 37;
        let (kvw, nb) = (2 * hd, len.div_ceil(bs));
        let table: Vec<u32> = (0..nb as u32).rev().collect();
        let f = |i: usize, s: f32| ((i as f32) * s).sin();
        let k: Vec<f32> = (0..len * kvw).map(|i| f(i, 0.7)).collect();
        let v: Vec<f32> = (0..len * kvw).map(|i| f(i, 1.1)).collect();
        let c = Cache::write(&shape, &table, &k, &v);
        let row = 6 * hd;
        let q: Vec<f32> = (0..len * row).map(|i| f(i, 0.013)).collect();
        let (one, two) = (ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap());
        let mut partials = Vec::new();
        let seq = |start: usize, first: usize, n: usize| SeqSlice {
            query_start: start,
            query_len: n,
            context_len: first + n,
            block_table_start: 0,
            num_blocks: nb,
            prompt_len: 0,
        };
        let prefill = c.attend(&two, &q, &[seq(0, 0, len)], &table, &shape, &mut partials);
        assert_eq!(
            prefill,
            c.attend(&one, &q, &[seq(0, 0, len)], &table, &shape, &mut partials)
        );
        // Two decodes in one batch (both split by part), against the prefill's rows.
        let (a, b) = (len - 1, PART + 3);
        let mut qb = q[a * row..(a + 1) * row].to_vec();
        qb.extend_from_slice(&q[b * row..(b + 1) * row]);
        let both = [seq(0, a, 1), seq(1, b, 1)];
        let mut tables = table.clone();
        tables.extend_from_slice(&table);
        let both = [
            both[0],
            SeqSlice {
                block_table_start: nb,
                ..both[1]
            },
        ];
        let out = c.attend(&two, &qb, &both, &tables, &shape, &mut partials);
        assert_eq!(
            out[..row],
            prefill[a * row..(a + 1) * row],
            "bs {bs} hd {hd}"
        );
        assert_eq!(
            out[row..],
            prefill[b * row..(b + 1) * row],
            "bs {bs} hd {hd}"
        );
    }
}

/// The unrolled block path gives the general path's bits on an int8 block.
#[test]
fn fast_paths_equal_the_general_ones() {
    fn check<const HD: usize>() {
        let f = |i: usize, s: f32| ((i as f32) * s).sin();
        let q: Vec<f32> = (0..4 * HD).map(|i| f(i, 0.37)).collect();
        let keys: Vec<i8> = (0..HD * 16).map(|i| (f(i, 0.11) * 127.0) as i8).collect();
        let vals: Vec<i8> = (0..HD * 16).map(|i| (f(i, 0.23) * 127.0) as i8).collect();
        let groups = HD / SCALE_GROUP;
        let ks: Vec<f16> = (0..16 * groups)
            .map(|j| f16::from_f32(0.01 + (j % 23) as f32 * 1e-3))
            .collect();
        let vs: Vec<f16> = (0..16 * groups)
            .map(|j| f16::from_f32(0.03 - (j % 19) as f32 * 1e-3))
            .collect();
        let blk = BlockKv {
            keys: &keys,
            vals: &vals,
            k_scales: &ks,
            v_scales: &vs,
        };
        let pairs = [(0usize, 0usize), (0, 1), (0, 2), (0, 3)];
        for range in [(0, 16), (3, 11)] {
            let mut want_st = [SoftmaxState::EMPTY; 4];
            let mut want = vec![0f32; 4 * HD];
            let mut st = [SoftmaxState::EMPTY; 4];
            let mut got = vec![0f32; 4 * HD];
            for _ in 0..2 {
                for (p, &(_, h)) in pairs.iter().enumerate() {
                    block_any(
                        &q[h * HD..(h + 1) * HD],
                        blk,
                        16,
                        range,
                        0.125,
                        None,
                        &mut want_st[p],
                        &mut want[p * HD..(p + 1) * HD],
                    );
                }
                let run = Run {
                    pairs: &pairs,
                    first: 0,
                    range,
                    next: None,
                    far: None,
                };
                block_fast::<i8, Portable, HD, 4>(&run, &q, 0, 4, blk, 0.125, &mut st, &mut got);
            }
            assert_eq!(got, want, "hd {HD} {range:?}");
        }
    }
    check::<64>();
    check::<128>();
    check::<256>();
}

/// Every int8 value widens exactly in each build this CPU can run.
#[test]
fn int8_widening_is_exact_in_every_build() {
    use crate::cpu::kv_dtype::sealed::Isa;
    let all: Vec<i8> = (0..=255u8).map(|b| b as i8).collect();
    let check = |name: &str, widen: &dyn Fn(&[i8]) -> [f32; 16]| {
        for chunk in all.chunks_exact(16) {
            let got = widen(chunk);
            for (g, &b) in got.iter().zip(chunk) {
                assert_eq!(*g, f32::from(b), "{name}: {b}");
            }
        }
    };
    check("portable", &|c| Portable::i8x16(c));
    #[cfg(target_arch = "x86_64")]
    {
        /// # Safety
        /// The CPU supports AVX2 (the test checked).
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn avx2(c: &[i8]) -> [f32; 16] {
            crate::cpu::kv_dtype::sealed::Avx2::i8x16(c)
        }
        /// # Safety
        /// The CPU supports AVX-512F (the test checked).
        #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
        unsafe fn avx512(c: &[i8]) -> [f32; 16] {
            crate::cpu::kv_dtype::sealed::Avx512::i8x16(c)
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            // SAFETY: the CPU has the features.
            check("avx2", &|c| unsafe { avx2(c) });
        }
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
            // SAFETY: as above.
            check("avx512", &|c| unsafe { avx512(c) });
        }
    }
}
