//! Speculative decoding: guessed tokens verified in the ordinary batch.
//!
//! Before a step, a [`Proposer`] guesses up to `num_speculative_tokens` tokens for each
//! decoding sequence; the scheduler runs them as extra query tokens after the sequence's last
//! token ([`ferrum_scheduler::Scheduler::propose`]), and the step returns logits for each.
//! The sampler verifies them in order ([`crate::Sampler::verify`]): at each row it draws the
//! token exactly as it would without speculation (the argmax for greedy requests; a draw from
//! the whole sampling chain with the request's own seeded generator otherwise) and accepts the
//! proposal when the draw is it, which for a fixed-token proposal is rejection sampling. The
//! first rejection ends the run with the drawn token, and an all-accepted run adds the token
//! after the last proposal. So every request, greedy or seeded, gives the same tokens with
//! speculation as without, token for token. Rejected positions are rolled back by the scheduler; only accepted
//! tokens enter the prefix cache.
//!
//! A step with more decoding sequences than `disable_by_batch_size` proposes nothing: there the
//! batch already fills the step's compute, and extra query rows would cost more than they save.
//!
//! Proposers: the n-gram lookup over the sequence itself ([`NgramProposer`]), and a draft model
//! ([`crate::EngineHandle::start_with_draft`]): a smaller model with the target's vocabulary,
//! on the target's compute pool, with its own KV cache over the same block ids. The draft runs
//! every step's batch after the target (so its cache follows chunked prefill, preemption,
//! rollbacks and prefix reuse exactly as the target's does), then, for each sequence that goes
//! on decoding, `k` greedy steps from the sequence's new last token into look-ahead slots the
//! scheduler holds for it; those are the next step's proposals. Heads inside the target
//! (EAGLE, MTP) would be a third variant, proposing from the target's hidden states.

mod draft;
mod ngram;

pub use draft::DraftModel;
pub use ngram::NgramProposer;

use crate::{EngineError, Result};

/// Where proposals come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proposer {
    /// Prompt lookup decoding: `--speculative-method ngram`.
    Ngram(NgramProposer),
    /// A draft model, given to [`crate::EngineHandle::start_with_draft`]:
    /// `--speculative-model M`.
    Draft,
}

/// Settings of speculative decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeConfig {
    pub proposer: Proposer,
    /// Tokens proposed per sequence and step at most.
    pub num_speculative_tokens: usize,
    /// Steps with more decoding sequences than this propose nothing.
    pub disable_by_batch_size: usize,
}

impl SpeculativeConfig {
    /// The most tokens one step proposes for a sequence.
    pub const MAX_SPECULATIVE_TOKENS: usize = 16;

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::Config(m));
        if !(1..=Self::MAX_SPECULATIVE_TOKENS).contains(&self.num_speculative_tokens) {
            return bad(format!(
                "--num-speculative-tokens {} is outside 1..={}",
                self.num_speculative_tokens,
                Self::MAX_SPECULATIVE_TOKENS
            ));
        }
        match self.proposer {
            Proposer::Ngram(p) if p.min == 0 || p.max < p.min => bad(format!(
                "--prompt-lookup-min {} and --prompt-lookup-max {} must satisfy 1 <= min <= max",
                p.min, p.max
            )),
            Proposer::Ngram(_) | Proposer::Draft => Ok(()),
        }
    }
}
