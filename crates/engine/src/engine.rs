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
//!   sampled only under the mask of the guide's current state.

use crate::guide::Guide;
use crate::metrics::{Metrics, SpecCounters};
use crate::output::OutputProcessor;
use crate::request::{Event, GenerateRequest, Usage};
use crate::sampler::Sampler;
use crate::spec::{DraftModel, Proposer, SpeculativeConfig};
use crate::{EngineError, Result};
use ferrum_models::sampling::{RowSampling, SampledRow};
use ferrum_models::{ForwardBatch, KvCache, Model};
use ferrum_scheduler::Scheduler;
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FinishReason, RequestId, TokenId};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Messages from handles to the engine thread.
#[derive(Debug)]
pub(crate) enum Command {
    Add {
        id: RequestId,
        request: Box<GenerateRequest>,
        seed: u64,
        tx: UnboundedSender<Event>,
        arrived: Instant,
        /// The compiled constraint of a constrained request, in its initial state.
        guide: Option<Box<Guide>>,
    },
    Abort(RequestId),
    Shutdown,
}

/// A latency observed during a step, recorded into the histograms once per step.
enum Latency {
    FirstToken(std::time::Duration),
    InterToken(std::time::Duration),
}

struct SeqState {
    request: RequestId,
    index: usize,
    sampler: Sampler,
    output: OutputProcessor,
    last_token_at: Option<Instant>,
    /// The constraint of a constrained request.
    guide: Option<Guide>,
}

struct ReqState {
    request: GenerateRequest,
    seed: u64,
    tx: UnboundedSender<Event>,
    arrived: Instant,
    /// Sequence ids of the samples started so far.
    seqs: Vec<RequestId>,
    unfinished: usize,
    children_started: bool,
    usage: Usage,
    /// The constraint in its initial state; each sample follows a fork of it.
    guide: Option<Box<Guide>>,
}

pub(crate) struct EngineCore {
    model: Model,
    kv: KvCache,
    sched: Scheduler,
    tokenizer: Option<Arc<Tokenizer>>,
    eos: Vec<TokenId>,
    max_model_len: usize,
    metrics: Arc<Mutex<Metrics>>,
    /// Requests accepted and not yet done (shared with handles for the queue limit).
    in_flight: Arc<AtomicUsize>,
    batch: ForwardBatch,
    sampled: Vec<(RequestId, TokenId)>,
    finished: Vec<RequestId>,
    latencies: Vec<Latency>,
    reqs: HashMap<RequestId, ReqState>,
    seqs: HashMap<RequestId, SeqState>,
    next_seq: RequestId,
    shutting_down: bool,
    /// Requests whose output failed during this step, with the reason.
    failed: Vec<(RequestId, String)>,
    /// Steps run so far.
    steps: u64,
    /// Speculative decoding, when on.
    spec: Option<SpeculativeConfig>,
    /// This step's speculative counters, added to the metrics once per step.
    spec_step: SpecCounters,
    /// This step's structured-output counters, likewise.
    mask_step: MaskCounters,
    /// Scratch for one sequence's proposals.
    proposal: Vec<TokenId>,
    /// The draft model, with `Proposer::Draft`.
    draft: Option<DraftModel>,
    /// Scratch: decoding sequences and how many tokens each may propose.
    proposing: Vec<(RequestId, usize)>,
    /// Where the KV cache's next slice to make resident starts, while idle
    /// ([`KvCache::populate`]); `None`: nothing (more) to do.
    populate_at: Option<usize>,
    #[cfg(feature = "fault-injection")]
    pub(crate) faults: crate::config::FaultInjection,
}

/// Structured output's counters of one step.
#[derive(Debug, Default)]
struct MaskCounters {
    masks: u64,
    seconds: f64,
    wait_seconds: f64,
}

/// Computes a guide's mask unless it has one, counting it.
fn compute_mask(g: &mut Guide, c: &mut MaskCounters) -> std::result::Result<(), String> {
    if !g.needs_mask() {
        return Ok(());
    }
    let t = Instant::now();
    let r = g.compute_mask();
    c.masks += 1;
    c.seconds += t.elapsed().as_secs_f64();
    r
}

/// What a step's forward returned: every sampled row's logits (`[rows, vocab]`); when all
/// of them were plain greedy choices, each row's token decided by the model; or each row
/// sampled by the model's device under its request's spec.
#[derive(Debug, Clone, Copy)]
enum Rows<'a> {
    Logits(&'a [f32]),
    Tokens(&'a [u32]),
    Sampled(&'a [SampledRow]),
}

/// Computes the mask of every guide that lacks one (on the mask thread, during the forward
/// pass). Returns the requests whose constraint failed, with the reason.
fn compute_masks(
    seqs: &mut HashMap<RequestId, SeqState>,
) -> (Vec<(RequestId, String)>, MaskCounters) {
    let mut failed = Vec::new();
    let mut c = MaskCounters::default();
    for seq in seqs.values_mut() {
        if let Some(g) = seq.guide.as_mut() {
            if let Err(e) = compute_mask(g, &mut c) {
                failed.push((seq.request, format!("request failed: {e}")));
            }
        }
    }
    (failed, c)
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

impl std::fmt::Debug for ReqState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReqState")
            .field("seqs", &self.seqs)
            .finish_non_exhaustive()
    }
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
        EngineCore {
            model,
            kv,
            sched,
            tokenizer,
            eos,
            max_model_len,
            metrics,
            in_flight,
            batch: ForwardBatch::new(),
            sampled: Vec::new(),
            finished: Vec::new(),
            latencies: Vec::new(),
            reqs: HashMap::new(),
            seqs: HashMap::new(),
            next_seq: 0,
            shutting_down: false,
            failed: Vec::new(),
            steps: 0,
            spec: None,
            spec_step: SpecCounters::default(),
            mask_step: MaskCounters::default(),
            proposal: Vec::new(),
            draft: None,
            proposing: Vec::new(),
            populate_at: None,
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
            if !self.sched.has_unfinished() && self.reqs.is_empty() {
                if self.shutting_down {
                    break;
                }
                match self.next_command(&rx) {
                    Some(cmd) => self.handle(cmd),
                    None => break,
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd);
            }
            if !self.sched.has_unfinished() {
                // Aborts may have emptied the pool: show it before waiting for work.
                self.publish_metrics();
                continue;
            }
            // A panic inside a step (a kernel or sampler bug) must not leave clients waiting on
            // streams that will never end: it ends the engine like a step error does.
            let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| self.step()))
                .unwrap_or_else(|p| Err(EngineError::Invalid(panic_message(p.as_ref()))));
            if let Err(e) = stepped {
                let msg = format!("engine step failed: {e}");
                // Unhealthy before any client hears of the failure: one that reads its error
                // and then asks `/health` must not be told all is well.
                if let Ok(mut m) = self.metrics.lock() {
                    m.healthy = false;
                }
                for (_, r) in self.reqs.drain() {
                    let _ = r.tx.send(Event::Error(msg.clone()));
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
                return;
            }
            self.publish_metrics();
        }
        self.publish_metrics();
        if let Ok(mut m) = self.metrics.lock() {
            m.healthy = false;
        }
    }

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
                self.sched.config().block_size,
            )?),
            (Proposer::Draft, None) => {
                return Err(EngineError::Invalid(
                    "speculative decoding with a draft model needs the draft model (--speculative-model)".into(),
                ))
            }
            (_, Some(_)) => {
                return Err(EngineError::Invalid(
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
        for (&id, seq) in &self.seqs {
            if Self::is_decoding(&self.sched, id) && !self.finished.contains(&id) {
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
    fn draft_propose(&mut self) -> Result<()> {
        let Some(spec) = self.spec else {
            return Ok(());
        };
        if self.draft.is_none() {
            return Ok(());
        }
        self.collect_proposing(&spec);
        let proposing = std::mem::take(&mut self.proposing);
        let result = match self.draft.as_mut() {
            Some(d) => d.propose(&mut self.sched, &proposing),
            None => Ok(()),
        };
        self.proposing = proposing;
        result
    }

    /// Sets each decoding sequence's proposals for the coming step (speculative decoding),
    /// unless more sequences decode than `disable_by_batch_size`; clears the others'. A
    /// sequence proposes at most one token fewer than it may still generate.
    fn propose(&mut self) -> Result<()> {
        let Some(spec) = self.spec else {
            return Ok(());
        };
        self.collect_proposing(&spec);
        for &(id, k) in &self.proposing {
            match (&spec.proposer, self.draft.as_mut()) {
                (Proposer::Ngram(p), _) => {
                    let tokens = self.sched.tokens(id).unwrap_or(&[]);
                    p.propose(tokens, k, &mut self.proposal);
                }
                (Proposer::Draft, Some(d)) => {
                    d.take(id, &mut self.proposal);
                    self.proposal.truncate(k);
                }
                (Proposer::Draft, None) => self.proposal.clear(),
            }
            // A constrained sequence proposes only what its constraint accepts.
            if let Some(g) = self.seqs.get_mut(&id).and_then(|q| q.guide.as_mut()) {
                let n = g.valid_prefix(&self.proposal);
                self.proposal.truncate(n);
            }
            self.sched
                .propose(id, &self.proposal)
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
        }
        // Everyone else proposes nothing this step.
        for &id in self.seqs.keys() {
            if !self.proposing.iter().any(|&(p, _)| p == id) {
                self.sched
                    .propose(id, &[])
                    .map_err(|e| EngineError::Invalid(e.to_string()))?;
            }
        }
        Ok(())
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
            Command::Add {
                id,
                request,
                seed,
                tx,
                arrived,
                guide,
            } => {
                let mut r = ReqState {
                    guide,
                    usage: Usage {
                        prompt_tokens: request.prompt.len(),
                        ..Usage::default()
                    },
                    unfinished: request.params.n,
                    request: *request,
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
                self.reqs.insert(id, r);
            }
            Command::Abort(id) => self.abort(id),
            Command::Shutdown => self.shutting_down = true,
        }
    }

    /// Adds sample `index` of request `id` to the scheduler.
    fn start_sample(&mut self, id: RequestId, r: &mut ReqState, index: usize) -> Result<()> {
        let p = &r.request.params;
        let seed = p.seed.unwrap_or(r.seed).wrapping_add(index as u64);
        let params = ferrum_types::SamplingParams {
            seed: Some(seed),
            ..p.clone()
        };
        let tok = self.tokenizer.as_deref();
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
        self.sched
            .add(seq, &r.request.prompt, r.request.priority)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.seqs.insert(
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

    fn abort(&mut self, id: RequestId) {
        let Some(r) = self.reqs.remove(&id) else {
            return;
        };
        let tok = self.tokenizer.clone();
        for seq in &r.seqs {
            self.sched.remove(*seq);
            if let Some(mut s) = self.seqs.remove(seq) {
                if let Ok(o) = s.output.abort(tok.as_deref()) {
                    let _ = r.tx.send(Event::Finished {
                        index: s.index,
                        reason: o.finish.unwrap_or(ferrum_types::FinishReason::Abort),
                        text: o.text,
                    });
                }
            }
        }
        self.count_finished(r.arrived, Instant::now());
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let _ = r.tx.send(Event::Done { usage: r.usage });
    }

    /// A request left the engine (done, aborted or failed): the counter and the end-to-end
    /// histogram see every one, as their help says.
    fn count_finished(&self, arrived: Instant, now: Instant) {
        if let Ok(mut m) = self.metrics.lock() {
            m.e2e_latency.observe((now - arrived).as_secs_f64());
            m.requests_finished += 1;
        }
    }

    fn step(&mut self) -> Result<()> {
        self.steps += 1;
        #[cfg(feature = "fault-injection")]
        if self.faults.panic_at_step == Some(self.steps) {
            panic!("injected fault: panic at step {}", self.steps);
        }
        self.propose()?;
        let out = self.sched.schedule();
        if out.seqs.is_empty() {
            return Err(EngineError::Invalid(
                "the scheduler could not schedule any of the pending sequences".into(),
            ));
        }
        self.sched.fill_batch(&out, &mut self.batch)?;
        let vocab = self.model.config().vocab_size;
        let needs_masks = self
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
                            .seqs
                            .get(&s.id)
                            .is_some_and(|q| q.guide.is_none() && q.sampler.is_plain_greedy()))
            });
        // On a GPU, rows are sampled there (only tokens and requested logprobs come back),
        // unless a row after a proposal depends on the proposal's fate: a constrained
        // request's (its mask follows its tokens) or a penalized one's.
        let on_device = !greedy
            && self.model.samples_on_device()
            && out.seqs.iter().all(|s| {
                s.num_logits() == 0
                    || s.num_proposed == 0
                    || self
                        .seqs
                        .get(&s.id)
                        .is_some_and(|q| q.guide.is_none() && !q.sampler.edits_follow_output())
            });
        let rows_out = if greedy {
            Rows::Tokens(self.model.forward_argmax(&self.batch, &mut self.kv)?)
        } else if on_device {
            // The masks are inputs of the device's sampling: the model asks for the rows'
            // specs once the forward pass is enqueued, so they are computed while it runs.
            let (seqs, failed, mask_step) = (&mut self.seqs, &mut self.failed, &mut self.mask_step);
            let scheduled = &out.seqs;
            let num_rows = self.batch.logits_indices.len();
            let specs = move || {
                // Moved in, so the specs can borrow the sequences for as long as they live.
                let seqs = { seqs };
                if needs_masks {
                    let (f, c) = compute_masks(seqs);
                    failed.extend(f);
                    *mask_step = c;
                }
                for s in scheduled {
                    if let Some(q) = seqs.get_mut(&s.id).filter(|_| s.num_logits() > 0) {
                        q.sampler.prepare();
                    }
                }
                let seqs = &*seqs;
                let mut specs = Vec::with_capacity(num_rows);
                for s in scheduled {
                    let q = seqs.get(&s.id);
                    for i in 0..s.num_logits() {
                        specs.push(match q {
                            Some(q) => {
                                let guide = q.guide.as_ref().filter(|g| g.is_active());
                                q.sampler.row_spec(i, guide.map(Guide::mask_words))
                            }
                            // A row nobody reads (its sequence is gone): greedy.
                            None => RowSampling::greedy(),
                        });
                    }
                }
                specs
            };
            Rows::Sampled(
                self.model
                    .forward_sample(&self.batch, &mut self.kv, specs)?,
            )
        } else if needs_masks {
            // The guides' masks on a helper thread while the forward pass runs.
            let (seqs, failed) = (&mut self.seqs, &mut self.failed);
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
            let (f, c) = masks.map_err(EngineError::Invalid)?;
            failed.extend(f);
            self.mask_step = c;
            Rows::Logits(logits?)
        } else {
            Rows::Logits(self.model.forward(&self.batch, &mut self.kv)?)
        };
        if let Some(d) = self.draft.as_mut() {
            // Before any rollback frees a block the batch wrote.
            let bs = self.sched.config().block_size;
            d.follow(&self.batch, out.seqs.iter().map(|s| s.id), bs)?;
        }
        let now = Instant::now();
        self.sampled.clear();
        self.finished.clear();
        self.latencies.clear();
        let tok = self.tokenizer.as_deref();
        let mut new_tokens = 0u64;
        let mut child_starts: Vec<RequestId> = Vec::new();
        let mut rows = 0;
        for (s, slice) in out.seqs.iter().zip(&self.batch.seqs) {
            // A sequence's logits rows are consecutive: its last final token's, then one per
            // proposal.
            let num_rows = s.num_logits();
            if num_rows == 0 {
                continue;
            }
            let first_row = rows;
            rows += num_rows;
            let Some(seq) = self.seqs.get_mut(&s.id) else {
                continue;
            };
            let Some(r) = self.reqs.get_mut(&seq.request) else {
                continue;
            };
            if self.failed.iter().any(|(id, _)| *id == seq.request) {
                continue;
            }
            let run_end = slice.query_start + slice.query_len;
            let proposals = &self.batch.token_ids[run_end - s.num_proposed..run_end];
            match seq.last_token_at {
                None if seq.index == 0 => self.latencies.push(Latency::FirstToken(now - r.arrived)),
                Some(t) => self.latencies.push(Latency::InterToken(now - t)),
                None => {}
            }
            if seq.index == 0 && seq.last_token_at.is_none() {
                r.usage.cached_tokens = self.sched.prefix_hits(s.id).unwrap_or(0);
                if r.request.params.n > 1 && !r.children_started {
                    child_starts.push(seq.request);
                }
            }
            seq.last_token_at = Some(now);
            let (mut verified, mut accepted) = (0, 0);
            for i in 0..num_rows {
                let row = first_row + i;
                let l = match rows_out {
                    Rows::Logits(logits) => &logits[row * vocab..(row + 1) * vocab],
                    Rows::Tokens(_) | Rows::Sampled(_) => &[],
                };
                let counters = &mut self.mask_step;
                if let Some(Err(e)) = seq.guide.as_mut().map(|g| compute_mask(g, counters)) {
                    self.failed
                        .push((seq.request, format!("request failed: {e}")));
                    break;
                }
                let guide = seq.guide.as_ref().filter(|g| g.is_active());
                let (sample, is_proposal) = match (rows_out, proposals.get(i)) {
                    (Rows::Tokens(ids), _) => (seq.sampler.take(ids[row]), false),
                    (Rows::Sampled(sampled), p) => {
                        let out = seq.sampler.accept(&sampled[row]);
                        verified += usize::from(p.is_some());
                        let accepted = p.is_some_and(|&p| p == out.token);
                        (out, accepted)
                    }
                    (Rows::Logits(_), Some(&p)) => {
                        verified += 1;
                        seq.sampler.verify(l, p, guide)
                    }
                    (Rows::Logits(_), None) => (seq.sampler.sample(l, guide), false),
                };
                if let Some(Err(e)) = seq.guide.as_mut().map(|g| g.consume(sample.token)) {
                    self.failed
                        .push((seq.request, format!("request failed: {e}")));
                    break;
                }
                accepted += usize::from(is_proposal);
                self.sampled.push((s.id, sample.token));
                new_tokens += 1;
                r.usage.completion_tokens += 1;
                let pushed = seq.output.push(tok, sample.token).and_then(|mut step| {
                    // A complete constraint that allows nothing more ends the sequence.
                    if step.finish.is_none() && seq.guide.as_ref().is_some_and(Guide::is_stopped) {
                        let end = seq.output.end(tok, FinishReason::ConstraintEnd)?;
                        step.text.push_str(&end.text);
                        step.finish = end.finish;
                    }
                    Ok(step)
                });
                let step = match pushed {
                    Ok(step) => step,
                    Err(e) => {
                        // This request's output cannot go on (say the model sampled an id the
                        // tokenizer does not have); the others in the batch are unaffected.
                        self.failed
                            .push((seq.request, format!("request failed: {e}")));
                        break;
                    }
                };
                let send_ok =
                    r.tx.send(Event::Token {
                        index: seq.index,
                        token: sample.token,
                        text: step.text,
                        logprob: sample.logprob,
                        top_logprobs: sample.top_logprobs,
                    })
                    .is_ok();
                if let Some(reason) = step.finish {
                    let _ = r.tx.send(Event::Finished {
                        index: seq.index,
                        reason,
                        text: String::new(),
                    });
                    self.finished.push(s.id);
                    break;
                } else if !send_ok {
                    // The caller is gone; its stream's drop sends an abort as well.
                    self.finished.push(s.id);
                    break;
                }
                if !is_proposal {
                    // The target's own token ends the run.
                    break;
                }
            }
            // Proposals after a stop were never verified: they count neither way.
            if verified > 0 {
                r.usage.spec_drafts += 1;
                r.usage.spec_draft_tokens += verified;
                r.usage.spec_accepted_tokens += accepted;
                self.spec_step.record(verified, accepted);
            }
        }
        self.sched.update(&out, &self.sampled);
        // One lock per step, not per token.
        if let Ok(mut m) = self.metrics.lock() {
            m.generation_tokens += new_tokens;
            self.spec_step.drain_into(&mut m.spec);
            let c = std::mem::take(&mut self.mask_step);
            m.structured_masks += c.masks;
            m.structured_mask_seconds += c.seconds;
            m.structured_mask_wait_seconds += c.wait_seconds;
            for l in &self.latencies {
                match l {
                    Latency::FirstToken(d) => m.time_to_first_token.observe(d.as_secs_f64()),
                    Latency::InterToken(d) => m.inter_token_latency.observe(d.as_secs_f64()),
                }
            }
        }
        for id in child_starts {
            if let Some(mut r) = self.reqs.remove(&id) {
                r.children_started = true;
                let mut failed = None;
                for i in 1..r.request.params.n {
                    if let Err(e) = self.start_sample(id, &mut r, i) {
                        failed = Some(e);
                        break;
                    }
                }
                self.reqs.insert(id, r);
                if let Some(e) = failed {
                    self.fail(id, &e.to_string());
                }
            }
        }
        for (id, msg) in std::mem::take(&mut self.failed) {
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
        let finished = std::mem::take(&mut self.finished);
        for &seq in &finished {
            self.finish_seq(seq, now);
        }
        self.finished = finished;
        proposed
    }

    /// Ends a request with an error: its sequences and blocks are released.
    fn fail(&mut self, id: RequestId, msg: &str) {
        let Some(r) = self.reqs.remove(&id) else {
            return;
        };
        for seq in &r.seqs {
            self.sched.remove(*seq);
            self.seqs.remove(seq);
        }
        self.count_finished(r.arrived, Instant::now());
        let _ = r.tx.send(Event::Error(msg.to_owned()));
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn finish_seq(&mut self, seq: RequestId, now: Instant) {
        self.sched.remove(seq);
        let Some(s) = self.seqs.remove(&seq) else {
            return;
        };
        let Some(r) = self.reqs.get_mut(&s.request) else {
            return;
        };
        r.unfinished -= 1;
        if r.unfinished == 0 {
            if let Some(r) = self.reqs.remove(&s.request) {
                // Metrics and the in-flight count first: a caller that has seen `Done` sees
                // them updated.
                self.count_finished(r.arrived, now);
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                let _ = r.tx.send(Event::Done { usage: r.usage });
            }
        }
    }

    fn publish_metrics(&self) {
        let st = self.sched.stats();
        if let Ok(mut m) = self.metrics.lock() {
            m.num_running = st.num_running;
            m.num_waiting = st.num_waiting;
            m.kv_blocks_total = st.blocks_total;
            m.kv_blocks_free = st.blocks_free;
            m.kv_blocks_cached = st.blocks_cached;
            m.prefix_cache_queries = st.prefix_queries;
            m.prefix_cache_hits = st.prefix_hits;
            m.preemptions = st.preemptions;
        }
    }
}
