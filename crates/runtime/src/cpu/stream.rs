//! A streaming read of a buffer by every thread of the pool: the memory bandwidth that decode
//! of a model larger than the cache can at best use (`ferrum bench bandwidth`).
//!
//! Each thread reads its own contiguous runs of the buffer (as the matmul kernels read their own
//! weight tiles) in 512-bit loads, summing 64-bit words in four independent registers so the
//! loads, not the additions, set the pace; the sum keeps the reads from being optimized away.

use super::aligned::Aligned;
use super::simd;
use crate::ThreadPool;
use std::sync::atomic::{AtomicU64, Ordering};

/// A buffer to read, in the same kind of memory as the repacked weights (`Aligned`: huge
/// pages where the system gives them), every page written once so it is resident.
#[derive(Debug)]
pub struct StreamBuffer {
    words: Aligned<u64>,
}

impl StreamBuffer {
    /// `bytes` (rounded up to 8) of distinct values.
    pub fn new(bytes: usize) -> StreamBuffer {
        let mut words = Aligned::<u64>::zeroed(bytes.div_ceil(8));
        for (i, w) in words.iter_mut().enumerate() {
            *w = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        StreamBuffer { words }
    }

    /// Bytes held.
    pub fn num_bytes(&self) -> usize {
        8 * self.words.len()
    }

    /// Reads every byte with every thread of `pool` ([`read_all`]).
    pub fn read(&self, pool: &ThreadPool) -> u64 {
        read_all(pool, &self.words)
    }
}

/// How far ahead of its loads a thread prefetches, in words (4 KiB, as the matmul kernels).
#[cfg(target_arch = "x86_64")]
const PREFETCH_WORDS: usize = 512;

/// Words per pool task: 1 MiB.
const CHUNK: usize = 1 << 17;

/// The wrapping sum of every word of `data`, read by every thread of `pool` at once.
pub fn read_all(pool: &ThreadPool, data: &[u64]) -> u64 {
    let total = AtomicU64::new(0);
    pool.parallel_segments(data.len().div_ceil(CHUNK), 4, |range| {
        let words = &data[range.start * CHUNK..(range.end * CHUNK).min(data.len())];
        total.fetch_add(sum_words(words), Ordering::Relaxed);
    });
    total.into_inner()
}

/// The wrapping sum of `x`: 512-bit loads where the CPU has them (four independent sums, so
/// the loads set the pace), else plain words.
fn sum_words(x: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if simd::level() == simd::SimdLevel::Avx512 {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { sum_words_512(x) };
    }
    x.iter().fold(0u64, |a, &v| a.wrapping_add(v))
}

/// # Safety
/// The CPU supports AVX-512F (the caller checked [`super::simd::level`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_words_512(x: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut lines = x.chunks_exact(32);
    let mut acc = [_mm512_setzero_si512(); 4];
    for line in &mut lines {
        // The lead the matmul kernels keep over their weight streams (a hint: never faults).
        for k in 0..4 {
            let ahead = line.as_ptr().wrapping_add(PREFETCH_WORDS + 8 * k);
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
        }
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `line` holds 32 words, so words `8k .. 8k + 8` are inside it.
            let v = unsafe { _mm512_loadu_si512(line.as_ptr().add(8 * k) as *const __m512i) };
            *a = _mm512_add_epi64(*a, v);
        }
    }
    let sum = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    let tail = lines
        .remainder()
        .iter()
        .fold(0u64, |a, &v| a.wrapping_add(v));
    tail.wrapping_add(_mm512_reduce_add_epi64(sum) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_word_once() {
        let pool = ThreadPool::new(2).expect("pool");
        // Three and a bit tasks' worth, with a tail shorter than a line of 16 words.
        let data: Vec<u64> = (0..3 * CHUNK as u64 + 21).map(|i| i * 3 + 1).collect();
        let want = data.iter().fold(0u64, |a, &v| a.wrapping_add(v));
        assert_eq!(read_all(&pool, &data), want);
        assert_eq!(read_all(&pool, &[]), 0);
        let b = StreamBuffer::new(8 * data.len() - 5);
        let want = (0..data.len() as u64).fold(0u64, |a, i| {
            a.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        });
        assert_eq!((b.num_bytes(), b.read(&pool)), (8 * data.len(), want));
    }
}
