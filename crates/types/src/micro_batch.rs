//! Splitting a [`ForwardBatch`] into micro-batches of whole sequences (pipeline parallelism
//! keeps several in flight, one per stage).
//!
//! The parts are contiguous runs of sequences with about equal token counts, in order: the
//! logits of the parts, concatenated, are the logits of the whole batch in its order (a
//! sequence's rows never straddle two parts, and `logits_indices` increase).

use crate::ForwardBatch;

impl ForwardBatch {
    /// Splits the batch into at most `parts` micro-batches (never more than its sequences,
    /// never an empty one) written over `out`'s batches (their buffers are reused).
    pub fn split_into(&self, parts: usize, out: &mut Vec<ForwardBatch>) {
        let parts = parts.clamp(1, self.seqs.len().max(1));
        let total = self.num_tokens();
        out.resize_with(parts, ForwardBatch::new);
        out.iter_mut().for_each(ForwardBatch::clear);
        let mut part = 0;
        let mut logits = self.logits_indices.iter().peekable();
        for (i, s) in self.seqs.iter().enumerate() {
            // Move on once this part holds its share, keeping a sequence for each later part.
            let left = self.seqs.len() - i;
            if part + 1 < parts
                && (out[part].num_tokens() * parts >= total || left < parts - part)
                && !out[part].seqs.is_empty()
            {
                part += 1;
            }
            let b = &mut out[part];
            let offset = b.num_tokens();
            let range = s.query_start..s.query_start + s.query_len;
            b.seqs.push(crate::SeqSlice {
                query_start: offset,
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
                b.logits_indices
                    .push(row - s.query_start as u32 + offset as u32);
                logits.next();
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
            let table: Vec<u32> = (0..n.div_ceil(4) as u32)
                .map(|k| k + 10 * i as u32)
                .collect();
            b.push_seq(&tokens, 0, &table, 4, 1).unwrap();
        }
        b
    }

    #[test]
    fn parts_are_balanced_runs_whose_logits_concatenate_to_the_whole() {
        let b = batch(&[8, 1, 1, 6, 1, 3]);
        for parts in 1..=8 {
            let mut out = Vec::new();
            b.split_into(parts, &mut out);
            assert_eq!(out.len(), parts.min(6), "{parts}");
            assert!(out.iter().all(|p| !p.seqs.is_empty()));
            let mut tokens = Vec::new();
            let mut rows = Vec::new();
            let mut seqs = 0;
            for p in &out {
                p.validate(4, 64, 1000).unwrap();
                // Row r of the part is row (tokens so far + r) of the whole.
                rows.extend(p.logits_indices.iter().map(|&r| r as usize + tokens.len()));
                tokens.extend_from_slice(&p.token_ids);
                seqs += p.seqs.len();
            }
            assert_eq!(tokens, b.token_ids);
            assert_eq!(seqs, 6);
            let whole: Vec<usize> = b.logits_indices.iter().map(|&r| r as usize).collect();
            assert_eq!(rows, whole);
        }
        let mut two = Vec::new();
        b.split_into(2, &mut two);
        // 20 tokens: the first part stops once it has 10 or more.
        assert_eq!(two[0].num_tokens(), 10);
    }
}
