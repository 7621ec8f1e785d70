//! What the cost model sees of the scheduler, and the step budget it sets: the shape of a
//! planned step, the prefill work pending (by priority, for first-token predictions), and the
//! prefill cap that keeps a step's decodes within their time-per-output-token targets and the
//! step within the caller's limit.
//!
//! Invariants: the cap is never below one block, so waiting prompts always progress; under a
//! step limit the prefill keeps at least half of the limit.

use super::{Scheduler, SchedulerOutput};
use crate::{Result, SchedulerError};
use ferrum_types::RequestId;

impl Scheduler {
    /// What a planned step computes, for the cost model: prefill tokens (runs that are not a
    /// single decode), decode rows (a run of the last final token and its proposals), and the
    /// KV blocks the scheduled sequences hold (what attention reads).
    pub fn step_shape(&self, out: &SchedulerOutput) -> crate::StepShape {
        let mut shape = crate::StepShape::default();
        for s in &out.seqs {
            let decode = self.seqs.get(&s.id).is_some_and(|q| {
                s.start + s.num_tokens - s.num_proposed == q.num_final
                    && s.num_tokens - s.num_proposed == 1
            });
            if decode {
                shape.decode_rows += s.num_tokens;
            } else {
                shape.prefill_tokens += s.num_tokens;
            }
            shape.kv_blocks += self.kv.block_table(s.id).len();
        }
        shape
    }

    /// Prompt (or recompute) tokens still to be computed before sequences can decode: every
    /// waiting sequence's, and the rest of running sequences still prefilling.
    pub fn pending_prefill_tokens(&self) -> usize {
        self.seqs
            .values()
            .filter(|q| !q.held)
            .map(|q| q.num_final.saturating_sub(q.num_computed + 1))
            .sum()
    }

    /// [`Scheduler::pending_prefill_tokens`] by priority, ascending. Under a policy that goes
    /// by priority first, a new request waits behind the entries of its priority or better
    /// only (running prefills of a worse priority yield to it; of its own, they go first).
    pub fn pending_prefill_by_priority(&self) -> Vec<(i32, usize)> {
        let mut by: std::collections::BTreeMap<i32, usize> = std::collections::BTreeMap::new();
        for q in self.seqs.values().filter(|q| !q.held) {
            let n = q.num_final.saturating_sub(q.num_computed + 1);
            if n > 0 {
                *by.entry(q.priority).or_default() += n;
            }
        }
        by.into_iter().collect()
    }

    /// Running sequences that decode (every final token but the last computed).
    pub fn num_decoding(&self) -> usize {
        self.running
            .iter()
            .filter(|id| {
                self.seqs
                    .get(id)
                    .is_some_and(|q| q.num_computed + 1 >= q.num_final)
            })
            .count()
    }

    /// Sets sequence `id`'s time-per-output-token target: while it decodes, steps with a cost
    /// model keep their prefill short enough to be predicted within it
    /// ([`Scheduler::schedule_with`]). `seconds` must be positive and finite.
    pub fn set_tpot(&mut self, id: RequestId, seconds: f64) -> Result<()> {
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(SchedulerError::Config(format!(
                "a time-per-output-token target of {seconds} s: expected a positive time"
            )));
        }
        let seq = self.seqs.get_mut(&id).ok_or(SchedulerError::Unknown(id))?;
        seq.tpot = Some(seconds);
        Ok(())
    }

    /// Sets the longest a step may be planned, in seconds (`None`: no limit). With a cost model,
    /// a step's prefill is then capped as for a TPOT target of that length
    /// ([`Scheduler::schedule_with`]): the `slo` engine sets a share of the tightest
    /// first-token target in play, so a prompt arriving while a step runs waits for at most
    /// that. `seconds` must be positive and finite.
    pub fn set_step_limit(&mut self, seconds: Option<f64>) -> Result<()> {
        if let Some(s) = seconds.filter(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(SchedulerError::Config(format!(
                "a step limit of {s} s: expected a positive time"
            )));
        }
        self.step_limit = seconds;
        Ok(())
    }

    /// The step limit in force ([`Scheduler::set_step_limit`]).
    pub fn step_limit(&self) -> Option<f64> {
        self.step_limit
    }

    /// The prefill tokens a step whose decodes are `out` may add and still be within the
    /// decodes' tightest TPOT target and the step limit, by `cost`'s cautious prediction
    /// ([`CostModel::upper`]: planned at the plain one, the step would miss the target half
    /// the time): `None` when neither applies. At least one block, so prefills progress even
    /// when the decodes alone take longer than the target; under the step limit, at least what
    /// fits in half of it (when the decodes alone take about as long as the limit, cutting the
    /// prefill further would slow the prompts, a deadline's own included, more than it
    /// shortens the step: such a step may run to one and a half times the limit). The
    /// prefill's own reads of the KV cache are left out of the prediction (its blocks are
    /// counted once it runs).
    ///
    /// [`CostModel::upper`]: crate::CostModel::upper
    pub(super) fn prefill_cap(
        &self,
        out: &SchedulerOutput,
        cost: &crate::CostModel,
    ) -> Option<usize> {
        let per_token = cost.margin() * cost.coefficients()[1];
        if per_token <= 0.0 {
            return None;
        }
        let floor = self.cfg.block_size;
        // Prefill tokens that take `secs` (possibly none).
        let tokens_in = |secs: f64| {
            let n = (secs / per_token).floor();
            if n >= self.cfg.max_num_batched_tokens as f64 {
                self.cfg.max_num_batched_tokens
            } else if n > 0.0 {
                n as usize
            } else {
                0
            }
        };
        let decodes = cost.upper(self.step_shape(out));
        let tpot = out
            .seqs
            .iter()
            .filter_map(|s| self.seqs.get(&s.id)?.tpot)
            .reduce(f64::min)
            .map(|t| tokens_in(t - decodes).max(floor));
        let limit =
            (self.step_limit).map(|l| tokens_in(l - decodes).max(tokens_in(l / 2.0)).max(floor));
        match (tpot, limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The prefill cap a step without decodes would get ([`Scheduler::set_step_limit`]'s):
    /// what a request arriving at an idle engine is prefilled by.
    pub fn idle_prefill_cap(&self, cost: &crate::CostModel) -> Option<usize> {
        self.prefill_cap(&SchedulerOutput::default(), cost)
    }
}
