//! The requests' side of the engine loop: every live request and its sequences (sampler,
//! output processor, constraint), the scheduler, and how one step's rows become tokens,
//! events and finished sequences ([`Requests::process`]). Kept apart from the model and its
//! KV cache, so a step's rows can be processed while they still borrow the model.
//!
//! Invariants: every sequence in the scheduler has a [`SeqState`] and belongs to a live
//! request; a step's rows are processed once, in the step's order, each sampled sequence's
//! rows consecutive (its last final token's, then one per proposal).

use crate::guide::Guide;
use crate::metrics::SpecCounters;
use crate::output::OutputProcessor;
use crate::request::{Event, GenerateRequest, Usage};
use crate::sampler::Sampler;
use ferrum_models::sampling::{RowSampling, SampledRow};
use ferrum_models::ForwardBatch;
use ferrum_scheduler::{Scheduler, SchedulerOutput};
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FinishReason, RequestId, TokenId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// A latency observed during a step, recorded into the histograms once per step.
pub(crate) enum Latency {
    /// With admission's prediction and the target, in seconds, when it made one.
    FirstToken(std::time::Duration, Option<(f64, f64)>),
    InterToken(std::time::Duration),
}

/// One sample of a request: a sequence in the scheduler.
pub(crate) struct SeqState {
    pub(crate) request: RequestId,
    pub(crate) index: usize,
    pub(crate) sampler: Sampler,
    pub(crate) output: OutputProcessor,
    pub(crate) last_token_at: Option<Instant>,
    /// The constraint of a constrained request.
    pub(crate) guide: Option<Guide>,
}

/// A live request: its stream, its samples, its usage.
pub(crate) struct ReqState {
    pub(crate) request: GenerateRequest,
    pub(crate) seed: u64,
    pub(crate) tx: UnboundedSender<Event>,
    pub(crate) arrived: Instant,
    /// Sequence ids of the samples started so far.
    pub(crate) seqs: Vec<RequestId>,
    pub(crate) unfinished: usize,
    pub(crate) children_started: bool,
    pub(crate) usage: Usage,
    /// The constraint in its initial state; each sample follows a fork of it.
    pub(crate) guide: Option<Box<Guide>>,
    /// Admission's first-token prediction and the target, in seconds, if it made one.
    pub(crate) predicted_ttft: Option<(f64, f64)>,
}

/// The requests' side of the engine: the scheduler's sequences, the requests with their
/// streams, and what a step's results change. Apart from the model and its KV cache, so a
/// step's results can be processed while they borrow the model.
pub(crate) struct Requests {
    pub(crate) sched: Scheduler,
    pub(crate) tokenizer: Option<Arc<Tokenizer>>,
    pub(crate) reqs: HashMap<RequestId, ReqState>,
    pub(crate) seqs: HashMap<RequestId, SeqState>,
    /// The tokens a step keeps, per sequence in the step's order.
    pub(crate) sampled: Vec<(RequestId, TokenId)>,
    pub(crate) finished: Vec<RequestId>,
    pub(crate) latencies: Vec<Latency>,
    /// Requests whose output failed during this step, with the reason.
    pub(crate) failed: Vec<(RequestId, String)>,
    /// This step's speculative counters, added to the metrics once per step.
    pub(crate) spec_step: SpecCounters,
    /// This step's structured-output counters, likewise.
    pub(crate) mask_step: MaskCounters,
}

/// Structured output's counters of one step.
#[derive(Debug, Default)]
pub(crate) struct MaskCounters {
    pub(crate) masks: u64,
    pub(crate) seconds: f64,
    pub(crate) wait_seconds: f64,
}

/// Computes a guide's mask unless it has one, counting it.
pub(crate) fn compute_mask(g: &mut Guide, c: &mut MaskCounters) -> std::result::Result<(), String> {
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
pub(crate) enum Rows<'a> {
    Logits(&'a [f32]),
    Tokens(&'a [u32]),
    Sampled(&'a [SampledRow]),
}

/// Computes the mask of every guide that lacks one (on the mask thread, during the forward
/// pass). Returns the requests whose constraint failed, with the reason.
pub(crate) fn compute_masks(
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

impl std::fmt::Debug for ReqState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReqState")
            .field("seqs", &self.seqs)
            .finish_non_exhaustive()
    }
}

/// What processing a step's rows left for the engine to do.
pub(crate) struct Processed {
    /// Tokens the step generated.
    pub(crate) new_tokens: u64,
    /// Requests whose first sample got its first token: their other samples start now.
    pub(crate) child_starts: Vec<RequestId>,
}

impl Requests {
    /// Each logits row's sampling spec for step `scheduled` (its `batch`): the masks first,
    /// when `needs_masks`; a sequence's draws start `ahead(id)` tokens past those it has
    /// recorded (its token in a step still in flight).
    pub(crate) fn row_specs<'a>(
        &'a mut self,
        scheduled: &[ferrum_scheduler::ScheduledSeq],
        batch: &ForwardBatch,
        needs_masks: bool,
        ahead: &dyn Fn(RequestId) -> usize,
    ) -> Vec<RowSampling<'a>> {
        if needs_masks {
            let (f, c) = compute_masks(&mut self.seqs);
            self.failed.extend(f);
            self.mask_step = c;
        }
        for s in scheduled {
            if let Some(q) = self.seqs.get_mut(&s.id).filter(|_| s.num_logits() > 0) {
                q.sampler.prepare();
            }
        }
        let seqs = &self.seqs;
        let mut specs = Vec::with_capacity(batch.logits_indices.len());
        for s in scheduled {
            let q = seqs.get(&s.id);
            let skip = ahead(s.id);
            for i in 0..s.num_logits() {
                specs.push(match q {
                    Some(q) => {
                        let guide = q.guide.as_ref().filter(|g| g.is_active());
                        q.sampler.row_spec(skip + i, guide.map(Guide::mask_words))
                    }
                    // A row nobody reads (its sequence is gone): greedy.
                    None => RowSampling::greedy(),
                });
            }
        }
        specs
    }

    /// Takes step `out`'s rows (`batch` is its batch): each sampled sequence's token (or, with
    /// proposals, the accepted ones and the target's own) goes through its guide, sampler and
    /// output; events go to the streams; the tokens kept are in `self.sampled`, finished
    /// sequences in `self.finished`, failed requests in `self.failed`.
    pub(crate) fn process(
        &mut self,
        out: &SchedulerOutput,
        batch: &ForwardBatch,
        rows_out: Rows<'_>,
        vocab: usize,
        now: Instant,
    ) -> Processed {
        self.sampled.clear();
        self.finished.clear();
        self.latencies.clear();
        let tok = self.tokenizer.as_deref();
        let mut new_tokens = 0u64;
        let mut child_starts: Vec<RequestId> = Vec::new();
        let mut rows = 0;
        for (s, slice) in out.seqs.iter().zip(&batch.seqs) {
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
            let proposals = &batch.token_ids[run_end - s.num_proposed..run_end];
            match seq.last_token_at {
                None if seq.index == 0 => self
                    .latencies
                    .push(Latency::FirstToken(now - r.arrived, r.predicted_ttft)),
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
        Processed {
            new_tokens,
            child_starts,
        }
    }
}
