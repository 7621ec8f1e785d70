//! The draft model of speculative decoding: a smaller model with the target's vocabulary and
//! its own KV cache over the same block ids as the target's.
//!
//! Invariants: after every step the draft's cache holds, for every position the target
//! computed, the draft's K/V of the same token (it runs each step's batch right after the
//! target, before any rollback frees a block); its proposals for the next step are written
//! into look-ahead slots the scheduler holds for the sequence, and those positions are
//! computed again by both models when the next step verifies them.

use crate::{EngineError, Result};
use ferrum_models::{ForwardBatch, KvCache, Model};
use ferrum_scheduler::Scheduler;
use ferrum_types::{RequestId, TokenId};
use std::collections::HashMap;

/// A draft model and its cache.
#[derive(Debug)]
pub struct DraftModel {
    model: Model,
    kv: KvCache,
    batch: ForwardBatch,
    /// Proposals made at the end of a step, for the next.
    pending: HashMap<RequestId, Vec<TokenId>>,
    /// Sequences proposing at the end of this step, with their `k`.
    active: Vec<(RequestId, usize)>,
    /// Scratch: the sequences of one draft round, in batch order.
    round_ids: Vec<RequestId>,
}

impl DraftModel {
    /// `model` with a cache of `num_blocks` blocks of `block_size`; its vocabulary must be the
    /// target's.
    pub fn new(
        mut model: Model,
        target_vocab: usize,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<DraftModel> {
        let vocab = model.config().vocab_size;
        if vocab != target_vocab {
            return Err(EngineError::Invalid(format!(
                "the draft model's vocabulary has {vocab} tokens, the target's {target_vocab}: \
                 a draft must share the target's vocabulary"
            )));
        }
        let kv = model.new_kv_cache(num_blocks, block_size)?;
        Ok(DraftModel {
            model,
            kv,
            batch: ForwardBatch::new(),
            pending: HashMap::new(),
            active: Vec::new(),
            round_ids: Vec::new(),
        })
    }

    /// Runs the target's step batch through the draft, for its K/V only.
    pub fn follow(&mut self, batch: &ForwardBatch) -> Result<()> {
        self.batch.clone_from(batch);
        self.batch.logits_indices.clear();
        self.model.forward(&self.batch, &mut self.kv)?;
        Ok(())
    }

    /// The proposals made for `id` at the end of the last step (none if it made none).
    pub fn take(&mut self, id: RequestId, out: &mut Vec<TokenId>) {
        out.clear();
        if let Some(p) = self.pending.remove(&id) {
            out.extend_from_slice(&p);
        }
    }

    /// Proposes up to `k` tokens for each sequence of `seqs` (`(id, k)`, decoding: all final
    /// tokens but the last computed), by `k` greedy draft steps from its last token, batched
    /// over the sequences. Look-ahead slots come from `sched`; a sequence that cannot get them
    /// proposes nothing.
    pub fn propose(&mut self, sched: &mut Scheduler, seqs: &[(RequestId, usize)]) -> Result<()> {
        self.pending.clear();
        self.active.clear();
        for &(id, k) in seqs {
            if k > 0 && sched.reserve_lookahead(id, k) {
                self.active.push((id, k));
                self.pending.insert(id, Vec::with_capacity(k));
            }
        }
        let rounds = self.active.iter().map(|&(_, k)| k).max().unwrap_or(0);
        let bs = sched.config().block_size;
        let vocab = self.model.config().vocab_size;
        for round in 0..rounds {
            self.batch.clear();
            self.round_ids.clear();
            for &(id, k) in &self.active {
                if round >= k {
                    continue;
                }
                let (Some(tokens), Some(start), Some(table)) = (
                    sched.tokens(id),
                    sched.num_computed(id),
                    sched.block_table(id),
                ) else {
                    continue;
                };
                let made = self.pending.get(&id).map_or(&[][..], Vec::as_slice);
                let input = match round {
                    0 => tokens.last().copied(),
                    _ => made.last().copied(),
                };
                let Some(input) = input else {
                    continue;
                };
                self.batch.push_seq(&[input], start + round, table, bs, 1)?;
                // The draft picks LongRoPE's factors as the target does.
                if let Some(n) = sched.prompt_len(id) {
                    self.batch.set_prompt_len(n);
                }
                self.round_ids.push(id);
            }
            if self.round_ids.is_empty() {
                break;
            }
            let logits = self.model.forward(&self.batch, &mut self.kv)?;
            // [round_ids.len(), vocab]
            for (id, row) in self.round_ids.iter().zip(logits.chunks_exact(vocab)) {
                if let Some(p) = self.pending.get_mut(id) {
                    p.push(crate::sampler::argmax(row));
                }
            }
        }
        Ok(())
    }
}
