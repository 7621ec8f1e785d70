//! `bench bandwidth`: this machine's streaming read bandwidth over a buffer far larger than
//! the caches, with the pool's threads: the bound on decode speed for a model larger than the
//! cache. The median of `num_iters` passes after one unmeasured pass.

use crate::median;
use anyhow::{bail, Result};
use ferrum_runtime::cpu::stream;
use ferrum_runtime::ThreadPool;
use std::time::Instant;

/// What was read.
#[derive(Debug, Clone, Copy)]
pub struct BandwidthResult {
    pub read_gb_s: f64,
    pub read_gb_s_best: f64,
    /// The sum of the words read (so the reads cannot be optimized away).
    pub checksum: u64,
}

/// Reads a buffer of `size_mib` MiB `num_iters + 1` times over `pool`.
pub fn bandwidth(pool: &ThreadPool, size_mib: usize, num_iters: usize) -> Result<BandwidthResult> {
    if size_mib == 0 || num_iters == 0 {
        bail!("--size-mib and --num-iters must be at least 1");
    }
    // At most 64 GiB: a figure about memory, not a way to exhaust it.
    if size_mib > 64 << 10 {
        bail!("--size-mib is at most 65536");
    }
    let data = stream::StreamBuffer::new(size_mib << 20);
    let bytes = data.num_bytes() as f64;
    let mut rates = Vec::with_capacity(num_iters);
    let mut checksum = 0u64;
    for i in 0..num_iters + 1 {
        let t = Instant::now();
        checksum = checksum.wrapping_add(data.read(pool));
        let secs = t.elapsed().as_secs_f64();
        if i > 0 {
            rates.push(bytes / secs / 1e9);
        }
    }
    let read_gb_s_best = rates.iter().copied().fold(0f64, f64::max);
    Ok(BandwidthResult {
        read_gb_s: median(rates),
        read_gb_s_best,
        checksum,
    })
}
