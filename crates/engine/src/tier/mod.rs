//! KV tiers below the pool: where a cached full block's K/V goes so it outlives the pool, and
//! the process. Two tiers, each optional: host memory below a GPU's pool ([`host::HostTier`],
//! `--kv-offload-memory`) and the disk ([`disk::DiskTier`], `--kv-disk-dir`). Each keeps its
//! own eviction order ([`ferrum_scheduler::TierIndex`]: recently and often used first).
//!
//! How they meet the engine (`engine/tiers.rs`) and the pure scheduler:
//! - every block newly registered in the prefix cache is copied out of the KV cache (on a GPU
//!   by an asynchronous copy the next steps do not wait for) and handed to each tier that
//!   lacks it (`KvCacheManager::take_stores`): write-through, so a block the pool evicts is
//!   already below it;
//! - a new request whose prompt continues past the pool's cached prefix with blocks a tier
//!   holds gets them back: the host tier's at once (uploaded by the step that admits it, on
//!   the main stream before its forward pass, the host not waiting), the disk's after they
//!   were read and checked (the request waits alone: the engine goes on with the others).
//!   Either way they are *loadable*, and the step that admits the request fills fresh blocks
//!   with them instead of recomputing them (`SchedulerOutput::kv_loads`);
//! - files are keyed by the scheduler's specified block hash under a [`fingerprint`] of
//!   everything that makes K/V differ, so a restarted server (another build, another machine
//!   with the same model) finds what a previous run left.
//!
//! For a model on the CPU the pool is host memory already: `--kv-offload-memory` adds its
//! bytes to the pool (`EngineConfig::kv_offload_memory`) instead of copying blocks within the
//! same memory, and there is no host tier.

pub mod disk;
pub mod file;
pub mod host;

use ferrum_scheduler::BlockHash;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;

/// `--kv-disk-dir` and `--kv-disk-size`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvDiskConfig {
    pub dir: PathBuf,
    /// Most bytes of block files kept (header included).
    pub max_bytes: u64,
    /// What identifies the model's weights and tokenizer across runs (a digest of their
    /// files, `ferrum_models::weights_identity`).
    pub model_identity: String,
}

/// A tier's counters and gauges, as `/metrics` exports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TierCounters {
    /// Whether the tier is on.
    pub enabled: bool,
    /// Blocks served from the tier instead of being recomputed.
    pub hits: u64,
    /// Blocks of prompts' prefixes missing from the pool that the tier did not have either.
    pub misses: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Files found bad (truncated, corrupt, foreign), ignored and recomputed.
    pub bad_files: u64,
    pub write_failures: u64,
    pub evictions: u64,
    /// Seconds the I/O thread spent reading and checking blocks.
    pub read_seconds: f64,
    /// Seconds requests waited for their blocks before they could be scheduled.
    pub wait_seconds: f64,
    /// Blocks and bytes held now.
    pub blocks: u64,
    pub bytes: u64,
}

/// A warning about the disk tier, on standard error (the server's log).
pub fn warn(msg: &str) {
    eprintln!("ferrum: KV disk tier: {msg}");
}

/// What makes a cache's K/V differ, as one digest: the model (its identity), and the cache's
/// element type and layout, block size, attention shapes and RoPE. Equal fingerprints and equal
/// block hashes mean equal K/V bytes.
#[derive(Debug)]
pub struct FingerprintParts<'a> {
    pub model_identity: &'a str,
    /// `KvCache::layout`.
    pub layout: String,
    pub block_size: usize,
    pub block_bytes: usize,
    pub config: &'a ferrum_models::ModelConfig,
}

/// SHA-256 over the parts, each written as `name=value;` in a fixed order.
pub fn fingerprint(p: &FingerprintParts<'_>) -> [u8; 32] {
    let c = p.config;
    let text = format!(
        "ferrum.kv.fingerprint.v1;model={};layout={};block_size={};block_bytes={};arch={};\
         layers={};kv_heads={};head_dim={};rotary_dim={};rope_theta={:08x};rope_local_theta={};\
         rope_scaling={:?};",
        p.model_identity,
        p.layout,
        p.block_size,
        p.block_bytes,
        c.architecture,
        c.num_hidden_layers,
        c.num_key_value_heads,
        c.head_dim,
        c.rotary_dim,
        c.rope_theta.to_bits(),
        c.rope_local_theta
            .map_or("none".to_string(), |t| format!("{:08x}", t.to_bits())),
        c.rope_scaling,
    );
    Sha256::digest(text.as_bytes()).into()
}

/// A block read back or taken from a tier for a request, not yet in the pool.
#[derive(Debug)]
pub enum Staged {
    /// Read from disk and checked.
    Read(Vec<u8>),
    /// Taken from the host tier (back to it once uploaded, or when its request is gone).
    Held(ferrum_models::HostBlock),
}

/// A newly cached block on its way from the KV cache to the tiers.
#[derive(Debug)]
pub struct PendingCopy {
    pub hash: BlockHash,
    /// The pool's block it copies.
    pub block: u32,
    pub copy: ferrum_models::BlockCopy,
    /// Whether the main stream was ordered after it (the pool gave the block up).
    pub ordered: bool,
}

/// The tiers of one engine, and the blocks read back for requests, not yet in the pool.
#[derive(Debug, Default)]
pub struct KvTiers {
    pub host: Option<host::HostTier>,
    pub disk: Option<disk::DiskTier>,
    pub host_counters: TierCounters,
    pub disk_counters: TierCounters,
    /// Blocks read back or taken, not yet in the pool: the request they are for, and the
    /// K/V.
    pub staged: HashMap<BlockHash, (u64, Staged)>,
    /// Newly cached blocks on their way from the cache to the host, in the order they
    /// started (a host cache's are ready at once).
    pub copies: std::collections::VecDeque<PendingCopy>,
}

impl KvTiers {
    /// Whether every tier that is on holds `hash`.
    pub fn all_hold(&self, hash: BlockHash) -> bool {
        self.host.as_ref().is_none_or(|t| t.holds(hash))
            && self.disk.as_ref().is_none_or(|t| t.holds(hash))
    }

    /// Whether no tier is on.
    pub fn is_empty(&self) -> bool {
        self.host.is_none() && self.disk.is_none()
    }
}
