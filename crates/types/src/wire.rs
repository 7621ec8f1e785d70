//! A [`ForwardBatch`] as one flat `u32` message (what rank 0 of a parallel run broadcasts each
//! step), and back.
//!
//! Layout: `[num_tokens, num_seqs, num_block_table_entries, num_logits]`, then token ids,
//! positions, slot mapping, each sequence's six fields (query start, query length, context
//! length, block table start, number of blocks, prompt length), the block tables and the
//! logits indices. [`ForwardBatch::decode`] checks the lengths only; the receiver validates the
//! batch against its cache as for any batch.

use crate::{ForwardBatch, Result, SeqSlice, TypesError};

const SEQ_FIELDS: usize = 6;

fn word(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| TypesError::InvalidBatch(format!("{v} does not fit a message")))
}

impl ForwardBatch {
    /// Appends the batch to `out` in the layout of the module doc.
    pub fn encode(&self, out: &mut Vec<u32>) -> Result<()> {
        for n in [
            self.token_ids.len(),
            self.seqs.len(),
            self.block_tables.len(),
            self.logits_indices.len(),
        ] {
            out.push(word(n)?);
        }
        out.extend_from_slice(&self.token_ids);
        out.extend_from_slice(&self.positions);
        out.extend_from_slice(&self.slot_mapping);
        for s in &self.seqs {
            for v in [
                s.query_start,
                s.query_len,
                s.context_len,
                s.block_table_start,
                s.num_blocks,
                s.prompt_len,
            ] {
                out.push(word(v)?);
            }
        }
        out.extend_from_slice(&self.block_tables);
        out.extend_from_slice(&self.logits_indices);
        Ok(())
    }

    /// The batch [`ForwardBatch::encode`] wrote to `msg`, replacing `self`'s contents (its
    /// buffers are kept); an error when the lengths disagree.
    pub fn decode_into(&mut self, msg: &[u32]) -> Result<()> {
        let bad = || TypesError::InvalidBatch(format!("a batch message of {} words", msg.len()));
        let [t, s, b, l] = match msg.get(..4) {
            Some(&[t, s, b, l]) => [t, s, b, l].map(|v| v as usize),
            _ => return Err(bad()),
        };
        let need = s
            .checked_mul(SEQ_FIELDS)
            .and_then(|v| v.checked_add(4 + 3 * t.checked_mul(1)? + b + l))
            .ok_or_else(bad)?;
        if msg.len() != need {
            return Err(bad());
        }
        self.clear();
        let mut rest = &msg[4..];
        let mut take = |n: usize| {
            let (head, tail) = rest.split_at(n);
            rest = tail;
            head
        };
        self.token_ids.extend_from_slice(take(t));
        self.positions.extend_from_slice(take(t));
        self.slot_mapping.extend_from_slice(take(t));
        for f in take(s * SEQ_FIELDS).chunks_exact(SEQ_FIELDS) {
            self.seqs.push(SeqSlice {
                query_start: f[0] as usize,
                query_len: f[1] as usize,
                context_len: f[2] as usize,
                block_table_start: f[3] as usize,
                num_blocks: f[4] as usize,
                prompt_len: f[5] as usize,
            });
        }
        self.block_tables.extend_from_slice(take(b));
        self.logits_indices.extend_from_slice(take(l));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ForwardBatch;

    #[test]
    fn a_batch_survives_its_message_and_bad_messages_are_errors() {
        let mut b = ForwardBatch::new();
        b.push_seq(&[5, 6, 7], 0, &[3], 4, 1).unwrap();
        b.push_seq(&[9], 6, &[0, 1], 4, 1).unwrap();
        b.set_prompt_len(40);
        let mut msg = Vec::new();
        b.encode(&mut msg).unwrap();
        let mut back = ForwardBatch::new();
        back.decode_into(&msg).unwrap();
        assert_eq!(back, b);
        for cut in [0, 3, msg.len() - 1] {
            assert!(back.decode_into(&msg[..cut]).is_err());
        }
        msg.push(0);
        assert!(back.decode_into(&msg).is_err());
        // A header that overflows.
        assert!(back.decode_into(&[u32::MAX; 4]).is_err());
    }
}
