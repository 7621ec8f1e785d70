//! The continuous-batching policy.
//!
//! Every sequence is a list of tokens (prompt, then output) of which the first
//! `num_computed` have K/V in its blocks. A step gives each chosen sequence a run of new
//! tokens to compute: one for a decode, a chunk for a prefill (or a recompute after
//! preemption). A sequence whose run reaches its last token gets a token sampled, which the
//! engine passes to [`Scheduler::update`].
//!
//! Order within a step: running sequences that decode, running sequences still prefilling
//! (chunked within the token budget), then waiting sequences by (priority, arrival). Admission
//! stops at the first waiting sequence that does not fit, so equal priorities are served first
//! come first served. When a running sequence needs a block and none is free, the running
//! sequence with the lowest priority (largest value) that was admitted last is preempted: its
//! blocks are freed (full ones stay in the prefix cache) and it waits to be recomputed.
//!
//! Invariants (checked by the property tests):
//! - per step, scheduled tokens <= `max_num_batched_tokens` and running sequences <=
//!   `max_num_seqs`;
//! - a block's ref count equals the number of block tables that hold it; with no sequences
//!   the pool is whole;
//! - the first `num_computed` tokens of a sequence have K/V in its blocks (reused blocks hold
//!   exactly the tokens their hash names).

use crate::{hash_block, BlockHash, BlockPool, Result, SchedulerError};
use ferrum_types::{BlockId, ForwardBatch, RequestId, TokenId};
use std::collections::{BTreeSet, HashMap};

/// Limits of the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens computed per step (decodes count one each).
    pub max_num_batched_tokens: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the cache.
    pub num_blocks: usize,
    /// Reuse the K/V of full blocks whose tokens (and everything before them) match.
    pub enable_prefix_caching: bool,
}

impl SchedulerConfig {
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("block_size", self.block_size),
            ("num_blocks", self.num_blocks),
        ] {
            if v == 0 {
                return Err(SchedulerError::Config(format!("{name} must be at least 1")));
            }
        }
        Ok(())
    }

    /// Tokens the whole cache holds: the longest sequence that can ever run.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }
}

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub id: RequestId,
    /// Tokens already computed (the position of the first new token).
    pub start: usize,
    /// New tokens to compute this step.
    pub num_tokens: usize,
    /// The run reaches the sequence's last token: sample a token from its logits.
    pub samples: bool,
}

/// What one step runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    pub seqs: Vec<ScheduledSeq>,
    /// Sequences preempted in this step (their K/V is gone; they wait for recompute).
    pub preempted: Vec<RequestId>,
    pub num_batched_tokens: usize,
}

/// Counters for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub num_running: usize,
    pub num_waiting: usize,
    pub blocks_total: usize,
    pub blocks_free: usize,
    pub blocks_cached: usize,
    /// Prompt tokens looked up in the prefix cache at admission, and those found.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
}

#[derive(Debug, Clone)]
struct Seq {
    priority: i32,
    arrival: u64,
    admitted: u64,
    tokens: Vec<TokenId>,
    num_computed: usize,
    blocks: Vec<BlockId>,
    /// Chained hashes of full blocks, computed as far as needed.
    hashes: Vec<BlockHash>,
    /// Blocks of `blocks` registered in the prefix cache.
    num_cached_blocks: usize,
    running: bool,
}

/// The scheduler state: sequences, queues and the block pool.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    pool: BlockPool,
    seqs: HashMap<RequestId, Seq>,
    /// Running sequences in admission order.
    running: Vec<RequestId>,
    /// Waiting sequences by (priority, arrival).
    waiting: BTreeSet<(i32, u64, RequestId)>,
    next_arrival: u64,
    next_admission: u64,
    stats: SchedulerStats,
    /// Scratch for `schedule`.
    order: Vec<RequestId>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Result<Scheduler> {
        cfg.validate()?;
        Ok(Scheduler {
            pool: BlockPool::new(cfg.num_blocks),
            cfg,
            seqs: HashMap::new(),
            running: Vec::new(),
            waiting: BTreeSet::new(),
            next_arrival: 0,
            next_admission: 0,
            stats: SchedulerStats::default(),
            order: Vec::new(),
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Queues a sequence. Lower `priority` values run first. The caller bounds the total
    /// length (prompt + output) by [`SchedulerConfig::capacity_tokens`].
    pub fn add(&mut self, id: RequestId, prompt: &[TokenId], priority: i32) -> Result<()> {
        if prompt.is_empty() {
            return Err(SchedulerError::EmptyPrompt);
        }
        let capacity = self.cfg.capacity_tokens();
        if prompt.len() >= capacity {
            return Err(SchedulerError::TooLong {
                prompt: prompt.len(),
                capacity,
            });
        }
        if self.seqs.contains_key(&id) {
            return Err(SchedulerError::Duplicate(id));
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.seqs.insert(
            id,
            Seq {
                priority,
                arrival,
                admitted: 0,
                tokens: prompt.to_vec(),
                num_computed: 0,
                blocks: Vec::new(),
                hashes: Vec::new(),
                num_cached_blocks: 0,
                running: false,
            },
        );
        self.waiting.insert((priority, arrival, id));
        Ok(())
    }

    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// A sequence's tokens (prompt then output).
    pub fn tokens(&self, id: RequestId) -> Option<&[TokenId]> {
        self.seqs.get(&id).map(|s| s.tokens.as_slice())
    }

    /// A sequence's block table.
    pub fn block_table(&self, id: RequestId) -> Option<&[BlockId]> {
        self.seqs.get(&id).map(|s| s.blocks.as_slice())
    }

    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            blocks_total: self.pool.num_blocks(),
            blocks_free: self.pool.num_free(),
            blocks_cached: self.pool.num_cached(),
            ..self.stats.clone()
        }
    }

    /// Removes a sequence (finished or aborted) and frees its blocks. Unknown ids are ignored,
    /// so aborting twice is harmless.
    pub fn remove(&mut self, id: RequestId) {
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        if seq.running {
            self.running.retain(|&r| r != id);
        } else {
            self.waiting.remove(&(seq.priority, seq.arrival, id));
        }
        self.pool.free_all(&seq.blocks);
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        // Decodes, then prefill chunks, of running sequences.
        for decode_pass in [true, false] {
            // Preemption changes `running`; walk a snapshot and skip the preempted.
            self.order.clear();
            self.order.extend_from_slice(&self.running);
            for k in 0..self.order.len() {
                if budget == 0 {
                    break;
                }
                let id = self.order[k];
                let Some(seq) = self.seqs.get(&id).filter(|s| s.running) else {
                    continue;
                };
                let remaining = seq.tokens.len() - seq.num_computed;
                if remaining == 0 || (remaining == 1) != decode_pass {
                    continue;
                }
                let n = remaining.min(budget);
                if let Reserve::Done = self.reserve(id, n, &mut out, &mut budget) {
                    let seq = &self.seqs[&id];
                    out.seqs.push(ScheduledSeq {
                        id,
                        start: seq.num_computed,
                        num_tokens: n,
                        samples: seq.num_computed + n == seq.tokens.len(),
                    });
                    budget -= n;
                }
            }
        }
        // Admissions, unless this step had to preempt (memory is short: let running finish).
        while out.preempted.is_empty() && budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&(prio, arrival, id)) = self.waiting.first() else {
                break;
            };
            let Some(n) = self.try_admit(id, budget) else {
                break;
            };
            self.waiting.remove(&(prio, arrival, id));
            let seq = self
                .seqs
                .get_mut(&id)
                .expect("waiting ids are in the table");
            seq.running = true;
            seq.admitted = self.next_admission;
            self.next_admission += 1;
            self.running.push(id);
            out.seqs.push(ScheduledSeq {
                id,
                start: seq.num_computed,
                num_tokens: n,
                samples: seq.num_computed + n == seq.tokens.len(),
            });
            budget -= n;
        }
        out.num_batched_tokens = out.seqs.iter().map(|s| s.num_tokens).sum();
        out
    }

    /// Gets blocks for `n` more tokens of running sequence `id`, preempting others (or `id`
    /// itself) when the pool is empty.
    fn reserve(
        &mut self,
        id: RequestId,
        n: usize,
        out: &mut SchedulerOutput,
        budget: &mut usize,
    ) -> Reserve {
        loop {
            let seq = &self.seqs[&id];
            let need = (seq.num_computed + n).div_ceil(self.cfg.block_size);
            let missing = need.saturating_sub(seq.blocks.len());
            if missing <= self.pool.num_free() {
                let seq = self
                    .seqs
                    .get_mut(&id)
                    .expect("running ids are in the table");
                for _ in 0..missing {
                    let b = self.pool.allocate().expect("counted free blocks");
                    seq.blocks.push(b);
                }
                return Reserve::Done;
            }
            let victim = self.pick_victim();
            self.preempt(victim, out, budget);
            if victim == id {
                return Reserve::SelfPreempted;
            }
        }
    }

    /// The running sequence with the lowest priority, admitted last.
    fn pick_victim(&self) -> RequestId {
        let mut best: Option<(i32, u64, RequestId)> = None;
        for &r in &self.running {
            let s = &self.seqs[&r];
            let key = (s.priority, s.admitted, r);
            if best.is_none_or(|b| (key.0, key.1) > (b.0, b.1)) {
                best = Some(key);
            }
        }
        best.map(|b| b.2)
            .expect("preemption needs a running sequence")
    }

    fn preempt(&mut self, id: RequestId, out: &mut SchedulerOutput, budget: &mut usize) {
        // A victim already scheduled this step gives its tokens back.
        if let Some(pos) = out.seqs.iter().position(|s| s.id == id) {
            *budget += out.seqs.remove(pos).num_tokens;
        }
        self.running.retain(|&r| r != id);
        let seq = self.seqs.get_mut(&id).expect("victims are in the table");
        self.pool.free_all(&seq.blocks);
        seq.blocks.clear();
        seq.num_computed = 0;
        seq.num_cached_blocks = 0;
        seq.running = false;
        self.waiting.insert((seq.priority, seq.arrival, id));
        out.preempted.push(id);
        self.stats.preemptions += 1;
    }

    /// Admits waiting `id` if its next chunk fits: reuses cached full blocks, allocates the
    /// rest. Returns the number of new tokens to compute.
    fn try_admit(&mut self, id: RequestId, budget: usize) -> Option<usize> {
        let bs = self.cfg.block_size;
        let seq = self.seqs.get_mut(&id)?;
        // The last token is always computed (its logits are needed), so only blocks wholly
        // before it can be reused.
        let reusable = (seq.tokens.len() - 1) / bs;
        let mut hits: Vec<BlockId> = Vec::new();
        if self.cfg.enable_prefix_caching {
            extend_hashes(seq, reusable, bs);
            for h in &seq.hashes[..reusable] {
                match self.pool.lookup(*h) {
                    Some(b) => hits.push(b),
                    None => break,
                }
            }
        }
        let computed = hits.len() * bs;
        let n = (seq.tokens.len() - computed).min(budget);
        let need = (computed + n).div_ceil(bs) - hits.len();
        let hits_free = hits
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        if need + hits_free > self.pool.num_free() {
            return None;
        }
        if self.cfg.enable_prefix_caching {
            self.stats.prefix_queries += (reusable * bs) as u64;
            self.stats.prefix_hits += computed as u64;
        }
        for &b in &hits {
            self.pool.touch(b);
        }
        seq.blocks = hits;
        seq.num_cached_blocks = seq.blocks.len();
        seq.num_computed = computed;
        for _ in 0..need {
            let b = self.pool.allocate().expect("counted free blocks");
            seq.blocks.push(b);
        }
        Some(n)
    }

    /// Records a step's results: the scheduled tokens are computed, and `sampled` holds the
    /// token drawn for each scheduled sequence with `samples` set (ids of sequences removed
    /// meanwhile are ignored).
    pub fn update(&mut self, out: &SchedulerOutput, sampled: &[(RequestId, TokenId)]) {
        let bs = self.cfg.block_size;
        for s in &out.seqs {
            let Some(seq) = self.seqs.get_mut(&s.id) else {
                continue;
            };
            seq.num_computed = s.start + s.num_tokens;
            if self.cfg.enable_prefix_caching {
                let full = seq.num_computed / bs;
                extend_hashes(seq, full, bs);
                for i in seq.num_cached_blocks..full {
                    self.pool.cache(seq.blocks[i], seq.hashes[i]);
                }
                seq.num_cached_blocks = seq.num_cached_blocks.max(full);
            }
        }
        for &(id, tok) in sampled {
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.tokens.push(tok);
            }
        }
    }

    /// Writes the step's batch: tokens, positions, slots and block tables. `compute_logits`
    /// follows [`ScheduledSeq::samples`].
    pub fn fill_batch(
        &self,
        out: &SchedulerOutput,
        batch: &mut ForwardBatch,
    ) -> ferrum_types::Result<()> {
        batch.clear();
        for s in &out.seqs {
            let seq = &self.seqs[&s.id];
            batch.push_seq(
                &seq.tokens[s.start..s.start + s.num_tokens],
                s.start,
                &seq.blocks,
                self.cfg.block_size,
                s.samples,
            )?;
        }
        Ok(())
    }

    /// Checks the pool and every block table against each other; for tests.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.pool.check()?;
        let mut refs = vec![0u32; self.pool.num_blocks()];
        for (id, s) in &self.seqs {
            if s.running != self.running.contains(id) {
                return Err(format!(
                    "sequence {id}: running flag disagrees with the list"
                ));
            }
            if s.blocks.len() * self.cfg.block_size < s.num_computed {
                return Err(format!("sequence {id}: computed tokens outgrow its blocks"));
            }
            for &b in &s.blocks {
                refs[b as usize] += 1;
            }
        }
        for (b, &r) in refs.iter().enumerate() {
            if self.pool.ref_count(b as BlockId) != r {
                return Err(format!(
                    "block {b}: ref count {} but {r} tables hold it",
                    self.pool.ref_count(b as BlockId)
                ));
            }
        }
        if self.running.len() > self.cfg.max_num_seqs {
            return Err("too many running sequences".into());
        }
        Ok(())
    }
}

enum Reserve {
    Done,
    SelfPreempted,
}

/// Makes sure `seq.hashes` covers its first `blocks` full blocks.
fn extend_hashes(seq: &mut Seq, blocks: usize, bs: usize) {
    while seq.hashes.len() < blocks {
        let i = seq.hashes.len();
        let parent = i.checked_sub(1).map(|p| seq.hashes[p]);
        seq.hashes
            .push(hash_block(parent, &seq.tokens[i * bs..(i + 1) * bs]));
    }
}
