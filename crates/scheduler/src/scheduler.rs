//! The continuous-batching policy.
//!
//! Every sequence is a list of final tokens (prompt, then output) of which the first
//! `num_computed` have K/V in its blocks, possibly followed by proposed tokens (speculative
//! decoding, [`Scheduler::propose`]). A step gives each chosen sequence a run of new tokens
//! to compute: one for a decode, a chunk for a prefill (or a recompute after preemption), and
//! the proposals after a run that reaches the last final token. Such a run is sampled at its
//! last final token and at each proposal (`1 + num_proposed` rows of logits); the engine
//! passes the tokens it keeps to [`Scheduler::update`]: the accepted proposals, then one
//! token of the model's own. Rejected proposals are rolled back by resetting the computed
//! length; their slots are overwritten later. Blocks belong to the [`KvCacheManager`].
//!
//! Order within a step: running sequences that decode, running sequences still prefilling
//! (chunked within the token budget), then waiting sequences in the policy's order. Under a
//! policy that goes by priority first (`priority`, `slo`), running prefills continue by
//! priority (then, under `slo`, slack) rather than by admission, and a waiting sequence of a
//! better priority is admitted before a running prefill of a worse one takes its next chunk (a
//! batch prompt half prefilled does not hold up an interactive one). Given a
//! step cost model ([`Scheduler::schedule_with`]), the prefill tokens of a step are capped so
//! the step is predicted to take no longer than the tightest time-per-output-token target of
//! the decodes in it ([`Scheduler::set_tpot`]) and than the caller's step limit
//! ([`Scheduler::set_step_limit`]: a step cannot be interrupted, so a prompt with a first-token
//! deadline that arrives while one runs waits for all of it), but never below one block of
//! prefill, so waiting requests always progress. Admission
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
//!   exactly the tokens their hash names), and `num_computed <= num_final` between steps;
//! - only final tokens enter the prefix cache;
//! - with a cost model, a step's predicted seconds exceed its decodes' tightest TPOT target
//!   only by what the decodes alone and one block of prefill take, and the step limit only
//!   when its prefill takes at most half the limit (or one block).

mod budget;

use crate::queue::{RequestQueue, Running, SchedulingPolicy, Waiting, NO_DEADLINE};
use crate::{BlockPool, KvCacheManager, Result, SchedulerError};
use ferrum_types::{BlockId, ForwardBatch, RequestId, TokenId};
use std::collections::HashMap;

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
    /// The waiting order and the preemption victim ([`crate::queue`]).
    pub policy: SchedulingPolicy,
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
    /// New tokens to compute this step (proposals included).
    pub num_tokens: usize,
    /// Proposed tokens at the end of the run, verified this step.
    pub num_proposed: usize,
    /// The run reaches the sequence's last final token: sample a token from its logits (and
    /// from each proposal's).
    pub samples: bool,
}

impl ScheduledSeq {
    /// Rows of logits this sequence needs: the last `num_logits` tokens of its run.
    pub fn num_logits(&self) -> usize {
        if self.samples {
            1 + self.num_proposed
        } else {
            0
        }
    }
}

/// What one step runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    pub seqs: Vec<ScheduledSeq>,
    /// Blocks to fill with K/V read back from a tier below the pool, before the forward pass
    /// ([`KvCacheManager::take_loads`]).
    pub kv_loads: Vec<(BlockId, crate::BlockHash)>,
    /// Sequences preempted in this step (their K/V is gone; they wait for recompute).
    pub preempted: Vec<RequestId>,
    pub num_batched_tokens: usize,
    /// The prefill tokens this step was allowed under its decodes' TPOT targets and the step
    /// limit, when a cost model and a target or a limit bounded it
    /// ([`Scheduler::schedule_with`]).
    pub prefill_cap: Option<usize>,
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
    tenant: u32,
    /// The latest start that meets its first-token deadline ([`NO_DEADLINE`]: none).
    latest_start: u64,
    /// Its time-per-output-token target, in seconds.
    tpot: Option<f64>,
    arrival: u64,
    admitted: u64,
    /// Final tokens (prompt, then output), then the proposals for the next step.
    tokens: Vec<TokenId>,
    /// Length of the prompt as it arrived (see `SeqSlice::prompt_len`).
    prompt_len: usize,
    num_final: usize,
    num_computed: usize,
    /// Tokens found in the prefix cache at the latest admission.
    prefix_hits: usize,
    running: bool,
    /// Left out of every step until removed ([`Scheduler::hold`]).
    held: bool,
}

impl Seq {
    /// The sequence as the waiting queue holds it.
    fn waiting(&self, id: RequestId) -> Waiting {
        Waiting {
            id,
            priority: self.priority,
            arrival: self.arrival,
            tenant: self.tenant,
            latest_start: self.latest_start,
        }
    }

    fn num_proposals(&self) -> usize {
        self.tokens.len() - self.num_final
    }

    /// The run of a step with `budget` tokens left: new final tokens, then as many proposals
    /// as fit once the run reaches the last final token. Returns (tokens, proposals).
    fn run(&self, budget: usize) -> (usize, usize) {
        let remaining = self.num_final - self.num_computed;
        let n = remaining.min(budget);
        let k = if n == remaining {
            self.num_proposals().min(budget - n)
        } else {
            0
        };
        (n + k, k)
    }
}

/// The scheduler state: sequences, queues and the KV cache manager.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCacheManager,
    seqs: HashMap<RequestId, Seq>,
    /// Running sequences in admission order.
    running: Vec<RequestId>,
    /// Waiting sequences, in the policy's order.
    waiting: Box<dyn RequestQueue>,
    next_arrival: u64,
    next_admission: u64,
    stats: SchedulerStats,
    /// The longest a step may be planned, in seconds ([`Scheduler::set_step_limit`]).
    step_limit: Option<f64>,
    /// Scratch for `schedule` and `update`.
    order: Vec<RequestId>,
    new_tokens: Vec<TokenId>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Result<Scheduler> {
        cfg.validate()?;
        Ok(Scheduler {
            kv: KvCacheManager::new(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching),
            waiting: cfg.policy.queue(),
            cfg,
            seqs: HashMap::new(),
            running: Vec::new(),
            next_arrival: 0,
            next_admission: 0,
            stats: SchedulerStats::default(),
            step_limit: None,
            order: Vec::new(),
            new_tokens: Vec::new(),
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn pool(&self) -> &BlockPool {
        self.kv.pool()
    }

    pub fn kv_manager(&self) -> &KvCacheManager {
        &self.kv
    }

    /// See [`KvCacheManager::add_loadable`].
    pub fn add_loadable(&mut self, hash: crate::BlockHash) {
        self.kv.add_loadable(hash);
    }

    /// See [`KvCacheManager::remove_loadable`].
    pub fn remove_loadable(&mut self, hash: crate::BlockHash) {
        self.kv.remove_loadable(hash);
    }

    /// See [`KvCacheManager::set_report_stores`].
    pub fn set_report_stores(&mut self, on: bool) {
        self.kv.set_report_stores(on);
    }

    /// See [`KvCacheManager::take_stores`].
    pub fn take_kv_stores(&mut self) -> Vec<(BlockId, crate::BlockHash)> {
        self.kv.take_stores()
    }

    /// Queues a sequence of tenant 0. Lower `priority` values run first (under the
    /// `priority` and `fair` policies). The caller bounds the total length (prompt + output)
    /// by [`SchedulerConfig::capacity_tokens`].
    pub fn add(&mut self, id: RequestId, prompt: &[TokenId], priority: i32) -> Result<()> {
        self.add_for(id, prompt, priority, 0)
    }

    /// [`Scheduler::add`] for a tenant (the `fair` policy shares the engine between tenants).
    pub fn add_for(
        &mut self,
        id: RequestId,
        prompt: &[TokenId],
        priority: i32,
        tenant: u32,
    ) -> Result<()> {
        self.add_with(id, prompt, priority, tenant, NO_DEADLINE)
    }

    /// [`Scheduler::add_for`] with the latest start that meets the sequence's first-token
    /// deadline (the `slo` policy orders by it), in the caller's clock.
    pub fn add_with(
        &mut self,
        id: RequestId,
        prompt: &[TokenId],
        priority: i32,
        tenant: u32,
        latest_start: u64,
    ) -> Result<()> {
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
                tenant,
                latest_start,
                tpot: None,
                arrival,
                admitted: 0,
                tokens: prompt.to_vec(),
                prompt_len: prompt.len(),
                num_final: prompt.len(),
                num_computed: 0,
                prefix_hits: 0,
                running: false,
                held: false,
            },
        );
        self.waiting.push(Waiting {
            id,
            priority,
            arrival,
            tenant,
            latest_start,
        });
        Ok(())
    }

    /// Sets the tokens proposed to follow sequence `id` (speculative decoding), replacing any
    /// earlier proposals. The next step that schedules the sequence verifies them, as far as
    /// the token budget and free blocks allow, if its run reaches the last final token; then
    /// they are dropped. Proposals beyond the
    /// cache's capacity are cut; returns how many are kept.
    pub fn propose(&mut self, id: RequestId, proposals: &[TokenId]) -> Result<usize> {
        let capacity = self.cfg.capacity_tokens();
        let seq = self.seqs.get_mut(&id).ok_or(SchedulerError::Unknown(id))?;
        let k = proposals.len().min(capacity.saturating_sub(seq.num_final));
        seq.tokens.truncate(seq.num_final);
        seq.tokens.extend_from_slice(&proposals[..k]);
        Ok(k)
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

    /// A sequence's final tokens (prompt then output; proposals excluded).
    pub fn tokens(&self, id: RequestId) -> Option<&[TokenId]> {
        self.seqs.get(&id).map(|s| &s.tokens[..s.num_final])
    }

    /// The length of a sequence's prompt as it arrived.
    pub fn prompt_len(&self, id: RequestId) -> Option<usize> {
        self.seqs.get(&id).map(|s| s.prompt_len)
    }

    /// A sequence's tenant.
    pub fn tenant(&self, id: RequestId) -> Option<u32> {
        self.seqs.get(&id).map(|s| s.tenant)
    }

    /// A sequence's tokens with K/V in the cache.
    pub fn num_computed(&self, id: RequestId) -> Option<usize> {
        self.seqs.get(&id).map(|s| s.num_computed)
    }

    /// Holds slots for `n` tokens after running sequence `id`'s computed ones (a draft model
    /// writes its proposals there before the step that verifies them), without preempting
    /// anything: `false`, and nothing changed, when the pool lacks the blocks.
    pub fn reserve_lookahead(&mut self, id: RequestId, n: usize) -> bool {
        let Some(seq) = self.seqs.get(&id).filter(|s| s.running) else {
            return false;
        };
        self.kv.allocate_slots(id, seq.num_computed, 0, n, None)
    }

    /// Prompt tokens a sequence found in the prefix cache when it was (last) admitted.
    pub fn prefix_hits(&self, id: RequestId) -> Option<usize> {
        self.seqs.get(&id).map(|s| s.prefix_hits)
    }

    /// A sequence's block table.
    pub fn block_table(&self, id: RequestId) -> Option<&[BlockId]> {
        self.seqs.get(&id).map(|_| self.kv.block_table(id))
    }

    /// Zeroes the counters of [`Scheduler::stats`] (prefix-cache queries and hits,
    /// preemptions): what ran before is not to be reported (the engine's calibration).
    pub fn reset_stats(&mut self) {
        self.stats = SchedulerStats::default();
    }

    pub fn stats(&self) -> SchedulerStats {
        let pool = self.kv.pool();
        SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            blocks_total: pool.num_blocks(),
            blocks_free: pool.num_free(),
            blocks_cached: pool.num_cached(),
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
            self.waiting.remove(&seq.waiting(id));
        }
        self.kv.free(id);
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        self.schedule_with(None)
    }

    /// Plans the next step; with `cost` (the step cost model, fitted by the caller), the
    /// prefill tokens are capped for the decodes' TPOT targets and the step limit
    /// (`budget.rs`).
    pub fn schedule_with(&mut self, cost: Option<&crate::CostModel>) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let priority_first = self.cfg.policy.priority_first();
        // Decodes, then prefill chunks, of running sequences.
        for decode_pass in [true, false] {
            if !decode_pass {
                if let Some(cap) = cost.and_then(|c| self.prefill_cap(&out, c)) {
                    budget = budget.min(cap);
                    out.prefill_cap = Some(cap);
                }
            }
            // Preemption changes `running`; walk a snapshot and skip the preempted.
            self.order.clear();
            self.order.extend_from_slice(&self.running);
            if !decode_pass && priority_first {
                // Running prefills continue in the policy's order, not in admission order: an
                // interactive prompt admitted with a first chunk goes on before a batch prompt
                // admitted earlier takes the step's prefill budget.
                // Under `slo`, by slack while the first token is owed (as the victim rule).
                let slo = self.cfg.policy == SchedulingPolicy::Slo;
                let seqs = &self.seqs;
                self.order.sort_unstable_by_key(|id| {
                    seqs.get(id).map(|q| {
                        let owed = slo && q.num_final == q.prompt_len;
                        let slack = if owed { q.latest_start } else { NO_DEADLINE };
                        (q.priority, slack, q.admitted)
                    })
                });
            }
            for k in 0..self.order.len() {
                if budget == 0 {
                    break;
                }
                let id = self.order[k];
                let Some(seq) = self.seqs.get(&id).filter(|s| s.running && !s.held) else {
                    continue;
                };
                let remaining = seq.num_final - seq.num_computed;
                if remaining == 0 || (remaining == 1) != decode_pass {
                    continue;
                }
                if !decode_pass && priority_first {
                    // Waiting prompts of a better priority go before this one's next chunk.
                    let priority = seq.priority;
                    self.admit(&mut out, &mut budget, Some(priority));
                    if budget == 0 || !self.seqs.get(&id).is_some_and(|s| s.running) {
                        continue;
                    }
                }
                let seq = &self.seqs[&id];
                let (n, k) = seq.run(budget);
                if let Some((n, k)) = self.reserve(id, n, k, &mut out, &mut budget) {
                    let seq = &self.seqs[&id];
                    out.seqs.push(ScheduledSeq {
                        id,
                        start: seq.num_computed,
                        num_tokens: n,
                        num_proposed: k,
                        samples: seq.num_computed + n - k == seq.num_final,
                    });
                    // Counted for its tenant before anyone is admitted (the fair policy
                    // admits the least served).
                    self.waiting.charge(seq.tenant, n);
                    budget -= n;
                }
            }
        }
        self.admit(&mut out, &mut budget, None);
        out.num_batched_tokens = out.seqs.iter().map(|s| s.num_tokens).sum();
        out.kv_loads = self.kv.take_loads();
        out
    }

    /// Admits waiting sequences in the policy's order while their next chunk fits, those of a
    /// priority better (lower) than `before` only when it is given; not in a step that had to
    /// preempt (memory is short: let running finish).
    fn admit(&mut self, out: &mut SchedulerOutput, budget: &mut usize, before: Option<i32>) {
        while out.preempted.is_empty() && *budget > 0 && self.running.len() < self.cfg.max_num_seqs
        {
            let Some(w) = self.waiting.first() else {
                break;
            };
            if before.is_some_and(|p| w.priority >= p) {
                break;
            }
            let id = w.id;
            let Some((n, k)) = self.try_admit(id, *budget) else {
                break;
            };
            self.waiting.remove(&w);
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
                num_proposed: k,
                samples: seq.num_computed + n - k == seq.num_final,
            });
            let tenant = seq.tenant;
            self.waiting.charge(tenant, n);
            *budget -= n;
        }
    }

    /// Gets blocks for a run of `n` more tokens of running sequence `id`, the last `k` of them
    /// proposals. Proposals never cost a preemption: when the pool cannot take them they are
    /// dropped first; then others (or `id` itself) are preempted. Returns the run that fits,
    /// or `None` when `id` was preempted.
    fn reserve(
        &mut self,
        id: RequestId,
        n: usize,
        k: usize,
        out: &mut SchedulerOutput,
        budget: &mut usize,
    ) -> Option<(usize, usize)> {
        let computed = self.seqs[&id].num_computed;
        if self.kv.allocate_slots(id, computed, n, 0, None) {
            return Some((n, k));
        }
        let n = n - k;
        loop {
            if self.kv.allocate_slots(id, computed, n, 0, None) {
                return Some((n, 0));
            }
            let victim = self.pick_victim();
            self.preempt(victim, out, budget);
            if victim == id {
                return None;
            }
        }
    }

    /// The running sequence the policy gives up (never a held one).
    fn pick_victim(&self) -> RequestId {
        let running: Vec<Running> = self
            .running
            .iter()
            .map(|&id| (id, &self.seqs[&id]))
            .filter(|(_, s)| !s.held)
            .map(|(id, s)| Running {
                id,
                priority: s.priority,
                admitted: s.admitted,
                tenant: s.tenant,
                // Owed while no output token is out.
                deadline: if s.num_final == s.prompt_len {
                    s.latest_start
                } else {
                    NO_DEADLINE
                },
            })
            .collect();
        self.waiting
            .victim(&running)
            .expect("preemption needs a running sequence")
    }

    fn preempt(&mut self, id: RequestId, out: &mut SchedulerOutput, budget: &mut usize) {
        // A victim already scheduled this step gives its tokens back.
        if let Some(pos) = out.seqs.iter().position(|s| s.id == id) {
            *budget += out.seqs.remove(pos).num_tokens;
        }
        self.running.retain(|&r| r != id);
        self.kv.free(id);
        let seq = self.seqs.get_mut(&id).expect("victims are in the table");
        seq.num_computed = 0;
        seq.tokens.truncate(seq.num_final);
        seq.running = false;
        let w = seq.waiting(id);
        self.waiting.push(w);
        out.preempted.push(id);
        self.stats.preemptions += 1;
    }

    /// Admits waiting `id` if its next chunk fits: reuses cached full blocks, allocates the
    /// rest. Returns the run (tokens, proposals) to compute.
    fn try_admit(&mut self, id: RequestId, budget: usize) -> Option<(usize, usize)> {
        let seq = self.seqs.get(&id)?;
        let hits = self.kv.computed_blocks(id, &seq.tokens[..seq.num_final]);
        let reusable = (seq.num_final - 1) / self.cfg.block_size * self.cfg.block_size;
        let computed = hits.num_tokens;
        let seq = self.seqs.get_mut(&id)?;
        seq.num_computed = computed;
        let (mut n, mut k) = seq.run(budget);
        if !self.kv.allocate_slots(id, computed, n, 0, Some(&hits)) {
            // Proposals never keep a sequence waiting: try without them.
            if k == 0 || !self.kv.allocate_slots(id, computed, n - k, 0, Some(&hits)) {
                seq.num_computed = 0;
                return None;
            }
            (n, k) = (n - k, 0);
        }
        seq.prefix_hits = computed;
        if self.cfg.enable_prefix_caching {
            self.stats.prefix_queries += reusable as u64;
            self.stats.prefix_hits += computed as u64;
        }
        Some((n, k))
    }

    /// Leaves running sequence `id` out of every step from now on, keeping its blocks and
    /// never preempting it, until it is removed: the engine's overlapped steps hold a sequence
    /// whose last token is in flight, so no step computes a row it would drop (and no live
    /// sequence is preempted to make room for one).
    pub fn hold(&mut self, id: RequestId) -> Result<()> {
        let seq = self.seqs.get_mut(&id).ok_or(SchedulerError::Unknown(id))?;
        if !seq.running {
            return Err(SchedulerError::NotRunning(id));
        }
        seq.held = true;
        Ok(())
    }

    /// Replaces sequence `id`'s last final token (a placeholder [`Scheduler::update`] was
    /// given for a step whose token was not known yet) with `token`. The placeholder must not
    /// be computed yet, so no block hash has seen it.
    pub fn set_last_token(&mut self, id: RequestId, token: TokenId) -> Result<()> {
        let seq = self.seqs.get_mut(&id).ok_or(SchedulerError::Unknown(id))?;
        match seq.num_final.checked_sub(1) {
            Some(last) if seq.num_computed <= last => {
                seq.tokens[last] = token;
                Ok(())
            }
            _ => Err(SchedulerError::Computed(id)),
        }
    }

    /// Records a step's results. `sampled` holds, per scheduled sequence with `samples` set
    /// and in the step's order, the tokens it keeps: the accepted proposals (a prefix of those
    /// scheduled) and then one token of the model's own; a sequence without proposals has one.
    /// Its computed length becomes its run's final tokens plus the accepted proposals; the
    /// slots of rejected ones are rolled back. Ids of sequences removed meanwhile are ignored.
    pub fn update(&mut self, out: &SchedulerOutput, sampled: &[(RequestId, TokenId)]) {
        let mut cursor = 0;
        for s in &out.seqs {
            self.new_tokens.clear();
            if s.samples {
                if sampled.get(cursor).is_some_and(|&(id, _)| id == s.id) {
                    while let Some(&(_, t)) = sampled.get(cursor).filter(|(id, _)| *id == s.id) {
                        self.new_tokens.push(t);
                        cursor += 1;
                    }
                } else {
                    // Out of the step's order: find this sequence's tokens wherever they are.
                    self.new_tokens.extend(
                        sampled
                            .iter()
                            .filter(|(id, _)| *id == s.id)
                            .map(|&(_, t)| t),
                    );
                }
            }
            let Some(seq) = self.seqs.get_mut(&s.id) else {
                continue;
            };
            let final_end = s.start + s.num_tokens - s.num_proposed;
            let proposals = seq
                .tokens
                .get(seq.num_final..seq.num_final + s.num_proposed)
                .unwrap_or(&[]);
            let accepted = proposals
                .iter()
                .zip(&self.new_tokens)
                .take(self.new_tokens.len().saturating_sub(1))
                .take_while(|(p, t)| p == t)
                .count();
            seq.num_computed = if s.samples && self.new_tokens.is_empty() {
                // Nothing sampled (the caller dropped the sequence's logits): its last token
                // is computed again next step.
                final_end - 1
            } else {
                final_end + accepted
            };
            seq.tokens.truncate(seq.num_final);
            seq.tokens.extend_from_slice(&self.new_tokens);
            seq.num_final = seq.tokens.len();
            if accepted < s.num_proposed || self.new_tokens.is_empty() {
                self.kv.truncate(s.id, seq.num_computed);
            }
            self.kv.cache_blocks(s.id, &seq.tokens, seq.num_computed);
        }
    }

    /// Writes the step's batch: tokens, positions, slots and block tables, with logits for
    /// each sequence's last [`ScheduledSeq::num_logits`] tokens.
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
                self.kv.block_table(s.id),
                self.cfg.block_size,
                s.num_logits(),
            )?;
            batch.set_prompt_len(seq.prompt_len);
        }
        Ok(())
    }

    /// Checks the KV manager and every sequence against each other; for tests.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.kv.check()?;
        for (id, s) in &self.seqs {
            if s.running != self.running.contains(id) {
                return Err(format!(
                    "sequence {id}: running flag disagrees with the list"
                ));
            }
            if self.kv.block_table(*id).len() * self.cfg.block_size < s.num_computed {
                return Err(format!("sequence {id}: computed tokens outgrow its blocks"));
            }
            if s.num_computed > s.num_final {
                return Err(format!("sequence {id}: a proposal counts as computed"));
            }
            if !s.running && !self.kv.block_table(*id).is_empty() {
                return Err(format!("sequence {id}: waits while holding blocks"));
            }
        }
        if self.running.len() > self.cfg.max_num_seqs {
            return Err("too many running sequences".into());
        }
        Ok(())
    }
}
