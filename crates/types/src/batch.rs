//! The forward batch: every token a model step computes, for several sequences at once.
//!
//! Tokens of all sequences are flattened into one list. Sequence `s` owns tokens
//! `query_start..query_start + query_len`: a prefill chunk (possibly continuing context already in
//! the cache) or a single decode token. Its first `context_len - query_len` tokens are already in
//! the KV cache; after the step it has `context_len`. Token `j` of a sequence (position `j`) lives
//! in cache block `block_table[j / block_size]` at offset `j % block_size`, i.e. at slot
//! `block * block_size + offset`.
//!
//! Invariants (checked by [`ForwardBatch::validate`]): sequence slices tile the token list in
//! order; positions and slots agree with each sequence's block table; block ids are inside the
//! cache; `logits_indices` name distinct tokens in increasing order. Buffers are reused across
//! steps: [`ForwardBatch::clear`] keeps capacity.

use crate::{BlockId, Result, TokenId, TypesError};

/// One sequence's part of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSlice {
    /// Index of the sequence's first token in the batch.
    pub query_start: usize,
    /// Number of tokens computed for this sequence in this step (at least one).
    pub query_len: usize,
    /// Tokens of the sequence in the cache after this step (cached context + `query_len`).
    pub context_len: usize,
    /// Start of this sequence's block table in [`ForwardBatch::block_tables`].
    pub block_table_start: usize,
    /// Length of this sequence's block table.
    pub num_blocks: usize,
    /// Length of the sequence's prompt (as it arrived). Scaling that transformers picks per
    /// forward pass from the largest position (Phi-3's LongRoPE: long factors past the
    /// original context) is picked per token from `max(prompt_len, position + 1)`, so chunking
    /// and batch mates do not change it. [`ForwardBatch::push_seq`] sets it to `context_len`
    /// (a single forward's view); [`ForwardBatch::set_prompt_len`] gives the real one.
    pub prompt_len: usize,
}

/// All inputs of one model step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    /// `[num_tokens]` token ids.
    pub token_ids: Vec<TokenId>,
    /// `[num_tokens]` position of each token in its sequence.
    pub positions: Vec<u32>,
    /// `[num_tokens]` cache slot each token's K/V is written to.
    pub slot_mapping: Vec<u32>,
    /// The sequences, in token order.
    pub seqs: Vec<SeqSlice>,
    /// Block tables of all sequences, concatenated.
    pub block_tables: Vec<BlockId>,
    /// Tokens whose logits are computed, in the order the logits are returned.
    pub logits_indices: Vec<u32>,
}

impl ForwardBatch {
    /// An empty batch.
    pub fn new() -> ForwardBatch {
        ForwardBatch::default()
    }

    /// Empties the batch, keeping its buffers.
    pub fn clear(&mut self) {
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.seqs.clear();
        self.block_tables.clear();
        self.logits_indices.clear();
    }

    /// Tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Appends a sequence whose first `num_cached` tokens are already in the cache and whose next
    /// `tokens` are computed now. `block_table` must cover all `num_cached + tokens.len()`
    /// positions. The logits of its last `num_logits` tokens are returned (at most all of them).
    pub fn push_seq(
        &mut self,
        tokens: &[TokenId],
        num_cached: usize,
        block_table: &[BlockId],
        block_size: usize,
        num_logits: usize,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(TypesError::InvalidBatch("a sequence with no tokens".into()));
        }
        if block_size == 0 {
            return Err(TypesError::InvalidBatch("block size 0".into()));
        }
        let context_len = num_cached + tokens.len();
        if block_table.len() * block_size < context_len {
            return Err(TypesError::InvalidBatch(format!(
                "{} blocks of {block_size} cannot hold {context_len} tokens",
                block_table.len()
            )));
        }
        let query_start = self.token_ids.len();
        self.seqs.push(SeqSlice {
            query_start,
            query_len: tokens.len(),
            context_len,
            block_table_start: self.block_tables.len(),
            num_blocks: block_table.len(),
            prompt_len: context_len,
        });
        self.block_tables.extend_from_slice(block_table);
        self.token_ids.extend_from_slice(tokens);
        for pos in num_cached..context_len {
            let slot = block_table[pos / block_size] as usize * block_size + pos % block_size;
            self.positions.push(to_u32(pos)?);
            self.slot_mapping.push(to_u32(slot)?);
        }
        if num_logits > tokens.len() {
            return Err(TypesError::InvalidBatch(format!(
                "logits of {num_logits} rows asked of a sequence of {} tokens",
                tokens.len()
            )));
        }
        let end = query_start + tokens.len();
        for row in end - num_logits..end {
            self.logits_indices.push(to_u32(row)?);
        }
        Ok(())
    }

    /// Sets the prompt length of the sequence pushed last ([`SeqSlice::prompt_len`]).
    pub fn set_prompt_len(&mut self, prompt_len: usize) {
        if let Some(s) = self.seqs.last_mut() {
            s.prompt_len = prompt_len;
        }
    }

    /// Checks every invariant of the module doc against a cache of `num_blocks` blocks of
    /// `block_size` slots and a vocabulary of `vocab_size` tokens.
    pub fn validate(&self, block_size: usize, num_blocks: usize, vocab_size: usize) -> Result<()> {
        let bad = |m: String| Err(TypesError::InvalidBatch(m));
        let n = self.token_ids.len();
        if self.positions.len() != n || self.slot_mapping.len() != n {
            return bad(format!(
                "{n} tokens but {} positions and {} slots",
                self.positions.len(),
                self.slot_mapping.len()
            ));
        }
        if let Some(&t) = self.token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return bad(format!(
                "token id {t} is outside the vocabulary of {vocab_size}"
            ));
        }
        let mut next_token = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            if s.query_start != next_token || s.query_len == 0 || s.query_len > s.context_len {
                return bad(format!("sequence {i} does not continue the token list"));
            }
            next_token += s.query_len;
            let Some(table) = self
                .block_tables
                .get(s.block_table_start..s.block_table_start.saturating_add(s.num_blocks))
            else {
                return bad(format!("sequence {i} block table is out of range"));
            };
            if table.len() * block_size < s.context_len {
                return bad(format!("sequence {i} block table is too short"));
            }
            if let Some(&b) = table.iter().find(|&&b| b as usize >= num_blocks) {
                return bad(format!(
                    "sequence {i} uses block {b} of a cache of {num_blocks}"
                ));
            }
            let first_pos = s.context_len - s.query_len;
            for k in 0..s.query_len.min(n.saturating_sub(s.query_start)) {
                let t = s.query_start + k;
                let pos = first_pos + k;
                let slot = table[pos / block_size] as usize * block_size + pos % block_size;
                if self.positions[t] as usize != pos || self.slot_mapping[t] as usize != slot {
                    return bad(format!(
                        "token {t} has a position or slot its sequence disagrees with"
                    ));
                }
            }
        }
        if next_token != n {
            return bad(format!("sequences cover {next_token} of {n} tokens"));
        }
        let mut prev: Option<u32> = None;
        for &li in &self.logits_indices {
            if li as usize >= n || prev.is_some_and(|p| p >= li) {
                return bad(format!("logits index {li} is out of order or range"));
            }
            prev = Some(li);
        }
        Ok(())
    }
}

fn to_u32(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| TypesError::InvalidBatch(format!("{v} does not fit in 32 bits")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_builds_positions_and_slots() {
        let mut b = ForwardBatch::new();
        b.push_seq(&[5, 6, 7], 2, &[3, 1], 4, 1).unwrap();
        b.push_seq(&[9], 0, &[0], 4, 1).unwrap();
        assert_eq!(b.positions, vec![2, 3, 4, 0]);
        assert_eq!(b.slot_mapping, vec![14, 15, 4, 0]);
        assert_eq!(b.logits_indices, vec![2, 3]);
        let mut several = ForwardBatch::new();
        several.push_seq(&[5, 6, 7], 0, &[0], 4, 2).unwrap();
        several.push_seq(&[8], 0, &[1], 4, 0).unwrap();
        assert_eq!(several.logits_indices, vec![1, 2]);
        assert!(several.push_seq(&[5], 0, &[2], 4, 2).is_err());
        b.validate(4, 4, 10).unwrap();
        assert!(
            b.validate(4, 3, 10).is_err(),
            "block 3 outside a cache of 3"
        );
        assert!(
            b.validate(4, 4, 9).is_err(),
            "token 9 outside the vocabulary"
        );
        let mut c = b.clone();
        c.slot_mapping[1] = 0;
        assert!(c.validate(4, 4, 10).is_err());
        b.clear();
        assert_eq!(b.num_tokens(), 0);
        assert!(b.push_seq(&[1; 9], 0, &[0, 1], 4, 0).is_err());
    }
}
