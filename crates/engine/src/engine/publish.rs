//! The snapshot the engine publishes after each step: what `/metrics` shows, and what
//! admission ([`crate::slo::admit`]) reads on the caller's thread to predict a new request's
//! first token (the work queued ahead, the running decodes, the step cost model, the prefill cap
//! a TPOT target or the step limit set), with admission's record of its own predictions.
//!
//! Invariant: one lock per step; a reader sees one step's values together.

use super::EngineCore;

impl EngineCore {
    /// Publishes the scheduler's and the cost model's state of this step.
    pub(super) fn publish_metrics(&mut self) {
        let st = self.st.sched.stats();
        if let Ok(mut m) = self.metrics.lock() {
            m.step_seconds += std::mem::take(&mut self.step_seconds);
            m.num_running = st.num_running;
            m.num_waiting = st.num_waiting;
            m.kv_blocks_total = st.blocks_total;
            m.kv_blocks_free = st.blocks_free;
            m.kv_blocks_cached = st.blocks_cached;
            m.prefix_cache_queries = st.prefix_queries;
            m.prefix_cache_hits = st.prefix_hits;
            m.preemptions = st.preemptions;
            m.cost = self.cost.coefficients();
            m.cost_ready = self.cost.is_ready();
            m.cost_margin = self.cost.margin();
            m.ttft_ratio = self.first_tokens.ratio();
            m.ttft_observed = self.first_tokens.total();
            m.pending_prefill_tokens = self.st.sched.pending_prefill_tokens();
            m.pending_prefill_by_priority = self.st.sched.pending_prefill_by_priority();
            m.priority_first = self.st.sched.config().policy.priority_first();
            m.decoding = self.st.sched.num_decoding();
            m.kv_blocks_read = st.blocks_total - st.blocks_free;
            // Under a TPOT cap or a step limit a step takes fewer prefill tokens: first-token
            // predictions see the last step's cap while decodes run, and what the step limit
            // alone allows when none does (an idle engine's next step has no decodes).
            let budget = self.st.sched.config().max_num_batched_tokens;
            m.step_limit = self.st.sched.step_limit();
            let cap = if m.decoding > 0 {
                self.prefill_cap
            } else if self.cost.is_ready() {
                self.st.sched.idle_prefill_cap(&self.cost)
            } else {
                None
            };
            m.max_num_batched_tokens = match cap {
                Some(cap) => budget.min(m.decoding + cap),
                None => budget,
            };
            m.prefill_cap = cap;
            m.tenant_computed_tokens.clear();
            m.tenant_computed_tokens
                .extend_from_slice(self.tenants.computed());
        }
    }
}
