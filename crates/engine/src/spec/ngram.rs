//! Prompt lookup decoding: the n-gram proposer. The last `n` tokens of a sequence (its prompt
//! and output so far), for `n` from `max` down to `min`, are looked up in the sequence itself;
//! at the most recent earlier occurrence, the tokens that followed it are proposed. Text that
//! quotes its input (a rewrite, a summary, an edited file) repeats long runs of it, which this
//! guesses for free: no model runs.

use ferrum_types::TokenId;

/// The n-gram sizes a proposer matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramProposer {
    /// The shortest suffix that may match.
    pub min: usize,
    /// The longest suffix tried first (the lookup window).
    pub max: usize,
}

impl NgramProposer {
    /// Writes into `out` up to `k` tokens that followed the most recent earlier occurrence of
    /// the longest suffix of `tokens` (between `min` and `max` long) that occurs earlier;
    /// nothing when no suffix does.
    pub fn propose(&self, tokens: &[TokenId], k: usize, out: &mut Vec<TokenId>) {
        out.clear();
        let len = tokens.len();
        if k == 0 || self.min == 0 {
            return;
        }
        for n in (self.min..=self.max.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - n..];
            // Occurrences that end before the suffix starts and leave a token after them.
            let found = (0..len - n)
                .rev()
                .find(|&start| &tokens[start..start + n] == suffix);
            if let Some(start) = found {
                let from = start + n;
                out.extend_from_slice(&tokens[from..(from + k).min(len)]);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(p: NgramProposer, tokens: &[TokenId], k: usize) -> Vec<TokenId> {
        let mut out = vec![99];
        p.propose(tokens, k, &mut out);
        out
    }

    #[test]
    fn the_longest_suffix_matches_at_its_latest_occurrence() {
        let p = NgramProposer { min: 1, max: 3 };
        // "1 2 3" occurred at 0 (followed by 4 5) and "2 3" at 6 (followed by 9).
        let t = [1, 2, 3, 4, 5, 0, 2, 3, 9, 1, 2, 3];
        assert_eq!(
            propose(p, &t, 2),
            vec![4, 5],
            "the 3-gram wins over the later 2-gram"
        );
        let p2 = NgramProposer { min: 1, max: 2 };
        assert_eq!(propose(p2, &t, 2), vec![9, 1], "the latest 2-gram");
        // Proposals stop at the end of the sequence.
        assert_eq!(propose(p, &[7, 8, 7, 8], 5), vec![7, 8]);
    }

    #[test]
    fn no_match_no_proposal() {
        let p = NgramProposer { min: 2, max: 4 };
        assert!(propose(p, &[1, 2, 3, 4, 5], 3).is_empty());
        assert!(propose(p, &[1, 2, 1, 2], 0).is_empty(), "k = 0");
        assert!(propose(p, &[1], 3).is_empty());
        assert!(propose(p, &[], 3).is_empty());
        // The suffix itself is not an earlier occurrence.
        assert!(propose(NgramProposer { min: 1, max: 1 }, &[5], 2).is_empty());
        assert_eq!(
            propose(NgramProposer { min: 1, max: 1 }, &[5, 5], 2),
            vec![5]
        );
    }
}
