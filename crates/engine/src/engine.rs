//! The engine loop, on its own thread: take commands, schedule, build the batch into reused
//! buffers, forward, sample, process outputs, emit events, repeat.
//!
//! Invariants:
//! - every sequence in the scheduler has a [`SeqState`] and belongs to a live request;
//! - a request's stream gets `Finished` for each of its samples and then exactly one `Done`
//!   (or one `Error`), after which the request and its sequences are gone and their blocks
//!   are free;
//! - `n > 1`: sample 0 is scheduled first; the other samples join once its prompt is
//!   computed, so they reuse its full prompt blocks from the prefix cache;
//! - a constrained sequence's guide has consumed exactly its output tokens; the masks a step
//!   needs are computed on a helper thread while the forward pass runs, and a token is
//!   sampled only under the mask of the guide's current state;
//! - on a GPU, at most one step is in flight beyond the one being built ([`crate::overlap`]):
//!   its sequences carry a placeholder token in the scheduler until its results are
//!   processed, which happens once the next step is enqueued and before that step's results
//!   are recorded; every step's results are processed exactly once, in order.

use crate::guide::Guide;
use crate::metrics::{Metrics, SpecCounters};
use crate::output::OutputProcessor;
use crate::overlap::{pending_inputs, InFlight, RowOf, PLACEHOLDER};
use crate::request::{Event, GenerateRequest, Usage};
use crate::requests::{
    compute_masks, Latency, MaskCounters, Processed, ReqState, Requests, Rows, SeqState,
};
use crate::sampler::Sampler;
use crate::spec::{DraftModel, SpeculativeConfig};
use crate::tenants::Tenants;
use crate::tier::KvTiers;
use crate::{EngineError, Result};
use ferrum_models::{ForwardBatch, KvCache, Model, StepRows};
use ferrum_scheduler::{CostModel, Scheduler, SchedulerOutput, StepShape};
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{RequestId, TokenId};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

mod calibrate;
mod lifecycle;
mod publish;
mod spec_steps;
mod tiers;

/// Messages from handles to the engine thread.
#[derive(Debug)]
pub(crate) enum Command {
    Add(Box<NewRequest>),
    Abort(RequestId),
    Shutdown,
}

/// A request as it reaches the engine thread.
#[derive(Debug)]
pub(crate) struct NewRequest {
    pub id: RequestId,
    pub request: GenerateRequest,
    pub seed: u64,
    pub tx: UnboundedSender<Event>,
    pub arrived: Instant,
    /// The compiled constraint of a constrained request, in its initial state.
    pub guide: Option<Box<Guide>>,
    /// Admission's first-token prediction and the target, in seconds, for its record.
    pub predicted_ttft: Option<(f64, f64)>,
}

pub(crate) struct EngineCore {
    model: Model,
    kv: KvCache,
    st: Requests,
    eos: Vec<TokenId>,
    max_model_len: usize,
    metrics: Arc<Mutex<Metrics>>,
    /// Requests accepted and not yet done (shared with handles for the queue limit).
    in_flight: Arc<AtomicUsize>,
    batch: ForwardBatch,
    /// The batch of the step in flight, while the next one is built in `batch`.
    prev_batch: ForwardBatch,
    next_seq: RequestId,
    shutting_down: bool,
    /// Steps run so far.
    steps: u64,
    /// Speculative decoding, when on.
    spec: Option<SpeculativeConfig>,
    /// Whether steps may overlap on a GPU ([`crate::EngineConfig::overlap_steps`]).
    overlap: bool,
    /// The step whose results are still on their way from the device (overlapped steps).
    pending: Option<InFlight>,
    /// Reused: the last step's rows map, and this step's pending inputs.
    spare_rows: HashMap<RequestId, RowOf>,
    inputs: Vec<(u32, u32)>,
    /// Seconds in steps, and of them waiting for an overlapped step's results, not yet
    /// added to the metrics.
    step_seconds: f64,
    wait_seconds: f64,
    /// Scratch for one sequence's proposals.
    proposal: Vec<TokenId>,
    /// The draft model, with `Proposer::Draft`.
    draft: Option<DraftModel>,
    /// Scratch: decoding sequences and how many tokens each may propose.
    proposing: Vec<(RequestId, usize)>,
    /// Where the KV cache's next slice to make resident starts, while idle
    /// ([`KvCache::populate`]); `None`: nothing (more) to do.
    populate_at: Option<usize>,
    /// Tiers below the pool (`--kv-disk-dir`), when on.
    tiers: Option<KvTiers>,
    /// Requests waiting for their blocks to be read from a tier, and since when.
    parked: HashMap<RequestId, (NewRequest, Instant)>,
    /// Tenants' names as the scheduler's numbers.
    tenants: Tenants,
    /// The step cost, learned from the steps' timings, and the shape of the step being run.
    cost: CostModel,
    /// The last step's prefill cap for TPOT targets, if one applied.
    prefill_cap: Option<usize>,
    /// The clock deadlines are counted on (`slo` scheduling).
    epoch: Instant,
    /// Admission's first-token predictions against the first tokens observed.
    first_tokens: crate::slo::FirstTokenRecord,
    /// The first-token targets in play and the step limit they set (`slo` scheduling only).
    step_limit: Option<crate::step_limit::StepLimit>,
    shape: StepShape,
    #[cfg(feature = "fault-injection")]
    pub(crate) faults: crate::config::FaultInjection,
}

/// Checks that a step's returned rows are as many as it sampled (`vocab` logits each).
fn check_rows(out: &SchedulerOutput, rows: Rows<'_>, vocab: usize) -> Result<()> {
    let want: usize = out.seqs.iter().map(|s| s.num_logits()).sum();
    let got = match rows {
        Rows::Logits(l) => l.len() / vocab.max(1),
        Rows::Tokens(t) => t.len(),
        Rows::Sampled(r) => r.len(),
    };
    if got != want {
        return Err(EngineError::Internal(format!(
            "the model returned {got} rows for a step that samples {want}"
        )));
    }
    Ok(())
}

/// Marks the engine unhealthy when dropped: at the end of the loop, or while a panic unwinds.
struct HealthGuard(Arc<Mutex<Metrics>>);

impl Drop for HealthGuard {
    fn drop(&mut self) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.healthy = false;
    }
}

/// The text of a panic's payload.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown cause".into());
    format!("panicked: {what}")
}

impl EngineCore {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        model: Model,
        kv: KvCache,
        sched: Scheduler,
        tokenizer: Option<Arc<Tokenizer>>,
        eos: Vec<TokenId>,
        max_model_len: usize,
        metrics: Arc<Mutex<Metrics>>,
        in_flight: Arc<AtomicUsize>,
    ) -> EngineCore {
        let slo = sched.config().policy == ferrum_scheduler::SchedulingPolicy::Slo;
        EngineCore {
            model,
            kv,
            st: Requests {
                sched,
                tokenizer,
                reqs: HashMap::new(),
                seqs: HashMap::new(),
                sampled: Vec::new(),
                finished: Vec::new(),
                latencies: Vec::new(),
                failed: Vec::new(),
                spec_step: SpecCounters::default(),
                mask_step: MaskCounters::default(),
            },
            eos,
            max_model_len,
            metrics,
            in_flight,
            batch: ForwardBatch::new(),
            prev_batch: ForwardBatch::new(),
            next_seq: 0,
            shutting_down: false,
            steps: 0,
            spec: None,
            overlap: true,
            pending: None,
            spare_rows: HashMap::new(),
            inputs: Vec::new(),
            step_seconds: 0.0,
            wait_seconds: 0.0,
            proposal: Vec::new(),
            draft: None,
            proposing: Vec::new(),
            populate_at: None,
            tiers: None,
            parked: HashMap::new(),
            tenants: Tenants::default(),
            cost: CostModel::new(crate::config::DEFAULT_COST_SEED),
            prefill_cap: None,
            epoch: Instant::now(),
            first_tokens: crate::slo::FirstTokenRecord::default(),
            step_limit: slo.then(Default::default),
            shape: StepShape::default(),
            #[cfg(feature = "fault-injection")]
            faults: Default::default(),
        }
    }

    /// Runs until shut down (after in-flight requests finish), all handles are gone, or a
    /// step fails (then every request gets the error and the engine reports unhealthy).
    pub(crate) fn run(mut self, rx: Receiver<Command>) {
        // Whatever way this function ends (a panic outside a step included), the engine
        // reports unhealthy, so `generate` and `/health` fail fast.
        let _health = HealthGuard(self.metrics.clone());
        loop {
            self.poll_tiers();
            if !self.st.sched.has_unfinished() && self.st.reqs.is_empty() && !self.has_parked() {
                // A step left in flight whose sequences all left: collected before the engine
                // waits, so a failure in it is this step's, not the next request's.
                if let Err(e) = self.finish_pending_idle() {
                    self.fail_all(&format!("engine step failed: {e}"));
                    return;
                }
                if self.shutting_down {
                    break;
                }
                match self.next_command(&rx) {
                    Some(cmd) => {
                        self.handle(cmd);
                        self.publish_metrics();
                    }
                    None => break,
                }
            }
            let mut took = false;
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd);
                took = true;
            }
            if took {
                // New requests count in what the next submissions are predicted to wait for.
                self.publish_metrics();
            }
            if !self.st.sched.has_unfinished() {
                // Likewise with requests still here but nothing to schedule.
                if let Err(e) = self.finish_pending_idle() {
                    self.fail_all(&format!("engine step failed: {e}"));
                    return;
                }
                // Aborts may have emptied the pool: show it before waiting for work.
                self.publish_metrics();
                // Requests waiting on a tier's reads: a short wait, not a spin.
                if self.has_parked() {
                    if let Ok(cmd) = rx.recv_timeout(std::time::Duration::from_millis(1)) {
                        self.handle(cmd);
                    }
                }
                continue;
            }
            // A panic inside a step (a kernel or sampler bug) must not leave clients waiting on
            // streams that will never end: it ends the engine like a step error does.
            let started = Instant::now();
            let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| self.step()))
                .unwrap_or_else(|p| Err(EngineError::Internal(panic_message(p.as_ref()))));
            let seconds = started.elapsed().as_secs_f64();
            self.step_seconds += seconds;
            self.cost.observe(self.shape, seconds);
            if let Err(e) = stepped {
                self.fail_all(&format!("engine step failed: {e}"));
                return;
            }
            self.publish_metrics();
        }
        self.close_tiers();
        self.publish_metrics();
        if let Ok(mut m) = self.metrics.lock() {
            m.healthy = false;
        }
    }

    /// Where the step cost model starts.
    pub(crate) fn set_cost_seed(&mut self, seed: [f64; 4]) {
        self.cost = CostModel::new(seed);
    }

    /// The tenants' numbering (weighted ones first), before any request arrives.
    pub(crate) fn set_tenants(&mut self, tenants: Tenants) {
        self.tenants = tenants;
    }

    /// Lets steps overlap on a GPU (on by default); off, each step's tokens are back on the
    /// host before the next is scheduled.
    pub(crate) fn set_overlap(&mut self, on: bool) {
        self.overlap = on;
    }

    /// Makes the KV cache resident while the engine is idle (a server's setting), a slice at a
    /// time.
    pub(crate) fn prefault_kv_cache(&mut self) {
        self.populate_at = Some(0);
        self.set_populating(true);
    }

    fn set_populating(&self, on: bool) {
        if let Ok(mut m) = self.metrics.lock() {
            m.kv_cache_populating = on;
        }
    }

    /// The next command, waiting for it. While part of the KV cache is still to be made
    /// resident, the wait does that a slice at a time, checking for a command between slices,
    /// so a request waits at most one slice (a fraction of a millisecond). `None`: every handle
    /// is gone.
    fn next_command(&mut self, rx: &Receiver<Command>) -> Option<Command> {
        /// Bytes per slice: 256 pages, zeroed by the kernel in about 0.1-0.3 ms.
        const SLICE: usize = 1 << 20;
        while let Some(at) = self.populate_at {
            match rx.try_recv() {
                Ok(cmd) => return Some(cmd),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => {
                    self.populate_at = self.kv.populate(at, SLICE);
                    if self.populate_at.is_none() {
                        self.set_populating(false);
                    }
                }
            }
        }
        rx.recv().ok()
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            // A request whose prompt's blocks are in a tier below the pool waits for them.
            Command::Add(new) => self.admit(*new),
            Command::Abort(id) => self.abort(id),
            Command::Shutdown => self.shutting_down = true,
        }
    }

    /// Starts a request: its first sample joins the scheduler.
    fn add_request(&mut self, new: NewRequest) {
        let NewRequest {
            id,
            request,
            seed,
            tx,
            arrived,
            guide,
            predicted_ttft,
        } = new;
        if let Some(limit) = &mut self.step_limit {
            limit.observe_request(request.slo, predicted_ttft, Instant::now());
        }
        let mut r = ReqState {
            guide,
            predicted_ttft,
            usage: Usage {
                prompt_tokens: request.prompt.len(),
                ..Usage::default()
            },
            unfinished: request.params.n,
            request,
            seed,
            tx,
            arrived,
            seqs: Vec::new(),
            children_started: false,
        };
        if let Err(e) = self.start_sample(id, &mut r, 0) {
            let _ = r.tx.send(Event::Error(e.to_string()));
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        if let Ok(mut m) = self.metrics.lock() {
            m.prompt_tokens += r.request.prompt.len() as u64;
        }
        self.st.reqs.insert(id, r);
    }

    /// Adds sample `index` of request `id` to the scheduler.
    fn start_sample(&mut self, id: RequestId, r: &mut ReqState, index: usize) -> Result<()> {
        let p = &r.request.params;
        let seed = p.seed.unwrap_or(r.seed).wrapping_add(index as u64);
        let params = ferrum_types::SamplingParams {
            seed: Some(seed),
            ..p.clone()
        };
        let tok = self.st.tokenizer.as_deref();
        let output = OutputProcessor::new(
            &params,
            &r.request.prompt,
            tok,
            &self.eos,
            self.max_model_len,
        )?;
        let vocab = self.model.config().vocab_size;
        let sampler = Sampler::new(&params, &r.request.prompt, vocab, seed);
        let guide = r.guide.as_deref().map(Guide::fork);
        let seq = self.next_seq;
        self.next_seq += 1;
        let latest = crate::slo::latest_start(self.epoch, r, &self.cost);
        let tenant = self.tenants.id(r.request.tenant.as_deref());
        let priority = r.request.priority;
        self.st
            .sched
            .add_with(seq, &r.request.prompt, priority, tenant, latest)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        if let Some(tpot) = r.request.slo.and_then(|s| s.tpot) {
            self.st
                .sched
                .set_tpot(seq, tpot.as_secs_f64())
                .map_err(|e| EngineError::Internal(e.to_string()))?;
        }
        self.st.seqs.insert(
            seq,
            SeqState {
                request: id,
                index,
                sampler,
                output,
                last_token_at: None,
                guide,
            },
        );
        r.seqs.push(seq);
        Ok(())
    }

    fn step(&mut self) -> Result<()> {
        self.steps += 1;
        #[cfg(feature = "fault-injection")]
        if self.faults.panic_at_step == Some(self.steps) {
            panic!("injected fault: panic at step {}", self.steps);
        }
        let overlap = self.can_overlap();
        if !overlap {
            // The step in flight must be known before this one is scheduled (a request that
            // arrived needs what only the host can do, say a constraint's mask).
            self.finish_pending()?;
        }
        self.propose()?;
        // Prefill chunks sized for the decodes' TPOT targets and the step limit once the cost
        // model is trusted.
        if let Some(limit) = &mut self.step_limit {
            limit.apply(&mut self.st.sched, Instant::now(), &self.cost)?;
        }
        let out = (self.st.sched).schedule_with(self.cost.is_ready().then_some(&self.cost));
        self.prefill_cap = out.prefill_cap;
        if out.seqs.is_empty() {
            if self.pending.is_some() {
                // Every sequence waits on the step in flight (its blocks, say).
                return self.finish_pending();
            }
            return Err(EngineError::Internal(
                "the scheduler could not schedule any of the pending sequences".into(),
            ));
        }
        self.shape = self.st.sched.step_shape(&out);
        for s in &out.seqs {
            let t = self.st.sched.tenant(s.id).unwrap_or(0);
            self.tenants.count(t, s.num_tokens);
        }
        // Blocks read back from a tier, before the forward pass reads them.
        self.load_blocks(&out)?;
        self.st.sched.fill_batch(&out, &mut self.batch)?;
        let vocab = self.model.config().vocab_size;
        let needs_masks = self
            .st
            .seqs
            .values()
            .any(|q| q.guide.as_ref().is_some_and(Guide::needs_mask));
        // When every row this step samples is a plain greedy choice (no proposals, guides,
        // penalties, bias or logprobs), the model decides them where the logits are: on a
        // GPU only the token ids come back.
        let greedy = !needs_masks
            && out.seqs.iter().all(|s| {
                s.num_logits() == 0
                    || (s.num_proposed == 0
                        && self
                            .st
                            .seqs
                            .get(&s.id)
                            .is_some_and(|q| q.guide.is_none() && q.sampler.is_plain_greedy()))
            });
        if overlap {
            // Issued before the step in flight has been seen: its tokens are this step's
            // inputs on the device, and each sampler is one draw behind for them.
            let pending = self.pending.as_ref().map(|p| &p.rows);
            pending_inputs(&out, &self.batch, pending, &mut self.inputs)?;
            let inputs = &self.inputs;
            if greedy {
                self.model
                    .submit_argmax(&self.batch, &mut self.kv, inputs)?;
            } else {
                let (st, batch, scheduled) = (&mut self.st, &self.batch, &out.seqs);
                let ahead = |id| usize::from(pending.is_some_and(|p| p.contains_key(&id)));
                let specs = move || {
                    // Moved in, so the specs can borrow the sequences for as long as they live.
                    let st = { st };
                    st.row_specs(scheduled, batch, false, &ahead)
                };
                self.model
                    .submit_sample(&self.batch, &mut self.kv, inputs, specs)?;
            }
            // The step in flight has finished on the device by now, or soon: its results
            // are processed while this one runs.
            self.finish_pending()?;
            // This step stays in flight while the next is built. A sequence that ends in it
            // by a stop (seen when its results are processed) has one more row in the next
            // step, dropped there; one that ends at its length is held out of the next.
            return self.defer(out);
        }
        // On a GPU, rows are sampled there (only tokens and requested logprobs come back),
        // unless a row after a proposal depends on the proposal's fate: a constrained
        // request's (its mask follows its tokens) or a penalized one's.
        let on_device = !greedy
            && self.model.samples_on_device()
            && out.seqs.iter().all(|s| {
                s.num_logits() == 0
                    || s.num_proposed == 0
                    || self
                        .st
                        .seqs
                        .get(&s.id)
                        .is_some_and(|q| q.guide.is_none() && !q.sampler.edits_follow_output())
            });
        let rows_out = if greedy {
            Rows::Tokens(self.model.forward_argmax(&self.batch, &mut self.kv)?)
        } else if on_device {
            // The masks are inputs of the device's sampling: the model asks for the rows'
            // specs once the forward pass is enqueued, so they are computed while it runs.
            let (st, batch, scheduled) = (&mut self.st, &self.batch, &out.seqs);
            let specs = move || {
                let st = { st };
                st.row_specs(scheduled, batch, needs_masks, &|_| 0)
            };
            Rows::Sampled(
                self.model
                    .forward_sample(&self.batch, &mut self.kv, specs)?,
            )
        } else if needs_masks {
            // The guides' masks on a helper thread while the forward pass runs.
            let (seqs, failed) = (&mut self.st.seqs, &mut self.st.failed);
            let (model, kv, batch) = (&mut self.model, &mut self.kv, &self.batch);
            let (logits, masks) = std::thread::scope(|scope| {
                let masks = std::thread::Builder::new()
                    .name("ferrum-masks".into())
                    .spawn_scoped(scope, || compute_masks(seqs));
                let logits = model.forward(batch, kv);
                let waited = Instant::now();
                let masks = match masks {
                    Ok(h) => h.join().map_err(|p| panic_message(p.as_ref())),
                    Err(e) => Err(format!("cannot start the mask thread: {e}")),
                };
                let masks = masks.map(|(f, mut c)| {
                    c.wait_seconds = waited.elapsed().as_secs_f64();
                    (f, c)
                });
                (logits, masks)
            });
            let (f, c) = masks.map_err(EngineError::Internal)?;
            failed.extend(f);
            self.st.mask_step = c;
            Rows::Logits(logits?)
        } else {
            Rows::Logits(self.model.forward(&self.batch, &mut self.kv)?)
        };
        if let Some(d) = self.draft.as_mut() {
            // Before any rollback frees a block the batch wrote.
            let bs = self.st.sched.config().block_size;
            d.follow(&self.batch, out.seqs.iter().map(|s| s.id), bs)?;
        }
        check_rows(&out, rows_out, vocab)?;
        let now = Instant::now();
        let done = self.st.process(&out, &self.batch, rows_out, vocab, now);
        self.after_step(&out, done, now, false)
    }

    /// Whether the next step may be issued before the one in flight is seen: on a GPU that
    /// samples, with overlap on, no speculation, and no request whose next row depends on its
    /// last token on the host (a constraint's mask, penalties).
    fn can_overlap(&self) -> bool {
        self.overlap
            && self.spec.is_none()
            && self.model.can_overlap()
            && self
                .st
                .seqs
                .values()
                .all(|q| q.guide.is_none() && !q.sampler.edits_follow_output())
    }

    /// Leaves step `out` in flight: each sampled sequence gets a placeholder token in the
    /// scheduler, which the step's own token replaces once it is collected.
    fn defer(&mut self, out: SchedulerOutput) -> Result<()> {
        let mut rows = std::mem::take(&mut self.spare_rows);
        rows.clear();
        self.st.sampled.clear();
        let mut row = 0u32;
        for s in &out.seqs {
            if s.num_logits() == 0 {
                continue;
            }
            if let Some(q) = self.st.seqs.get(&s.id) {
                self.st.sampled.push((s.id, PLACEHOLDER));
                // The token the step samples lands after the run's last final token.
                rows.insert(s.id, (row, s.start + s.num_tokens));
                if q.output.remaining() == 1 {
                    // Its last token: it ends when the step is processed; no step before
                    // then computes a row for it.
                    self.st
                        .sched
                        .hold(s.id)
                        .map_err(|e| EngineError::Internal(e.to_string()))?;
                }
            }
            row += s.num_logits() as u32;
        }
        self.st.sched.update(&out, &self.st.sampled);
        self.store_blocks()?;
        std::mem::swap(&mut self.batch, &mut self.prev_batch);
        self.pending = Some(InFlight { out, rows });
        if let Ok(mut m) = self.metrics.lock() {
            m.steps_overlapped += 1;
        }
        Ok(())
    }

    /// [`Self::finish_pending`] outside a step (before the engine waits for work), counted
    /// as step time.
    fn finish_pending_idle(&mut self) -> Result<()> {
        let started = Instant::now();
        let done = self.finish_pending();
        self.step_seconds += started.elapsed().as_secs_f64();
        done
    }

    /// Collects and processes the step in flight, if any.
    fn finish_pending(&mut self) -> Result<()> {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        let vocab = self.model.config().vocab_size;
        let waited = Instant::now();
        let collected = self.model.collect();
        self.wait_seconds += waited.elapsed().as_secs_f64();
        let rows_out = match collected? {
            StepRows::Tokens(ids) => Rows::Tokens(ids),
            StepRows::Sampled(rows) => Rows::Sampled(rows),
        };
        check_rows(&p.out, rows_out, vocab)?;
        let now = Instant::now();
        let done = self
            .st
            .process(&p.out, &self.prev_batch, rows_out, vocab, now);
        let result = self.after_step(&p.out, done, now, true);
        self.spare_rows = p.rows;
        result
    }

    /// The end of a step once its rows are processed: the scheduler learns the tokens (or, for
    /// a deferred step, `resolve`, has its placeholders replaced), the metrics the step's
    /// counts; `n > 1` samples start, failed requests end, the draft proposes, finished
    /// sequences leave.
    fn after_step(
        &mut self,
        out: &SchedulerOutput,
        done: Processed,
        now: Instant,
        resolve: bool,
    ) -> Result<()> {
        if resolve {
            for &(id, token) in &self.st.sampled {
                // The placeholder is the sequence's last final token until then.
                if !self.st.seqs.contains_key(&id) {
                    continue;
                }
                self.st
                    .sched
                    .set_last_token(id, token)
                    .map_err(|e| EngineError::Internal(e.to_string()))?;
            }
        } else {
            self.st.sched.update(out, &self.st.sampled);
        }
        // Newly cached blocks go down to the tiers before any later step can reuse them.
        self.store_blocks()?;
        // One lock per step, not per token.
        if let Ok(mut m) = self.metrics.lock() {
            m.steps += 1;
            m.device_wait_seconds += std::mem::take(&mut self.wait_seconds);
            m.generation_tokens += done.new_tokens;
            self.st.spec_step.drain_into(&mut m.spec);
            let c = std::mem::take(&mut self.st.mask_step);
            m.structured_masks += c.masks;
            m.structured_mask_seconds += c.seconds;
            m.structured_mask_wait_seconds += c.wait_seconds;
            for l in &self.st.latencies {
                match l {
                    Latency::FirstToken(d, predicted) => {
                        m.time_to_first_token.observe(d.as_secs_f64());
                        if let Some((p, target)) = *predicted {
                            self.first_tokens.observe(p, d.as_secs_f64(), target);
                        }
                    }
                    Latency::InterToken(d) => m.inter_token_latency.observe(d.as_secs_f64()),
                }
            }
        }
        for id in done.child_starts {
            if let Some(mut r) = self.st.reqs.remove(&id) {
                r.children_started = true;
                let mut failed = None;
                for i in 1..r.request.params.n {
                    if let Err(e) = self.start_sample(id, &mut r, i) {
                        failed = Some(e);
                        break;
                    }
                }
                self.st.reqs.insert(id, r);
                if let Some(e) = failed {
                    self.fail(id, &e.to_string());
                }
            }
        }
        for (id, msg) in std::mem::take(&mut self.st.failed) {
            self.fail(id, &msg);
        }
        // Before finished sequences leave: the draft's held-back positions of their last run
        // are computed with the next proposals (their blocks may be reused from the cache).
        let proposed = self.draft_propose();
        if let Some(d) = self.draft.as_mut() {
            if let Ok(mut m) = self.metrics.lock() {
                m.spec.draft_forwards += d.take_forwards();
            }
        }
        let finished = std::mem::take(&mut self.st.finished);
        for &seq in &finished {
            self.finish_seq(seq, now);
        }
        self.st.finished = finished;
        proposed
    }

    fn finish_seq(&mut self, seq: RequestId, now: Instant) {
        self.st.sched.remove(seq);
        let Some(s) = self.st.seqs.remove(&seq) else {
            return;
        };
        let Some(r) = self.st.reqs.get_mut(&s.request) else {
            return;
        };
        r.unfinished -= 1;
        if r.unfinished == 0 {
            if let Some(r) = self.st.reqs.remove(&s.request) {
                // Metrics and the in-flight count first: a caller that has seen `Done` sees
                // them updated.
                self.count_finished(r.arrived, now);
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                let _ = r.tx.send(Event::Done { usage: r.usage });
            }
        }
    }
}
