//! Engine configuration, validated against the model before anything is allocated.

use crate::{EngineError, Result};

/// How big the KV cache is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvCacheSize {
    /// Exactly this many blocks.
    Blocks(usize),
    /// At most this many bytes.
    Bytes(u64),
    /// This fraction of the memory available when the engine starts.
    FractionOfFree(f64),
    /// vLLM's `--gpu-memory-utilization`: the fraction of the GPU's total memory this process
    /// may use; the KV cache gets what is left of it after what is in use (the weights).
    GpuUtilization(f64),
}

/// Settings of the batching engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    pub kv_cache: KvCacheSize,
    /// Context limit; `None` is the model's (capped by what the KV cache holds).
    pub max_model_len: Option<usize>,
    pub enable_prefix_caching: bool,
    /// Requests queued beyond the running ones before `generate` refuses new ones.
    pub max_waiting: usize,
    /// Make the whole KV cache resident while the engine is idle, starting right after start,
    /// a slice at a time between checks for requests (see `KvCache::populate`); off, pages
    /// become resident as blocks are first used.
    pub prefault_kv_cache: bool,
    /// Speculative decoding; `None` is off.
    pub speculative: Option<crate::SpeculativeConfig>,
    /// On a GPU, schedule and enqueue each step while the previous one runs, whose tokens
    /// come back by an asynchronous copy (stop conditions are then seen one step late); off,
    /// each step's tokens are on the host before the next step is scheduled.
    pub overlap_steps: bool,
    /// The disk tier below the pool (`--kv-disk-dir`), when on.
    pub kv_disk: Option<crate::tier::KvDiskConfig>,
    /// `--kv-offload-memory`: bytes of host memory for KV blocks below the pool. For a model
    /// on a GPU, the host tier (page-locked); for one on the CPU, whose pool is host memory
    /// already, they join the pool ([`EngineConfig::num_blocks`]).
    pub kv_offload_memory: Option<u64>,
    /// The waiting order and preemption victim (`--scheduling`). Under `Fair`, the weights
    /// come from `tenant_weights` (the policy's own list is replaced).
    pub scheduling: ferrum_scheduler::SchedulingPolicy,
    /// Tenants' weights by name (`--tenant-weights`); unlisted tenants weigh 1.
    pub tenant_weights: Vec<(String, u32)>,
    /// Where the step cost model starts (seconds per step, per prefill token, per decode row,
    /// per KV block) before the engine's own steps refine it.
    pub cost_seed: [f64; 4],
    /// Calibrate the cost model at start with a few synthetic requests of the engine's own
    /// (see `engine/calibrate.rs`), so predictions are trusted from the first request.
    pub calibrate: bool,
}

/// A step cost to start from: a few milliseconds per step, a millisecond per prefill token and
/// per decode row (a small model on a few cores); the engine's own steps replace it.
pub const DEFAULT_COST_SEED: [f64; 4] = [0.005, 0.001, 0.001, 0.0];

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            block_size: 16,
            kv_cache: KvCacheSize::Bytes(2 << 30),
            max_model_len: None,
            enable_prefix_caching: true,
            max_waiting: 1024,
            prefault_kv_cache: false,
            speculative: None,
            overlap_steps: true,
            kv_disk: None,
            kv_offload_memory: None,
            scheduling: ferrum_scheduler::SchedulingPolicy::Priority,
            tenant_weights: Vec::new(),
            cost_seed: DEFAULT_COST_SEED,
            calibrate: false,
        }
    }
}

/// Faults the engine loop injects into itself, for the tests that prove a failure is
/// contained (only with the `fault-injection` feature, which no shipped binary enables).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Default)]
pub struct FaultInjection {
    /// The engine loop panics at the start of this step (1-based).
    pub panic_at_step: Option<u64>,
}

/// Bytes of memory available now (Linux `MemAvailable`), if known.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl EngineConfig {
    /// The blocks `kv_offload_memory` adds to the pool of a model on the CPU (see the field).
    pub fn offload_blocks(&self, bytes_per_block: usize) -> usize {
        let b = self.kv_offload_memory.unwrap_or(0);
        (b / bytes_per_block.max(1) as u64) as usize
    }

    /// Checks the limits and works out the number of KV blocks for `bytes_per_block`.
    /// `device_memory`: free and total bytes of the model's device when that is not the host
    /// (a GPU); a fraction of free memory is then a fraction of its free memory. The pool of a
    /// model on the CPU also gets [`EngineConfig::offload_blocks`].
    pub fn num_blocks(
        &self,
        bytes_per_block: usize,
        device_memory: Option<(u64, u64)>,
    ) -> Result<usize> {
        let bad = |m: String| Err(EngineError::Config(m));
        if self.max_num_seqs == 0 {
            return bad("--max-num-seqs must be at least 1".into());
        }
        if self.max_num_batched_tokens == 0 {
            return bad("--max-num-batched-tokens must be at least 1".into());
        }
        if let Some(spec) = &self.speculative {
            spec.validate()?;
        }
        if !(1..=256).contains(&self.block_size) {
            return bad(format!(
                "--block-size {} is outside 1..=256",
                self.block_size
            ));
        }
        let bytes = match self.kv_cache {
            KvCacheSize::Blocks(0) => return bad("--num-kv-blocks must be at least 1".into()),
            KvCacheSize::Blocks(n) => return Ok(n),
            KvCacheSize::Bytes(b) => b,
            KvCacheSize::FractionOfFree(f) => {
                if !(f > 0.0 && f <= 1.0) {
                    return bad(format!("--kv-cache-memory fraction {f} is outside (0, 1]"));
                }
                let avail = device_memory
                    .map(|(free, _)| free)
                    .or_else(available_memory)
                    .ok_or_else(|| {
                        EngineError::Config(
                            "cannot read the available memory; give --kv-cache-memory in bytes"
                                .into(),
                        )
                    })?;
                (avail as f64 * f) as u64
            }
            KvCacheSize::GpuUtilization(f) => {
                if !(f > 0.0 && f <= 1.0) {
                    return bad(format!("--gpu-memory-utilization {f} is outside (0, 1]"));
                }
                let Some((free, total)) = device_memory else {
                    return bad(
                        "--gpu-memory-utilization applies to a model on a GPU; size the KV \
                         cache with --kv-cache-memory"
                            .into(),
                    );
                };
                let in_use = total.saturating_sub(free);
                let budget = (total as f64 * f) as u64;
                if budget <= in_use {
                    return bad(format!(
                        "--gpu-memory-utilization {f} allows {budget} bytes of the GPU's {total}, \
                         but {in_use} are already in use (the weights): nothing is left for the \
                         KV cache"
                    ));
                }
                budget - in_use
            }
        };
        let n = (bytes / bytes_per_block.max(1) as u64) as usize;
        if n == 0 {
            return bad(format!(
                "--kv-cache-memory {bytes} bytes is less than one KV block ({bytes_per_block} bytes)"
            ));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kv_cache: KvCacheSize) -> EngineConfig {
        EngineConfig {
            kv_cache,
            ..EngineConfig::default()
        }
    }

    #[test]
    fn offload_memory_in_pool_blocks() {
        let c = EngineConfig {
            kv_cache: KvCacheSize::Bytes(10 << 20),
            kv_offload_memory: Some(6 << 20),
            ..EngineConfig::default()
        };
        assert_eq!(c.num_blocks(1 << 20, None).unwrap(), 10);
        assert_eq!(c.offload_blocks(1 << 20), 6);
        assert_eq!(c.offload_blocks(7 << 20), 0);
    }

    #[test]
    fn gpu_memory_utilization_leaves_the_kv_cache_what_the_weights_do_not_use() {
        const GIB: u64 = 1 << 30;
        // 80 GiB, 16 in use: 0.9 allows 72, so 56 GiB for the cache, in 1 MiB blocks.
        let c = cfg(KvCacheSize::GpuUtilization(0.9));
        let n = c.num_blocks(1 << 20, Some((64 * GIB, 80 * GIB))).unwrap();
        assert_eq!(n as u64, (72 * GIB - 16 * GIB) >> 20);
        let e = c.num_blocks(1 << 20, None).unwrap_err().to_string();
        assert!(e.contains("applies to a model on a GPU"), "{e}");
        let e = cfg(KvCacheSize::GpuUtilization(0.1))
            .num_blocks(1 << 20, Some((64 * GIB, 80 * GIB)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nothing is left for the KV cache"), "{e}");
        let e = cfg(KvCacheSize::GpuUtilization(1.5))
            .num_blocks(1 << 20, Some((64 * GIB, 80 * GIB)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside (0, 1]"), "{e}");
        // A fraction of free memory on a GPU is of the GPU's free memory.
        let n = cfg(KvCacheSize::FractionOfFree(0.5))
            .num_blocks(1 << 20, Some((64 * GIB, 80 * GIB)))
            .unwrap();
        assert_eq!(n as u64, (32 * GIB) >> 20);
    }
}
