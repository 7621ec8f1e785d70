//! Engine metrics, kept by the engine thread and read by anyone holding the handle:
//! latency histograms (TTFT, inter-token, end to end), queue and KV gauges, prefix-cache and
//! preemption counters, token counters, speculative decoding's and structured output's
//! counters. The server exports
//! them as Prometheus text.

/// A cumulative histogram over fixed bucket bounds (seconds), Prometheus style.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Upper bounds, ascending; an implicit +Inf bucket follows.
    pub bounds: &'static [f64],
    /// `counts[i]`: observations <= `bounds[i]` (not cumulative; the last is +Inf).
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

/// Bucket bounds for latencies, in seconds (vLLM's TTFT buckets).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }
}

/// Speculative decoding's counters (vLLM's `spec_decode_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecCounters {
    /// Runs that verified at least one proposal.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// `accepted_per_pos[i]`: runs whose proposal `i` (0-based) was accepted.
    pub accepted_per_pos: Vec<u64>,
    /// Forward passes of the draft model (proposal steps, and the target's batches it follows).
    pub draft_forwards: u64,
}

impl SpecCounters {
    /// Counts one run that verified `proposed` tokens and accepted the first `accepted`.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.num_drafts += 1;
        self.num_draft_tokens += proposed as u64;
        self.num_accepted_tokens += accepted as u64;
        if self.accepted_per_pos.len() < accepted {
            self.accepted_per_pos.resize(accepted, 0);
        }
        for c in &mut self.accepted_per_pos[..accepted] {
            *c += 1;
        }
    }

    /// Adds these counts to `into` and zeroes them.
    pub fn drain_into(&mut self, into: &mut SpecCounters) {
        into.num_drafts += self.num_drafts;
        into.num_draft_tokens += self.num_draft_tokens;
        into.num_accepted_tokens += self.num_accepted_tokens;
        into.draft_forwards += self.draft_forwards;
        if into.accepted_per_pos.len() < self.accepted_per_pos.len() {
            into.accepted_per_pos.resize(self.accepted_per_pos.len(), 0);
        }
        for (a, b) in into.accepted_per_pos.iter_mut().zip(&self.accepted_per_pos) {
            *a += b;
        }
        self.num_drafts = 0;
        self.num_draft_tokens = 0;
        self.num_accepted_tokens = 0;
        self.draft_forwards = 0;
        self.accepted_per_pos.iter_mut().for_each(|c| *c = 0);
    }

    /// Tokens a verifying run produced on average: its accepted proposals and the target's
    /// own token (1.0 without speculation).
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.num_drafts == 0 {
            1.0
        } else {
            1.0 + self.num_accepted_tokens as f64 / self.num_drafts as f64
        }
    }
}

/// Everything the engine measures.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_latency: Histogram,
    pub num_running: usize,
    pub num_waiting: usize,
    pub kv_blocks_total: usize,
    pub kv_blocks_free: usize,
    pub kv_blocks_cached: usize,
    /// Part of the KV cache is still to be made resident (a server's engine does it while
    /// idle): resident memory is still growing towards its full size.
    pub kv_cache_populating: bool,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub requests_finished: u64,
    pub spec: SpecCounters,
    /// Structured output: token masks computed, the seconds spent computing them (on the
    /// mask thread, during forward passes, and on the engine thread for the rows of accepted
    /// proposals), and the seconds the engine waited for the mask thread after a forward pass
    /// (what constrained decoding added to steps).
    pub structured_masks: u64,
    pub structured_mask_seconds: f64,
    pub structured_mask_wait_seconds: f64,
    /// Steps left in flight on a GPU while the next was scheduled and enqueued (overlapped
    /// steps), and steps run in all.
    pub steps_overlapped: u64,
    pub steps: u64,
    /// Seconds the engine spent in steps, and of them blocked waiting for an overlapped
    /// step's results from the device (the host's idle share: what remains is the host's
    /// own work, hidden behind the device's while it stays below the device's step time).
    pub step_seconds: f64,
    pub device_wait_seconds: f64,
    /// False once the engine loop has stopped (after an error or a shutdown).
    pub healthy: bool,
    /// The device the model runs on, in words (`cpu`, `NVIDIA H200 (sm_90)`).
    pub device: String,
    /// The disk tier below the pool (`--kv-disk-dir`), and the folder of this cache's blocks.
    pub kv_disk: crate::tier::TierCounters,
    pub kv_disk_dir: Option<std::path::PathBuf>,
    /// Tokens computed for each named tenant (the first `tenants::COUNTED_TENANTS`,
    /// weighted ones first), by name.
    pub tenant_computed_tokens: Vec<(String, u64)>,
    /// Seconds the cost model's calibration at start took (`None`: it did not run).
    pub calibration_seconds: Option<f64>,
    /// The host tier below a GPU's pool (`--kv-offload-memory`).
    pub kv_host: crate::tier::TierCounters,
    /// The step cost model ([`ferrum_scheduler::CostModel`]): seconds per step, per prefill
    /// token, per decode row, per KV block read; and whether it has seen enough steps.
    pub cost: [f64; 4],
    pub cost_ready: bool,
    /// The factor on a prediction a step planned within a TPOT target is held to
    /// ([`ferrum_scheduler::CostModel::margin`]: 1 plus the predictions' mean relative
    /// error plus its deviation).
    pub cost_margin: f64,
    /// Admission's record of itself (`slo::FirstTokenRecord`): the median ratio of
    /// observed to predicted first tokens of recent admitted requests with a target, and how
    /// many it has observed.
    pub ttft_ratio: f64,
    pub ttft_observed: u64,
    /// What a new request's first token waits behind: prefill tokens still to compute,
    /// decoding sequences, the KV blocks they read, and the step's token budget.
    pub pending_prefill_tokens: usize,
    pub decoding: usize,
    pub kv_blocks_read: usize,
    pub max_num_batched_tokens: usize,
    /// The prefill tokens a step may take: the last step's cap (its decodes' TPOT targets, the
    /// step limit) while decodes run, else what the step limit alone allows; `None` when
    /// neither applies.
    pub prefill_cap: Option<usize>,
    /// The longest a step may be planned, in seconds, under `slo` scheduling while a
    /// first-token target is in play.
    pub step_limit: Option<f64>,
    /// `pending_prefill_tokens` by priority, ascending (running sequences first, under
    /// `i32::MIN`), and whether the policy admits strictly by priority: a new request then
    /// waits only behind work of its own priority or better.
    pub pending_prefill_by_priority: Vec<(i32, usize)>,
    pub priority_first: bool,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            time_to_first_token: Histogram::new(LATENCY_BUCKETS),
            inter_token_latency: Histogram::new(LATENCY_BUCKETS),
            e2e_latency: Histogram::new(LATENCY_BUCKETS),
            num_running: 0,
            num_waiting: 0,
            kv_blocks_total: 0,
            kv_blocks_free: 0,
            kv_blocks_cached: 0,
            kv_cache_populating: false,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            preemptions: 0,
            structured_masks: 0,
            structured_mask_seconds: 0.0,
            structured_mask_wait_seconds: 0.0,
            steps_overlapped: 0,
            steps: 0,
            step_seconds: 0.0,
            device_wait_seconds: 0.0,
            prompt_tokens: 0,
            generation_tokens: 0,
            requests_finished: 0,
            spec: SpecCounters::default(),
            healthy: true,
            device: "cpu".to_string(),
            kv_disk: crate::tier::TierCounters::default(),
            kv_disk_dir: None,
            kv_host: crate::tier::TierCounters::default(),
            calibration_seconds: None,
            tenant_computed_tokens: Vec::new(),
            cost: [0.0; 4],
            cost_ready: false,
            cost_margin: 1.0,
            ttft_ratio: 1.0,
            ttft_observed: 0,
            pending_prefill_tokens: 0,
            decoding: 0,
            kv_blocks_read: 0,
            max_num_batched_tokens: 0,
            prefill_cap: None,
            step_limit: None,
            pending_prefill_by_priority: Vec::new(),
            priority_first: false,
        }
    }
}
