//! The draft model of speculative decoding: a smaller model with the target's vocabulary and
//! its own KV cache over the same block ids as the target's.
//!
//! Invariants: after every step the draft's cache holds, for every position the target
//! computed, the draft's K/V of the same token. Its proposals for the next step are made by
//! greedy draft steps whose inputs (the last token, then each proposal but the last) are
//! written into look-ahead slots the scheduler holds for the sequence.
//!
//! The draft never computes a position twice: when the target verifies `[last, p1..pm]` from
//! position `s`, the draft already wrote `[last, p1..p(k-1)]` at `s..s+k` while proposing
//! (`covered`), so [`DraftModel::follow`] runs only what it has not seen (prefill chunks,
//! recomputed sequences). The one position it lacks, `pk` at `s+k` when all `k` were kept, is
//! held back (`carry`) and, if the target accepted it, runs in the first draft step of the
//! next proposal round together with the new last token; otherwise it was rolled back and
//! is dropped. So a step with all proposals accepted costs the draft `k` forwards, not
//! `k + 1`.

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
    /// Per sequence that proposed at the end of the last step: the position of its first
    /// draft input and the inputs the draft wrote from there.
    covered: HashMap<RequestId, (usize, Vec<TokenId>)>,
    /// Per sequence whose verified run ended one past what the draft wrote: that position
    /// and token, computed in the next proposal round if the target kept it.
    carry: HashMap<RequestId, (usize, TokenId)>,
    /// Forward passes since the last [`DraftModel::take_forwards`].
    forwards: u64,
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
            return Err(EngineError::Config(format!(
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
            covered: HashMap::new(),
            carry: HashMap::new(),
            forwards: 0,
        })
    }

    /// Runs the target's step batch (sequence `ids[i]` is `batch.seqs[i]`) through the draft,
    /// for its K/V only, leaving out the positions the draft wrote while proposing; the first
    /// position past them is held back for the next proposal round.
    pub fn follow(
        &mut self,
        batch: &ForwardBatch,
        ids: impl Iterator<Item = RequestId>,
        block_size: usize,
    ) -> Result<()> {
        self.batch.clear();
        self.carry.clear();
        for (slice, id) in batch.seqs.iter().zip(ids) {
            let end = slice.query_start + slice.query_len;
            let tokens = &batch.token_ids[slice.query_start..end];
            let start = slice.context_len - slice.query_len;
            let table = &batch.block_tables
                [slice.block_table_start..slice.block_table_start + slice.num_blocks];
            // How many of the slice's tokens the draft already wrote at the same positions.
            let seen = match self.covered.get(&id) {
                Some((at, inputs)) if *at == start => tokens
                    .iter()
                    .zip(inputs)
                    .take_while(|(a, b)| a == b)
                    .count(),
                _ => 0,
            };
            match tokens.len() - seen {
                0 => {}
                1 if seen > 0 => {
                    self.carry.insert(id, (start + seen, tokens[seen]));
                }
                _ => {
                    self.batch
                        .push_seq(&tokens[seen..], start + seen, table, block_size, 0)?;
                    self.batch.set_prompt_len(slice.prompt_len);
                }
            }
        }
        self.covered.clear();
        if !self.batch.seqs.is_empty() {
            self.forwards += 1;
            self.model.forward(&self.batch, &mut self.kv)?;
        }
        Ok(())
    }

    /// Forward passes run since the last call.
    pub fn take_forwards(&mut self) -> u64 {
        std::mem::take(&mut self.forwards)
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
    /// proposes nothing. A held-back position the target kept runs in the first step (also
    /// for sequences that do not propose, so the cache stays whole).
    pub fn propose(&mut self, sched: &mut Scheduler, seqs: &[(RequestId, usize)]) -> Result<()> {
        self.pending.clear();
        self.active.clear();
        self.covered.clear();
        for &(id, k) in seqs {
            if k > 0 && sched.reserve_lookahead(id, k) {
                self.active.push((id, k));
                self.pending.insert(id, Vec::with_capacity(k));
            }
        }
        // Held-back positions the target kept: the sequence computed past them, same token.
        let carry = std::mem::take(&mut self.carry);
        let kept = |id: RequestId| {
            let &(pos, tok) = carry.get(&id)?;
            let computed = sched.num_computed(id)?;
            (computed == pos + 1 && sched.tokens(id)?.get(pos) == Some(&tok)).then_some((pos, tok))
        };
        let mut rounds = self.active.iter().map(|&(_, k)| k).max().unwrap_or(0);
        if rounds == 0 && carry.keys().any(|&id| kept(id).is_some()) {
            rounds = 1;
        }
        let bs = sched.config().block_size;
        // A draft may compute logits for the first tokens of the vocabulary only.
        let vocab = self.model.logits_vocab();
        let mut input: Vec<TokenId> = Vec::with_capacity(2);
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
                input.clear();
                let mut from = start + round;
                if round == 0 {
                    if let Some((pos, tok)) = kept(id) {
                        input.push(tok);
                        from = pos;
                    }
                    input.extend(tokens.last().copied());
                } else {
                    input.extend(made.last().copied());
                }
                let Some(&last) = input.last() else {
                    continue;
                };
                self.batch.push_seq(&input, from, table, bs, 1)?;
                // The draft picks LongRoPE's factors as the target does.
                if let Some(n) = sched.prompt_len(id) {
                    self.batch.set_prompt_len(n);
                }
                self.covered
                    .entry(id)
                    .or_insert_with(|| (start, Vec::with_capacity(k)))
                    .1
                    .push(last);
                self.round_ids.push(id);
            }
            if round == 0 {
                // Held-back positions of sequences that propose nothing: K/V only.
                for (&id, _) in carry.iter() {
                    if self.pending.contains_key(&id) {
                        continue;
                    }
                    let (Some((pos, tok)), Some(table)) = (kept(id), sched.block_table(id)) else {
                        continue;
                    };
                    self.batch.push_seq(&[tok], pos, table, bs, 0)?;
                    if let Some(n) = sched.prompt_len(id) {
                        self.batch.set_prompt_len(n);
                    }
                }
            }
            if self.batch.seqs.is_empty() {
                break;
            }
            self.forwards += 1;
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
