//! Criterion benches of the CPU kernels at SmolLM2-135M's shapes, on the machine's best
//! instruction set and both a one-thread and a full pool.
//!
//! Throughput is reported as elements per second where an element is one floating-point or
//! integer operation (2·m·n·k for a product: read "Gelem/s" as GFLOP/s) and, for the
//! single-row products that decode runs (bound by memory), as bytes of weights read per second.
//! `memory_roof` reads a buffer far larger than the caches: the machine's streaming bandwidth,
//! the ceiling for single-row products.
//!
//! Run with `cargo bench -p ferrum-runtime --bench kernels` (`-- qgemm` for one group).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrum_runtime::cpu::bpack::{self, Bf16Acts, Bf16Packed};
use ferrum_runtime::cpu::fpack::FloatPacked;
use ferrum_runtime::cpu::qdot::{Isa, Q8Acts};
use ferrum_runtime::cpu::qpack::PackedWeight;
use ferrum_runtime::cpu::{self, AttentionShape, KvElem, MatmulPrecision};
use ferrum_runtime::{DType, Storage, Tensor, ThreadPool};
use ferrum_types::batch::SeqSlice;
use std::hint::black_box;

/// Deterministic bytes with sane f16 scales for `rows x cols` of `dtype`.
fn weights(dtype: DType, rows: usize, cols: usize) -> Tensor {
    let bb = dtype.block_bytes();
    let nb = rows * cols / dtype.block_size();
    let mut x = 0x9E37_79B9u32;
    let mut v: Vec<u8> = (0..nb * bb)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 11) as u8
        })
        .collect();
    let scale = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    let offsets: &[usize] = match dtype {
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q6_K => &[208],
        _ => &[0],
    };
    for blk in v.chunks_exact_mut(bb) {
        for &o in offsets {
            blk[o..o + 2].copy_from_slice(&scale);
        }
    }
    Tensor::new(dtype, vec![rows, cols], Storage::owned(v)).expect("weights")
}

fn acts(m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
        .collect()
}

fn pools() -> Vec<(usize, ThreadPool)> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut v = vec![(1, ThreadPool::new(1).expect("pool"))];
    if n > 1 {
        v.push((n, ThreadPool::new(n).expect("pool")));
    }
    v
}

fn memory_roof(c: &mut Criterion) {
    let len = 256 << 20;
    let src: Vec<u64> = (0..len as u64 / 8).collect();
    let mut g = c.benchmark_group("memory_roof");
    g.throughput(Throughput::Bytes(len as u64));
    g.sample_size(10);
    // Eight independent sums: the loads, not the adds, set the pace.
    g.bench_function("read_256MiB", |b| {
        b.iter(|| {
            let mut acc = [0u64; 8];
            for c in black_box(&src).chunks_exact(8) {
                for j in 0..8 {
                    acc[j] = acc[j].wrapping_add(c[j]);
                }
            }
            acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
        })
    });
    g.finish();
}

/// Integer products over repacked weights: decode (m = 1, bytes/s) and prefill-like tiles.
/// Products whose weights come from memory, as in a forward pass (64 distinct gate_up-sized
/// Q4_1 weights, 42 MiB, more than the caches hold), for a 16-row decode step and a prefill
/// chunk: what the kernels' prefetching is for. The `qgemm` group's single weight stays in
/// cache.
fn qgemm_cold(c: &mut Criterion) {
    let isa = Isa::detect();
    let mut g = c.benchmark_group("qgemm_cold");
    g.sample_size(10);
    for (threads, pool) in pools() {
        let (n, k) = (1536, 576);
        let ws: Vec<PackedWeight> = (0..64)
            .map(|_| PackedWeight::pack(&weights(DType::Q4_1, n, k), &pool).expect("pack"))
            .collect();
        for m in [16usize, 128] {
            let mut q = Q8Acts::default();
            q.quantize(&acts(m, k), k);
            let mut out = vec![0f32; m * n];
            g.throughput(Throughput::Elements((2 * m * n * k * ws.len()) as u64));
            let id = format!("Q4_1/64x{n}x{k}/m{m}/t{threads}");
            g.bench_function(BenchmarkId::from_parameter(id), |b| {
                b.iter(|| {
                    for w in &ws {
                        cpu::matmul_q8(&pool, isa, &q, w, &mut out).expect("matmul")
                    }
                })
            });
        }
    }
    g.finish();
}

fn qgemm(c: &mut Criterion) {
    let isa = Isa::detect();
    let shapes = [("gate_up", 1536, 576), ("down", 576, 1536)];
    let mut g = c.benchmark_group("qgemm");
    g.sample_size(20);
    for (threads, pool) in pools() {
        for dtype in [
            DType::Q4_1,
            DType::Q4_0,
            DType::Q8_0,
            DType::Q4_K,
            DType::Q6_K,
        ] {
            for (name, n, k) in shapes {
                if k % dtype.block_size() != 0 {
                    continue;
                }
                let w = PackedWeight::pack(&weights(dtype, n, k), &pool).expect("pack");
                for m in [1usize, 16, 128] {
                    let mut q = Q8Acts::default();
                    q.quantize(&acts(m, k), k);
                    let mut out = vec![0f32; m * n];
                    if m == 1 {
                        g.throughput(Throughput::Bytes(w.num_bytes() as u64));
                    } else {
                        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
                    }
                    let id = format!("{dtype}/{name}_{n}x{k}/m{m}/t{threads}");
                    g.bench_function(BenchmarkId::from_parameter(id), |b| {
                        b.iter(|| cpu::matmul_q8(&pool, isa, &q, &w, &mut out).expect("matmul"))
                    });
                }
            }
        }
    }
    g.finish();
}

/// The tiled float kernel (f32 activations, float weights in 16-row tiles): decode (m = 1,
/// bytes/s) and prefill-like products (operations/s).
fn fgemm(c: &mut Criterion) {
    let isa = Isa::detect();
    let mut g = c.benchmark_group("fgemm");
    g.sample_size(20);
    for (threads, pool) in pools() {
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let (n, k) = (1536, 576);
            let w = FloatPacked::pack(&weights(dtype, n, k), &pool).expect("pack");
            for m in [1usize, 16, 128] {
                let x = acts(m, k);
                let mut out = vec![0f32; m * n];
                if m == 1 {
                    g.throughput(Throughput::Bytes(w.num_bytes() as u64));
                } else {
                    g.throughput(Throughput::Elements((2 * m * n * k) as u64));
                }
                let id = format!("{dtype}/{n}x{k}/m{m}/t{threads}");
                g.bench_function(BenchmarkId::from_parameter(id), |b| {
                    b.iter(|| cpu::matmul_f(&pool, isa, &x, &w, &mut out).expect("matmul"))
                });
            }
        }
    }
    g.finish();
}

/// bf16 weights against bf16 activations (`vdpbf16ps`), where the CPU has AVX-512 BF16.
fn bgemm(c: &mut Criterion) {
    if !bpack::supported() {
        return;
    }
    let mut g = c.benchmark_group("bgemm");
    g.sample_size(20);
    for (threads, pool) in pools() {
        let (n, k) = (1536, 576);
        let w = Bf16Packed::pack(&weights(DType::BF16, n, k), &pool).expect("pack");
        for m in [1usize, 16, 128] {
            let mut x = Bf16Acts::default();
            x.fill(&acts(m, k), k);
            let mut out = vec![0f32; m * n];
            if m == 1 {
                g.throughput(Throughput::Bytes(w.num_bytes() as u64));
            } else {
                g.throughput(Throughput::Elements((2 * m * n * k) as u64));
            }
            let id = format!("bf16/{n}x{k}/m{m}/t{threads}");
            g.bench_function(BenchmarkId::from_parameter(id), |b| {
                b.iter(|| cpu::matmul_b16_many(&pool, &x, &[&w], &mut [&mut out]).expect("matmul"))
            });
        }
    }
    g.finish();
}

/// The float reference path (f32 activations, weights decoded per row).
fn float_matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("float_matmul");
    g.sample_size(10);
    for (threads, pool) in pools() {
        for dtype in [DType::BF16, DType::F32, DType::Q4_1] {
            let (n, k) = (1536, 576);
            let w = weights(dtype, n, k);
            for m in [1usize, 16] {
                let x = acts(m, k);
                let mut out = vec![0f32; m * n];
                g.throughput(Throughput::Elements((2 * m * n * k) as u64));
                let id = format!("{dtype}/{n}x{k}/m{m}/t{threads}");
                g.bench_function(BenchmarkId::from_parameter(id), |b| {
                    b.iter(|| cpu::matmul(&pool, &x, &w, &mut out).expect("matmul"))
                });
            }
        }
    }
    g.finish();
    let _ = MatmulPrecision::Float;
}

fn quantize_acts(c: &mut Criterion) {
    let mut g = c.benchmark_group("quantize_acts");
    for (m, k) in [(1usize, 1536usize), (128, 576)] {
        let x = acts(m, k);
        let mut q = Q8Acts::default();
        g.throughput(Throughput::Bytes((4 * m * k) as u64));
        g.bench_function(format!("{m}x{k}"), |b| {
            b.iter(|| q.quantize(black_box(&x), k))
        });
    }
    g.finish();
}

/// Paged attention: 9 query heads over 3 KV heads of 64, blocks of 16, as one model step runs
/// it: 30 layers, each with its own key and value caches, so the step reads far more than the
/// caches hold (as a serving step does), and blocks of the sequences interleaved in memory (as
/// they are when sequences grow side by side). With f32 and f16 caches.
fn attention(c: &mut Criterion) {
    let mut g = c.benchmark_group("paged_attention");
    g.sample_size(10);
    for (threads, pool) in pools() {
        // (sequences, new tokens each, context each): decode batches and one prefill.
        for (seqs, q_len, ctx) in [(1usize, 1usize, 512usize), (16, 1, 256), (1, 512, 512)] {
            attention_case::<f32>(&mut g, &pool, threads, seqs, q_len, ctx);
            attention_case::<half::f16>(&mut g, &pool, threads, seqs, q_len, ctx);
        }
    }
    g.finish();
}

fn attention_case<E: KvElem>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    pool: &ThreadPool,
    threads: usize,
    seqs: usize,
    q_len: usize,
    ctx: usize,
) {
    const LAYERS: usize = 30;
    let shape = AttentionShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        block_size: 16,
        scale: 0.125,
        sliding_window: None,
        softcap: None,
    };
    let blocks_per_seq = ctx.div_ceil(16);
    let num_blocks = seqs * blocks_per_seq;
    let layer = num_blocks * 3 * 16 * 64;
    let fill = |n: usize| -> Vec<E> {
        acts(1, layer + n)[n..]
            .iter()
            .map(|&x| E::from_f32(x))
            .collect()
    };
    let caches: Vec<(Vec<E>, Vec<E>)> = (0..LAYERS).map(|l| (fill(l), fill(2 * l + 1))).collect();
    // Sequence s's j-th block is block j * seqs + s.
    let table: Vec<u32> = (0..seqs)
        .flat_map(|s| (0..blocks_per_seq).map(move |j| (j * seqs + s) as u32))
        .collect();
    let slices: Vec<SeqSlice> = (0..seqs)
        .map(|s| SeqSlice {
            query_start: s * q_len,
            query_len: q_len,
            context_len: ctx,
            block_table_start: s * blocks_per_seq,
            num_blocks: blocks_per_seq,
            prompt_len: 0,
        })
        .collect();
    let q = acts(seqs * q_len, 9 * 64);
    let mut out = vec![0f32; q.len()];
    let mut partials = Vec::new();
    // q·k and p·v over the visible keys, every layer.
    let visible: usize = if q_len == 1 {
        seqs * ctx
    } else {
        seqs * q_len * (q_len + 1) / 2
    };
    g.throughput(Throughput::Elements(
        (LAYERS * 2 * 2 * 9 * 64 * visible) as u64,
    ));
    let id = format!("seqs{seqs}_q{q_len}_ctx{ctx}_{}/t{threads}", E::DTYPE);
    g.bench_function(BenchmarkId::from_parameter(id), |b| {
        b.iter(|| {
            for (k, v) in &caches {
                cpu::paged_attention(
                    pool,
                    &q,
                    k,
                    v,
                    &slices,
                    &table,
                    &shape,
                    &mut out,
                    &mut partials,
                )
            }
        })
    });
}

fn small_ops(c: &mut Criterion) {
    let mut g = c.benchmark_group("small_ops");
    let (m, h) = (128usize, 576usize);
    let x = acts(m, h);
    let w = vec![1.0f32; h];
    let mut out = vec![0f32; m * h];
    g.throughput(Throughput::Bytes((8 * m * h) as u64));
    g.bench_function("rms_norm_128x576", |b| {
        b.iter(|| cpu::rms_norm(black_box(&x), &w, 1e-5, &mut out))
    });
    let up = acts(m, 1536);
    let mut gate = acts(m, 1536);
    g.throughput(Throughput::Bytes((8 * m * 1536) as u64));
    g.bench_function("silu_mul_128x1536", |b| {
        b.iter(|| cpu::silu_mul(black_box(&mut gate), &up))
    });
    let rope = cpu::Rope::new(64, 1e5, &cpu::RopeScaling::None, None, None);
    let mut qv = acts(m, 9 * 64);
    let positions: Vec<u32> = (0..m as u32).collect();
    g.throughput(Throughput::Bytes((8 * m * 9 * 64) as u64));
    g.bench_function("rope_128x9x64", |b| {
        b.iter(|| rope.apply(black_box(&mut qv), &positions))
    });
    g.finish();
}

criterion_group!(
    benches,
    memory_roof,
    qgemm,
    qgemm_cold,
    fgemm,
    bgemm,
    float_matmul,
    quantize_acts,
    attention,
    small_ops
);
criterion_main!(benches);
