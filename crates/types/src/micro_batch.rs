//! Splitting a [`ForwardBatch`] into micro-batches of about equal token counts (pipeline
//! parallelism keeps several in flight, one per stage).
//!
//! The parts take the batch's tokens in order, `ceil(tokens / parts)` each (the last the rest).
//! A sequence may be cut between two parts: the first part computes its first tokens, the next
//! one the rest with those as cached context (each stage runs the parts in order, so their K/V
//! is in its cache by then; a long prompt's prefill pipelines this way). The logits of the
//! parts, concatenated, are the logits of the whole batch in its order, since `logits_indices`
//! increase and the parts keep the token order.

use crate::{ForwardBatch, SeqSlice};

impl ForwardBatch {
    /// Splits the batch into at most `parts` micro-batches (never more than its tokens, never
    /// an empty one) written over `out`'s batches (their buffers are reused).
    pub fn split_into(&self, parts: usize, out: &mut Vec<ForwardBatch>) {
        let total = self.num_tokens();
        let parts = parts.clamp(1, total.max(1));
        let per = total.div_ceil(parts).max(1);
        out.resize_with(parts, ForwardBatch::new);
        out.iter_mut().for_each(ForwardBatch::clear);
        let mut part = 0;
        let mut logits = self.logits_indices.iter().peekable();
        for s in &self.seqs {
            let mut done = 0;
            while done < s.query_len {
                if out[part].num_tokens() >= per && part + 1 < parts {
                    part += 1;
                }
                let b = &mut out[part];
                let room = if part + 1 < parts {
                    per - b.num_tokens()
                } else {
                    usize::MAX
                };
                let take = room.min(s.query_len - done);
                let offset = b.num_tokens();
                let first = s.query_start + done;
                let range = first..first + take;
                b.seqs.push(SeqSlice {
                    query_start: offset,
                    query_len: take,
                    context_len: s.context_len - s.query_len + done + take,
                    block_table_start: b.block_tables.len(),
                    ..*s
                });
                b.token_ids
                    .extend_from_slice(&self.token_ids[range.clone()]);
                b.positions
                    .extend_from_slice(&self.positions[range.clone()]);
                b.slot_mapping
                    .extend_from_slice(&self.slot_mapping[range.clone()]);
                b.block_tables.extend_from_slice(
                    &self.block_tables[s.block_table_start..s.block_table_start + s.num_blocks],
                );
                while let Some(&&row) = logits.peek() {
                    if !range.contains(&(row as usize)) {
                        break;
                    }
                    b.logits_indices.push(row - first as u32 + offset as u32);
                    logits.next();
                }
                done += take;
            }
        }
        out.truncate(part + 1);
    }
}

#[cfg(test)]
mod tests {
    use crate::ForwardBatch;

    fn batch(lens: &[usize]) -> ForwardBatch {
        let mut b = ForwardBatch::new();
        for (i, &n) in lens.iter().enumerate() {
            let tokens: Vec<u32> = (0..n as u32).map(|t| t + 100 * i as u32).collect();
            // Two cached tokens before each sequence's query.
            let table: Vec<u32> = (0..(n + 2).div_ceil(4) as u32)
                .map(|k| k + 10 * i as u32)
                .collect();
            b.push_seq(&tokens, 2, &table, 4, n.min(2)).unwrap();
        }
        b
    }

    #[test]
    fn parts_are_balanced_and_their_logits_concatenate_to_the_whole() {
        let b = batch(&[8, 1, 1, 6, 1, 3]);
        for parts in 1..=25 {
            let mut out = Vec::new();
            b.split_into(parts, &mut out);
            let per = 20usize.div_ceil(parts.min(20));
            assert_eq!(out.len(), 20usize.div_ceil(per), "{parts}");
            let mut tokens = Vec::new();
            let mut rows = Vec::new();
            for p in &out {
                assert!(p.num_tokens() > 0 && p.num_tokens() <= per);
                p.validate(4, 64, 1000).unwrap();
                // Row r of the part is row (tokens so far + r) of the whole.
                rows.extend(p.logits_indices.iter().map(|&r| r as usize + tokens.len()));
                tokens.extend_from_slice(&p.token_ids);
            }
            assert_eq!(tokens, b.token_ids);
            let whole: Vec<usize> = b.logits_indices.iter().map(|&r| r as usize).collect();
            assert_eq!(rows, whole, "{parts}");
        }
    }

    #[test]
    fn a_long_prompt_is_cut_into_chunks_with_prior_context() {
        let b = batch(&[10]);
        let mut out = Vec::new();
        b.split_into(3, &mut out);
        let lens: Vec<(usize, usize)> = out
            .iter()
            .map(|p| (p.seqs[0].query_len, p.seqs[0].context_len))
            .collect();
        // 2 cached tokens, then 4 + 4 + 2 computed.
        assert_eq!(lens, [(4, 6), (4, 10), (2, 12)]);
        assert_eq!(out[2].logits_indices, [0, 1]);
    }
}
