//! The pure scheduler: which tokens of which sequences run in the next forward pass, and
//! where their K/V live. No tensors, threads or I/O: the engine calls [`Scheduler::schedule`],
//! runs the batch it describes, and reports sampled tokens back with [`Scheduler::update`].
//!
//! - [`BlockPool`]: ref-counted KV blocks, an LRU free queue, chained hashes of full blocks
//!   for prefix reuse.
//! - [`KvCacheManager`]: every sequence's block table over the pool: allocate slots for new
//!   tokens plus a look-ahead, roll back to a computed length, cache full blocks of final
//!   tokens, free; blocks a tier below the pool holds (loaded in) and blocks newly cached (for
//!   the tiers to store) are named to the engine, which does the I/O.
//! - [`TierIndex`]: what a tier below the pool holds and its eviction order (a segmented LRU).
//! - [`Scheduler`]: vLLM V1's step: decodes first, then prefill chunks, then admissions in
//!   the waiting queue's order, within `max_num_batched_tokens` and `max_num_seqs`; recompute
//!   preemption of the policy's victim when blocks run out.
//! - [`queue`]: the policy seam, [`RequestQueue`]: first come first served, priority (the
//!   default), or a weighted fair queue between tenants ([`SchedulingPolicy`]).

mod block_hash;
mod block_pool;
pub mod cost;
mod error;
mod kv_manager;
pub mod queue;
mod scheduler;
mod tier_index;

pub use block_hash::{hash_block, BlockHash};
pub use block_pool::BlockPool;
pub use cost::{predict_first_token, CostModel, StepShape};
pub use error::{Result, SchedulerError};
pub use kv_manager::{ComputedBlocks, KvCacheManager};
pub use queue::{RequestQueue, SchedulingPolicy, NO_DEADLINE};
pub use scheduler::{ScheduledSeq, Scheduler, SchedulerConfig, SchedulerOutput, SchedulerStats};
pub use tier_index::{TierIndex, PROTECTED_SHARE};
