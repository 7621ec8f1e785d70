//! Paged attention and KV writes against dense references, in every instruction set and
//! cache type, and independent of batching, chunking and thread counts.

use super::block::*;
use super::planner::*;
use super::softmax::*;
use super::*;
use crate::cpu::kv_dtype::sealed::Portable;
use crate::cpu::KvElem;

/// Dense causal attention for one sequence whose cache blocks are laid out in `table` order.
#[test]
fn parallel_kv_writes_equal_serial_ones() {
    // 24 tokens over shuffled blocks, f16 and f32 caches: the same bits either way.
    let shape = AttentionShape {
        num_heads: 6,
        num_kv_heads: 3,
        head_dim: 64,
        block_size: 4,
        scale: 0.125,
        sliding_window: None,
        softcap: None,
    };
    let n = 24;
    let row = shape.num_kv_heads * shape.head_dim;
    let k: Vec<f32> = (0..n * row).map(|i| (i as f32 * 0.37).sin()).collect();
    let v: Vec<f32> = (0..n * row).map(|i| (i as f32 * 0.91).cos()).collect();
    let slots: Vec<u32> = (0..n as u32).map(|j| (j / 4 * 5 % 7) * 4 + j % 4).collect();
    let len = 7 * row * shape.block_size;
    let pool = ThreadPool::new(2).expect("pool");
    fn check<E: KvElem + PartialEq + std::fmt::Debug>(
        pool: &ThreadPool,
        k: &[f32],
        v: &[f32],
        slots: &[u32],
        shape: &AttentionShape,
        len: usize,
    ) {
        let zero = E::from_f32(0.0);
        let (mut ks, mut vs) = (vec![zero; len], vec![zero; len]);
        write_kv(k, v, slots, shape, &mut ks, &mut vs);
        let (mut kp, mut vp) = (vec![zero; len], vec![zero; len]);
        write_kv_par(pool, k, v, slots, shape, &mut kp, &mut vp);
        assert!(ks == kp && vs == vp);
        assert!(ks.iter().any(|&x| x != zero));
    }
    check::<f32>(&pool, &k, &v, &slots, &shape, len);
    check::<half::f16>(&pool, &k, &v, &slots, &shape, len);
}

#[test]
fn matches_dense_softmax_through_a_shuffled_block_table() {
    // Plain and soft-capped scores (Gemma 2: cap * tanh(s / cap)).
    for softcap in [None, Some(0.7f32)] {
        dense_check(softcap);
    }
}

fn dense_check(softcap: Option<f32>) {
    let shape = AttentionShape {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        block_size: 4,
        scale: 0.5,
        sliding_window: Some(5),
        softcap,
    };
    let len = 11;
    let table = [2u32, 0, 3];
    let kvw = shape.num_kv_heads * shape.head_dim;
    let f = |i: usize, s: f32| ((i as f32) * s).sin();
    let k: Vec<f32> = (0..len * kvw).map(|i| f(i, 0.7)).collect();
    let v: Vec<f32> = (0..len * kvw).map(|i| f(i, 1.3)).collect();
    let q: Vec<f32> = (0..len * 32).map(|i| f(i, 0.3)).collect();
    let slots: Vec<u32> = (0..len)
        .map(|j| table[j / 4] * 4 + (j % 4) as u32)
        .collect();
    let cache_len = 4 * shape.num_kv_heads * 4 * shape.head_dim;
    let (mut kc, mut vc) = (vec![0f32; cache_len], vec![0f32; cache_len]);
    write_kv(&k, &v, &slots, &shape, &mut kc, &mut vc);
    let seqs = [SeqSlice {
        query_start: 0,
        query_len: len,
        context_len: len,
        block_table_start: 0,
        num_blocks: 3,
        prompt_len: 0,
    }];
    let pool = ThreadPool::new(2).unwrap();
    let mut out = vec![0f32; q.len()];
    paged_attention(
        &pool,
        &q,
        &kc,
        &vc,
        &seqs,
        &table,
        &shape,
        &mut out,
        &mut Vec::new(),
    );
    for t in 0..len {
        for h in 0..4 {
            let g = h / 2;
            let qv = &q[(t * 4 + h) * 8..][..8];
            let lo = (t + 1).saturating_sub(5);
            let s: Vec<f64> = (lo..=t)
                .map(|j| super::super::dot(qv, &k[j * kvw + g * 8..][..8]) as f64 * 0.5)
                .map(|x| softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh()))
                .collect();
            let mx = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..8 {
                let want: f64 = (lo..=t)
                    .zip(&e)
                    .map(|(j, p)| p / z * v[j * kvw + g * 8 + d] as f64)
                    .sum();
                let got = out[(t * 4 + h) * 8 + d] as f64;
                assert!((got - want).abs() < 1e-5, "t{t} h{h} d{d}: {got} vs {want}");
            }
        }
    }
}

/// Grouped items (one thread, many items) and single-head items (two threads, few items)
/// give the same bits, and so does each sequence alone.
#[test]
fn results_do_not_depend_on_grouping_or_batch() {
    let shape = AttentionShape {
        num_heads: 6,
        num_kv_heads: 2,
        head_dim: 16,
        block_size: 4,
        scale: 0.25,
        sliding_window: None,
        softcap: None,
    };
    let kvw = 2 * 16;
    let f = |i: usize, s: f32| ((i as f32) * s).sin();
    // Sequence 0: 9 cached + 5 new tokens; sequence 1: 3 new tokens. Blocks 0..4 and 4..5.
    let lens = [(14usize, 5usize), (3, 3)];
    let tables: [&[u32]; 2] = [&[3, 0, 2, 4], &[1]];
    let cache_len = 5 * 2 * 4 * 16;
    let (mut kc, mut vc) = (vec![0f32; cache_len], vec![0f32; cache_len]);
    for (s, &(ctx, _)) in lens.iter().enumerate() {
        let k: Vec<f32> = (0..ctx * kvw).map(|i| f(i + 100 * s, 0.7)).collect();
        let v: Vec<f32> = (0..ctx * kvw).map(|i| f(i + 100 * s, 1.1)).collect();
        let slots: Vec<u32> = (0..ctx)
            .map(|j| tables[s][j / 4] * 4 + (j % 4) as u32)
            .collect();
        write_kv(&k, &v, &slots, &shape, &mut kc, &mut vc);
    }
    let q: Vec<f32> = (0..8 * 6 * 16).map(|i| f(i, 0.3)).collect();
    let slice = |start: usize, s: usize, table_start: usize| SeqSlice {
        query_start: start,
        query_len: lens[s].1,
        context_len: lens[s].0,
        block_table_start: table_start,
        num_blocks: tables[s].len(),
        prompt_len: 0,
    };
    let all_tables: Vec<u32> = tables.concat();
    let run = |threads: usize, seqs: &[SeqSlice], table: &[u32], q: &[f32]| {
        let pool = ThreadPool::new(threads).unwrap();
        let mut out = vec![0f32; q.len()];
        paged_attention(
            &pool,
            q,
            &kc,
            &vc,
            seqs,
            table,
            &shape,
            &mut out,
            &mut Vec::new(),
        );
        out
    };
    let both = [slice(0, 0, 0), slice(5, 1, 4)];
    let one = run(1, &both, &all_tables, &q);
    let two = run(2, &both, &all_tables, &q);
    assert_eq!(one, two);
    let first = run(2, &[slice(0, 0, 0)], tables[0], &q[..5 * 96]);
    assert_eq!(first, one[..5 * 96]);
    let second = run(1, &[slice(0, 1, 0)], tables[1], &q[5 * 96..]);
    assert_eq!(second, one[5 * 96..]);
}

#[test]
fn more_sequences_than_indexed_find_their_items() {
    // 300 one-token decodes (past INDEXED, whose items the walk finds) over one shared
    // cache: each sequence's rows equal the sequence run alone.
    let shape = AttentionShape {
        num_heads: 6,
        num_kv_heads: 2,
        head_dim: 16,
        block_size: 4,
        scale: 0.25,
        sliding_window: None,
        softcap: None,
    };
    let f = |i: usize, s: f32| ((i as f32) * s).sin();
    let cache_len = 5 * 2 * 4 * 16;
    let kc: Vec<f32> = (0..cache_len).map(|i| f(i, 0.7)).collect();
    let vc: Vec<f32> = (0..cache_len).map(|i| f(i, 1.1)).collect();
    let n = INDEXED + 44;
    let tables: Vec<u32> = (0..n)
        .flat_map(|s| (0..3).map(move |b| ((s + b) % 5) as u32))
        .collect();
    let seq = |s: usize, start: usize, table_start: usize| SeqSlice {
        query_start: start,
        query_len: 1,
        context_len: 9 + s % 4,
        block_table_start: table_start,
        num_blocks: 3,
        prompt_len: 0,
    };
    let seqs: Vec<SeqSlice> = (0..n).map(|s| seq(s, s, 3 * s)).collect();
    let q: Vec<f32> = (0..n * 6 * 16).map(|i| f(i, 0.3)).collect();
    let pool = ThreadPool::new(2).unwrap();
    let mut all = vec![0f32; q.len()];
    let mut partials = Vec::new();
    paged_attention(
        &pool,
        &q,
        &kc,
        &vc,
        &seqs,
        &tables,
        &shape,
        &mut all,
        &mut partials,
    );
    for s in 0..n {
        let mut one = vec![0f32; 96];
        paged_attention(
            &pool,
            &q[s * 96..(s + 1) * 96],
            &kc,
            &vc,
            &[seq(s, 0, 0)],
            &tables[3 * s..3 * s + 3],
            &shape,
            &mut one,
            &mut partials,
        );
        assert_eq!(one, all[s * 96..(s + 1) * 96], "sequence {s}");
    }
}

/// A decode over several softmax parts (split across the pool, folded after) gives the
/// same bits as the same token inside a prefill (parts folded in the item), for the fast
/// and the general block and head sizes, with and without a sliding window.
#[test]
fn split_decodes_equal_prefill_rows() {
    for (bs, hd, window) in [(16, 64, None), (8, 16, None), (16, 64, Some(300))] {
        let shape = super::int8_tests::shape6x2(hd, bs, window);
        let len = 2 * PART + 37;
        let kvw = 2 * hd;
        let nb = len.div_ceil(bs);
        // Blocks in reverse order, to go through the table.
        let table: Vec<u32> = (0..nb as u32).rev().collect();
        let f = |i: usize, s: f32| ((i as f32) * s).sin();
        let k: Vec<f32> = (0..len * kvw).map(|i| f(i, 0.7)).collect();
        let v: Vec<f32> = (0..len * kvw).map(|i| f(i, 1.1)).collect();
        let slots: Vec<u32> = (0..len)
            .map(|j| table[j / bs] * bs as u32 + (j % bs) as u32)
            .collect();
        let cache_len = nb * kvw * bs;
        let (mut kc, mut vc) = (vec![0f32; cache_len], vec![0f32; cache_len]);
        write_kv(&k, &v, &slots, &shape, &mut kc, &mut vc);
        let row = 6 * hd;
        let q: Vec<f32> = (0..len * row).map(|i| f(i, 0.013)).collect();
        let pool = ThreadPool::new(2).unwrap();
        let mut prefill = vec![0f32; q.len()];
        let whole = SeqSlice {
            query_start: 0,
            query_len: len,
            context_len: len,
            block_table_start: 0,
            num_blocks: nb,
            prompt_len: 0,
        };
        let mut partials = Vec::new();
        paged_attention(
            &pool,
            &q,
            &kc,
            &vc,
            &[whole],
            &table,
            &shape,
            &mut prefill,
            &mut partials,
        );
        // The last two tokens as a 2-token decode, and a middle one alone.
        for (first, n) in [(len - 2, 2), (PART + 3, 1)] {
            let seq = SeqSlice {
                query_start: 0,
                query_len: n,
                context_len: first + n,
                block_table_start: 0,
                num_blocks: nb,
                prompt_len: 0,
            };
            let mut out = vec![0f32; n * row];
            paged_attention(
                &pool,
                &q[first * row..(first + n) * row],
                &kc,
                &vc,
                &[seq],
                &table,
                &shape,
                &mut out,
                &mut partials,
            );
            assert_eq!(
                out,
                prefill[first * row..(first + n) * row],
                "bs {bs} hd {hd} window {window:?} tokens {first}+{n}"
            );
        }
    }
}

/// Attention over an f16 or bf16 cache gives exactly the bits of attention over an f32
/// cache holding the same rounded values, on the fast and the general block paths, for a
/// prefill and for decodes split by part.
#[test]
fn half_caches_equal_an_f32_cache_of_the_rounded_values() {
    fn check<E: KvElem>() {
        for (bs, hd, window) in [(16, 64, None), (8, 16, Some(100)), (16, 128, None)] {
            let shape = super::int8_tests::shape6x2(hd, bs, window);
            let len = PART + 45;
            let kvw = 2 * hd;
            let nb = len.div_ceil(bs);
            let table: Vec<u32> = (0..nb as u32).rev().collect();
            let f = |i: usize, s: f32| ((i as f32) * s).sin() * 3.0;
            let k: Vec<f32> = (0..len * kvw).map(|i| f(i, 0.7)).collect();
            let v: Vec<f32> = (0..len * kvw).map(|i| f(i, 1.1)).collect();
            let rounded =
                |x: &[f32]| -> Vec<f32> { x.iter().map(|&x| E::from_f32(x).to_f32()).collect() };
            let (kr, vr) = (rounded(&k), rounded(&v));
            assert_ne!(kr, k, "{:?} should round", E::DTYPE);
            let slots: Vec<u32> = (0..len)
                .map(|j| table[j / bs] * bs as u32 + (j % bs) as u32)
                .collect();
            let cache_len = nb * kvw * bs;
            let (mut kh, mut vh) = (
                super::super::zeroed_vec::<E>(cache_len),
                super::super::zeroed_vec::<E>(cache_len),
            );
            write_kv(&k, &v, &slots, &shape, &mut kh, &mut vh);
            let (mut kf, mut vf) = (vec![0f32; cache_len], vec![0f32; cache_len]);
            write_kv(&kr, &vr, &slots, &shape, &mut kf, &mut vf);
            let row = 6 * hd;
            let q: Vec<f32> = (0..len * row).map(|i| f(i, 0.013)).collect();
            let pool = ThreadPool::new(2).unwrap();
            let mut partials = Vec::new();
            // The whole prompt, then its last token as a decode (split by part).
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
                let mut half = vec![0f32; n * row];
                let mut full = vec![0f32; n * row];
                paged_attention(
                    &pool,
                    qs,
                    &kh,
                    &vh,
                    &[seq],
                    &table,
                    &shape,
                    &mut half,
                    &mut partials,
                );
                paged_attention(
                    &pool,
                    qs,
                    &kf,
                    &vf,
                    &[seq],
                    &table,
                    &shape,
                    &mut full,
                    &mut partials,
                );
                assert_eq!(
                    half,
                    full,
                    "{:?} bs {bs} hd {hd} tokens {first}+{n}",
                    E::DTYPE
                );
            }
        }
    }
    check::<half::f16>();
    check::<half::bf16>();
}

#[test]
fn fast_paths_equal_the_general_ones() {
    // Every head size with a fast path (Llama 64 and 128, Gemma 256).
    fast_equals_general::<64>();
    fast_equals_general::<128>();
    fast_equals_general::<256>();
}

fn fast_equals_general<const HD: usize>() {
    let f = |i: usize, s: f32| ((i as f32) * s).sin();
    let q: Vec<f32> = (0..4 * HD).map(|i| f(i, 0.37)).collect();
    let keys: Vec<f32> = (0..HD * 16).map(|i| f(i, 0.11)).collect();
    let vals: Vec<f32> = (0..HD * 16).map(|i| f(i, 0.23)).collect();
    let pairs = [(0usize, 0usize), (0, 1), (0, 2), (0, 3)];
    let blk = BlockKv {
        keys: &keys,
        vals: &vals,
        k_scales: &[],
        v_scales: &[],
    };
    for range in [(0, 16), (3, 11)] {
        // Two blocks in a row, so the second one rescales.
        let mut want_st = [SoftmaxState::EMPTY; 4];
        let mut want = vec![0f32; 4 * HD];
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
        }
        let mut st = [SoftmaxState::EMPTY; 4];
        let mut got = vec![0f32; 4 * HD];
        for _ in 0..2 {
            let run = Run {
                pairs: &pairs[..3],
                first: 0,
                range,
                next: None,
                far: None,
            };
            block_fast::<f32, Portable, HD, 3>(&run, &q, 0, 4, blk, 0.125, &mut st, &mut got);
            let run = Run {
                pairs: &pairs[3..],
                first: 3,
                range,
                next: None,
                far: None,
            };
            block_fast::<f32, Portable, HD, 1>(&run, &q, 0, 4, blk, 0.125, &mut st, &mut got);
        }
        assert_eq!(got, want, "hd {HD} {range:?}");
        for (a, b) in st.iter().zip(&want_st) {
            assert_eq!((a.max, a.denom), (b.max, b.denom));
        }
    }
}
