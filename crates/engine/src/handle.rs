//! [`EngineHandle`]: the cloneable, thread-safe front of the engine thread, and
//! [`EventStream`], a request's events (blocking or async). Dropping a stream aborts its
//! request.

use crate::config::EngineConfig;
use crate::engine::{Command, EngineCore, NewRequest};
use crate::guide::{Guide, GuideCompiler};
use crate::metrics::Metrics;
use crate::request::{Event, GenerateRequest};
use crate::tenants::Tenants;
use crate::{EngineError, Result};
use ferrum_models::Model;
use ferrum_scheduler::{Scheduler, SchedulerConfig, SchedulingPolicy};
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{RequestId, StructuredOutput, TokenId};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

struct Shared {
    tx: Mutex<Sender<Command>>,
    metrics: Arc<Mutex<Metrics>>,
    next_id: AtomicU64,
    in_flight: Arc<AtomicUsize>,
    accepting: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    tokenizer: Option<Arc<Tokenizer>>,
    /// The ids that end a sequence.
    eos: Vec<TokenId>,
    /// Built on the first constrained request (it walks the whole vocabulary).
    guides: OnceLock<std::result::Result<Arc<GuideCompiler>, String>>,
    vocab_size: usize,
    max_model_len: usize,
    max_in_flight: usize,
    seed_base: u64,
}

/// Submits requests to the engine thread. Clone it freely; it is `Send + Sync`.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("max_model_len", &self.shared.max_model_len)
            .finish_non_exhaustive()
    }
}

/// A request's events. `blocking_next` for threads, `next` for async code.
#[derive(Debug)]
pub struct EventStream {
    id: RequestId,
    rx: UnboundedReceiver<Event>,
    tx: Sender<Command>,
    done: bool,
}

impl EventStream {
    pub fn id(&self) -> RequestId {
        self.id
    }

    fn mark(&mut self, ev: &Option<Event>) {
        if matches!(ev, None | Some(Event::Done { .. }) | Some(Event::Error(_))) {
            self.done = true;
        }
    }

    /// The next event, waiting for it; `None` after `Done` or `Error`.
    pub fn blocking_next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let ev = self.rx.blocking_recv();
        self.mark(&ev);
        ev
    }

    /// The next event; `None` after `Done` or `Error`.
    pub async fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        self.mark(&ev);
        ev
    }
}

/// The last handle gone, the engine stops (in-flight requests finish; their streams were
/// dropped with the handles, which aborted them) and its thread is joined: nothing the engine
/// holds (a parallel run's communicators) outlives the caller's scope.
impl Drop for Shared {
    fn drop(&mut self) {
        if let Ok(tx) = self.tx.get_mut() {
            let _ = tx.send(Command::Shutdown);
        }
        if let Some(t) = self.thread.get_mut().ok().and_then(Option::take) {
            let _ = t.join();
        }
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.tx.send(Command::Abort(self.id));
        }
    }
}

impl EngineHandle {
    /// Sizes the KV cache, builds the scheduler and starts the engine thread.
    pub fn start(
        model: Model,
        tokenizer: Option<Arc<Tokenizer>>,
        cfg: &EngineConfig,
    ) -> Result<EngineHandle> {
        Self::start_inner(model, None, tokenizer, cfg, |_| {})
    }

    /// [`EngineHandle::start`] with a draft model for speculative decoding
    /// (`cfg.speculative`'s proposer must be `Proposer::Draft`). Load it onto the target's
    /// compute pool (`LoadOptions::pool` with `Model::compute_pool`), so the two share threads.
    pub fn start_with_draft(
        model: Model,
        draft: Model,
        tokenizer: Option<Arc<Tokenizer>>,
        cfg: &EngineConfig,
    ) -> Result<EngineHandle> {
        Self::start_inner(model, Some(draft), tokenizer, cfg, |_| {})
    }

    /// [`EngineHandle::start`] with faults the engine loop injects into itself.
    #[cfg(feature = "fault-injection")]
    pub fn start_with_faults(
        model: Model,
        tokenizer: Option<Arc<Tokenizer>>,
        cfg: &EngineConfig,
        faults: crate::config::FaultInjection,
    ) -> Result<EngineHandle> {
        Self::start_inner(model, None, tokenizer, cfg, move |core| {
            core.faults = faults
        })
    }

    fn start_inner(
        mut model: Model,
        draft: Option<Model>,
        tokenizer: Option<Arc<Tokenizer>>,
        cfg: &EngineConfig,
        setup: impl FnOnce(&mut EngineCore),
    ) -> Result<EngineHandle> {
        let mc = model.config().clone();
        let bytes_per_block = model.kv_bytes_per_block(cfg.block_size);
        let mut num_blocks = cfg.num_blocks(bytes_per_block, model.device_memory()?)?;
        if model.gpu().is_none() {
            // The pool is host memory: the offload bytes join it (`crate::tier`).
            num_blocks += cfg.offload_blocks(bytes_per_block);
        }
        if cfg.tenant_weights.iter().any(|(_, w)| *w == 0) {
            return Err(EngineError::Config(
                "a tenant's weight must be at least 1".into(),
            ));
        }
        let (tenants, weights) = Tenants::new(&cfg.tenant_weights);
        let sched_cfg = SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            block_size: cfg.block_size,
            num_blocks,
            // LongRoPE rotates a prompt's blocks by its length: not shareable across prompts.
            enable_prefix_caching: cfg.enable_prefix_caching && !mc.rope_depends_on_prompt_len(),
            policy: match &cfg.scheduling {
                SchedulingPolicy::Fair(_) => SchedulingPolicy::Fair(weights),
                p => p.clone(),
            },
        };
        let sched =
            Scheduler::new(sched_cfg.clone()).map_err(|e| EngineError::Config(e.to_string()))?;
        let model_len = mc.max_position_embeddings;
        let max_model_len = match cfg.max_model_len {
            Some(0) => {
                return Err(EngineError::Config(
                    "--max-model-len must be at least 1".into(),
                ))
            }
            Some(l) if l > model_len => {
                return Err(EngineError::Config(format!(
                    "--max-model-len {l}: a max model length more than the model's context of {model_len} tokens"
                )))
            }
            Some(l) => l,
            None => model_len,
        }
        .min(sched_cfg.capacity_tokens());
        if let Some(l @ 0..=1) = cfg.max_model_len {
            return Err(EngineError::Config(format!(
                "--max-model-len {l} leaves no room to generate: it must be at least 2"
            )));
        }
        if max_model_len < 2 {
            return Err(EngineError::Config(format!(
                "the KV cache holds {} tokens: too small to generate",
                sched_cfg.capacity_tokens()
            )));
        }
        let kv = model.new_kv_cache(num_blocks, cfg.block_size)?;
        let eos = match &tokenizer {
            Some(t) => t.special().stop_token_ids.clone(),
            None => mc.eos_token_ids.clone(),
        };
        let metrics = Arc::new(Mutex::new(Metrics {
            device: model.device_name(),
            kv_blocks_total: num_blocks,
            kv_blocks_free: num_blocks,
            ..Metrics::default()
        }));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = channel();
        let mut core = EngineCore::new(
            model,
            kv,
            sched,
            tokenizer.clone(),
            eos.clone(),
            max_model_len,
            metrics.clone(),
            in_flight.clone(),
        );
        if cfg.prefault_kv_cache {
            core.prefault_kv_cache();
        }
        core.set_overlap(cfg.overlap_steps);
        if let Some(spec) = cfg.speculative {
            core.set_speculative(spec, draft)?;
        } else if draft.is_some() {
            return Err(EngineError::Config(
                "a draft model was given without speculative decoding".into(),
            ));
        }
        core.set_tenants(tenants);
        core.set_cost_seed(cfg.cost_seed);
        if cfg.calibrate {
            core.calibrate()?;
        }
        // After the calibration: none of its blocks goes down to the tiers.
        core.set_kv_tiers(cfg.kv_disk.as_ref(), cfg.kv_offload_memory, cfg.block_size)?;
        setup(&mut core);
        let thread = std::thread::Builder::new()
            .name("ferrum-engine".into())
            .spawn(move || core.run(rx))
            .map_err(|e| EngineError::Internal(format!("cannot start the engine thread: {e}")))?;
        let seed_base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Ok(EngineHandle {
            shared: Arc::new(Shared {
                tx: Mutex::new(tx),
                metrics,
                next_id: AtomicU64::new(0),
                in_flight,
                accepting: AtomicBool::new(true),
                thread: Mutex::new(Some(thread)),
                tokenizer,
                eos,
                guides: OnceLock::new(),
                vocab_size: mc.vocab_size,
                max_model_len,
                max_in_flight: cfg.max_num_seqs + cfg.max_waiting,
                seed_base,
            }),
        })
    }

    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.shared.tokenizer.as_ref()
    }

    /// The longest sequence (prompt and output) a request may have.
    pub fn max_model_len(&self) -> usize {
        self.shared.max_model_len
    }

    pub fn vocab_size(&self) -> usize {
        self.shared.vocab_size
    }

    /// A copy of the current metrics.
    pub fn metrics(&self) -> Metrics {
        self.shared
            .metrics
            .lock()
            .map(|m| m.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Whether the engine loop is running and accepting requests.
    pub fn is_healthy(&self) -> bool {
        self.shared.accepting.load(Ordering::Acquire) && self.metrics().healthy
    }

    /// The constraint compiler of this engine's tokenizer, built on first use.
    fn guide_compiler(&self) -> Result<Arc<GuideCompiler>> {
        let s = &self.shared;
        let unusable = |msg: String| EngineError::Constraint {
            kind: "structured output",
            msg,
        };
        let tok = s.tokenizer.as_ref().ok_or_else(|| {
            unusable("it needs the model's tokenizer, and this model has none".into())
        })?;
        s.guides
            .get_or_init(|| {
                GuideCompiler::new(tok, &s.eos, s.vocab_size)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(unusable)
    }

    /// Compiles a constraint for this engine's tokenizer (and computes its first mask):
    /// what [`EngineHandle::generate`] does for a request with `params.structured`. Errors
    /// name what does not compile.
    pub fn compile_guide(&self, spec: &StructuredOutput) -> Result<Guide> {
        self.guide_compiler()?.compile(spec)
    }

    /// Validates and submits a request; its events arrive on the returned stream. A
    /// constrained request's constraint is compiled here, on the caller's thread (a few
    /// milliseconds; the first one also builds the tokenizer's trie).
    pub fn generate(&self, mut request: GenerateRequest) -> Result<EventStream> {
        let s = &self.shared;
        if !self.is_healthy() {
            return Err(EngineError::Unavailable("the engine is not running".into()));
        }
        request.params.validate(s.vocab_size)?;
        if request.prompt.is_empty() {
            return Err(EngineError::Request("the prompt is empty".into()));
        }
        if let Some(&bad) = request.prompt.iter().find(|&&t| t as usize >= s.vocab_size) {
            return Err(EngineError::Request(format!(
                "prompt token {bad} is outside the vocabulary of {} tokens",
                s.vocab_size
            )));
        }
        if request.prompt.len() >= s.max_model_len {
            return Err(EngineError::Request(format!(
                "the prompt has {} tokens, but this engine's context is {} tokens (prompt and output must fit)",
                request.prompt.len(),
                s.max_model_len
            )));
        }
        let predicted_ttft = match &request.slo {
            Some(slo) => {
                let m = s.metrics.lock().unwrap_or_else(|p| p.into_inner());
                crate::slo::admit(&m, request.prompt.len(), request.priority, slo)?
            }
            None => None,
        };
        if !request.params.stop.is_empty() && s.tokenizer.is_none() {
            return Err(EngineError::Request(
                "stop strings need a tokenizer, and this model has none".into(),
            ));
        }
        let guide = match (&request.params.structured, request.guide.take()) {
            (Some(_), Some(g)) => Some(Box::new(g)),
            (Some(spec), None) => Some(Box::new(self.compile_guide(spec)?)),
            (None, Some(_)) => {
                return Err(EngineError::Internal(
                    "a compiled guide was given without its constraint in the parameters".into(),
                ))
            }
            (None, None) => None,
        };
        if s.in_flight.fetch_add(1, Ordering::AcqRel) >= s.max_in_flight {
            s.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::Overloaded(s.max_in_flight));
        }
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let (etx, erx) = unbounded_channel();
        let tx =
            s.tx.lock()
                .map_err(|_| EngineError::Unavailable("the engine handle is poisoned".into()))?
                .clone();
        let cmd = Command::Add(Box::new(NewRequest {
            id,
            request,
            seed: s
                .seed_base
                .wrapping_add(id.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            tx: etx,
            arrived: Instant::now(),
            guide,
            predicted_ttft,
        }));
        if tx.send(cmd).is_err() {
            s.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::Unavailable("the engine has stopped".into()));
        }
        Ok(EventStream {
            id,
            rx: erx,
            tx,
            done: false,
        })
    }

    /// Cancels a request; its stream ends with `Finished(Abort)` and `Done`.
    pub fn abort(&self, id: RequestId) {
        if let Ok(tx) = self.shared.tx.lock() {
            let _ = tx.send(Command::Abort(id));
        }
    }

    /// Stops accepting requests, lets the in-flight ones finish, and waits for the engine
    /// thread to end.
    pub fn shutdown(&self) {
        self.shared.accepting.store(false, Ordering::Release);
        if let Ok(tx) = self.shared.tx.lock() {
            let _ = tx.send(Command::Shutdown);
        }
        let thread = self.shared.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}
