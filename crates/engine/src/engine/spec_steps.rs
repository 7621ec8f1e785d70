//! The engine's speculative-decoding steps: turning it on, and each step's proposals (n-gram
//! lookup or the draft model) for the decoding sequences.

use super::EngineCore;
use crate::spec::{DraftModel, Proposer, SpeculativeConfig};
use crate::{EngineError, Result};
use ferrum_models::Model;
use ferrum_scheduler::Scheduler;
use ferrum_types::RequestId;

impl EngineCore {
    /// Turns speculative decoding on; `Proposer::Draft` needs the draft model.
    pub(crate) fn set_speculative(
        &mut self,
        spec: SpeculativeConfig,
        draft: Option<Model>,
    ) -> Result<()> {
        self.draft = match (spec.proposer, draft) {
            (Proposer::Draft, Some(model)) => Some(DraftModel::new(
                model,
                self.model.config().vocab_size,
                self.kv.num_blocks(),
                self.st.sched.config().block_size,
            )?),
            (Proposer::Draft, None) => {
                return Err(EngineError::Config(
                    "speculative decoding with a draft model needs the draft model (--speculative-model)".into(),
                ))
            }
            (_, Some(_)) => {
                return Err(EngineError::Config(
                    "a draft model was given, but the speculative method is not draft".into(),
                ))
            }
            (_, None) => None,
        };
        self.spec = Some(spec);
        Ok(())
    }

    /// Whether sequence `id` decodes: every final token but the last computed.
    fn is_decoding(sched: &Scheduler, id: RequestId) -> bool {
        matches!(
            (sched.num_computed(id), sched.tokens(id)),
            (Some(c), Some(t)) if c + 1 == t.len()
        )
    }

    /// The decoding sequences with the most tokens each may propose (one fewer than it may
    /// still generate, at most `num_speculative_tokens`), into `self.proposing`; empty when
    /// more sequences decode than `disable_by_batch_size`.
    fn collect_proposing(&mut self, spec: &SpeculativeConfig) {
        self.proposing.clear();
        for (&id, seq) in &self.st.seqs {
            if Self::is_decoding(&self.st.sched, id) && !self.st.finished.contains(&id) {
                let k = spec
                    .num_speculative_tokens
                    .min(seq.output.remaining().saturating_sub(1));
                self.proposing.push((id, k));
            }
        }
        if self.proposing.len() > spec.disable_by_batch_size {
            self.proposing.clear();
        }
    }

    /// The draft model's proposals for the next step (end of a step).
    pub(super) fn draft_propose(&mut self) -> Result<()> {
        let Some(spec) = self.spec else {
            return Ok(());
        };
        if self.draft.is_none() {
            return Ok(());
        }
        self.collect_proposing(&spec);
        let proposing = std::mem::take(&mut self.proposing);
        let result = match self.draft.as_mut() {
            Some(d) => d.propose(&mut self.st.sched, &proposing),
            None => Ok(()),
        };
        self.proposing = proposing;
        result
    }

    /// Sets each decoding sequence's proposals for the coming step (speculative decoding),
    /// unless more sequences decode than `disable_by_batch_size`; clears the others'. A
    /// sequence proposes at most one token fewer than it may still generate.
    pub(super) fn propose(&mut self) -> Result<()> {
        let Some(spec) = self.spec else {
            return Ok(());
        };
        self.collect_proposing(&spec);
        for &(id, k) in &self.proposing {
            match (&spec.proposer, self.draft.as_mut()) {
                (Proposer::Ngram(p), _) => {
                    let tokens = self.st.sched.tokens(id).unwrap_or(&[]);
                    p.propose(tokens, k, &mut self.proposal);
                }
                (Proposer::Draft, Some(d)) => {
                    d.take(id, &mut self.proposal);
                    self.proposal.truncate(k);
                }
                (Proposer::Draft, None) => self.proposal.clear(),
            }
            // A constrained sequence proposes only what its constraint accepts.
            if let Some(g) = self.st.seqs.get_mut(&id).and_then(|q| q.guide.as_mut()) {
                let n = g.valid_prefix(&self.proposal);
                self.proposal.truncate(n);
            }
            self.st
                .sched
                .propose(id, &self.proposal)
                .map_err(|e| EngineError::Internal(e.to_string()))?;
        }
        // Everyone else proposes nothing this step.
        for &id in self.st.seqs.keys() {
            if !self.proposing.iter().any(|&(p, _)| p == id) {
                self.st
                    .sched
                    .propose(id, &[])
                    .map_err(|e| EngineError::Internal(e.to_string()))?;
            }
        }
        Ok(())
    }
}
