//! A short calibration of the step cost model at start (`EngineConfig::calibrate`,
//! `ferrum serve` unless `--no-calibration`): before the engine takes requests, it runs a few
//! synthetic requests of its own through its ordinary steps (one long prompt alone, then a
//! batch of short ones, each decoding a few tokens), so that the cost model
//! ([`ferrum_scheduler::CostModel`]) has seen this model's steps on this machine, prefill and
//! decode apart, before the first client's target is judged on its word (admission by
//! prediction waits for [`ferrum_scheduler::cost::MIN_OBSERVATIONS`] steps).
//!
//! Invariants: nothing of it is seen from outside. Its requests never reach a client (their
//! ids are above any the handle gives), it runs before the tiers are on (none of its blocks is
//! copied down), and afterwards the metrics are those of an engine that has run nothing,
//! except the cost model's fields and [`Metrics::calibration_seconds`]; its prompts' blocks
//! stay in the pool as evictable cached blocks (freed before any client's, so evicted first).
//! A warm-up pass of the same batch shapes on short prompts (kernels loaded, graphs captured,
//! pages touched) runs first and is not observed. A cache too small for its prompts skips it
//! (the model then learns from the first requests' steps, as without calibration).

use super::{EngineCore, NewRequest};
use crate::metrics::Metrics;
use crate::request::GenerateRequest;
use crate::Result;
use ferrum_types::{RequestId, SamplingParams, TokenId};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Tokens each calibration request generates.
const OUTPUT: usize = 5;

/// The longest calibration prompt, and the most short ones in its batch.
const LONG: usize = 256;
const BATCH: usize = 8;

/// The warm-up's prompt length.
const WARM_UP: usize = 16;

/// Request ids of the calibration, counted down from the top (the handle counts up from 0).
const FIRST_ID: RequestId = RequestId::MAX;

/// What to run: the long prompt's length, and the batch of short prompts (count, length).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Plan {
    pub long: usize,
    pub batch: usize,
    pub short: usize,
}

impl Plan {
    /// The plan for an engine whose cache holds `capacity` tokens, that computes
    /// `max_batched` tokens a step, `max_seqs` sequences at once, contexts of at most
    /// `max_len`; `None` when the cache is too small for it to mean anything.
    pub(crate) fn new(
        capacity: usize,
        max_batched: usize,
        max_seqs: usize,
        max_len: usize,
    ) -> Option<Plan> {
        let long = LONG
            .min(max_batched)
            .min(capacity / 4)
            .min(max_len.saturating_sub(OUTPUT + 1));
        if long < 16 {
            return None;
        }
        let short = long / 4;
        let batch = BATCH
            .min(max_seqs)
            .min(capacity / 2 / (short + OUTPUT + 16));
        (batch >= 2).then_some(Plan { long, batch, short })
    }
}

impl EngineCore {
    /// Runs the calibration (see the module docs); returns the seconds it took, or `None`
    /// when the cache is too small for it.
    pub(crate) fn calibrate(&mut self) -> Result<Option<f64>> {
        let cfg = self.st.sched.config();
        let Some(plan) = Plan::new(
            cfg.capacity_tokens(),
            cfg.max_num_batched_tokens,
            cfg.max_num_seqs,
            self.max_model_len,
        ) else {
            return Ok(None);
        };
        let before = self.metrics.lock().map(|m| m.clone()).ok();
        let started = Instant::now();
        let mut next = FIRST_ID;
        let vocab = self.model.config().vocab_size;
        for observe in [false, true] {
            // The warm-up runs the same shapes of batch on short prompts (what it warms is
            // per launch and batch size, not per token); distinct prompts each pass, so the
            // observed pass computes what it times.
            let (long, short) = match observe {
                true => (plan.long, plan.short),
                false => (WARM_UP, WARM_UP),
            };
            let salt = usize::from(observe) * 7;
            self.run_synthetic(&mut next, &[(long, salt)], vocab, observe)?;
            let shorts: Vec<(usize, usize)> =
                (0..plan.batch).map(|i| (short, salt + i + 1)).collect();
            self.run_synthetic(&mut next, &shorts, vocab, observe)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        self.st.sched.reset_stats();
        self.steps = 0;
        self.step_seconds = 0.0;
        self.wait_seconds = 0.0;
        if let (Some(before), Ok(mut m)) = (before, self.metrics.lock()) {
            *m = Metrics {
                calibration_seconds: Some(seconds),
                ..before
            };
        }
        self.publish_metrics();
        Ok(Some(seconds))
    }

    /// Runs requests of the given (prompt length, salt) to the end; with `observe`, each
    /// step's time goes to the cost model as the engine loop's do.
    fn run_synthetic(
        &mut self,
        next: &mut RequestId,
        prompts: &[(usize, usize)],
        vocab: usize,
        observe: bool,
    ) -> Result<()> {
        let params = SamplingParams {
            max_tokens: Some(OUTPUT),
            ignore_eos: true,
            ..SamplingParams::greedy()
        };
        // The receivers stay open until the requests end: a closed one is a client gone.
        let mut streams = Vec::with_capacity(prompts.len());
        for &(len, salt) in prompts {
            let prompt: Vec<TokenId> = (0..len)
                .map(|i| ((salt * 104_729 + i * 7919 + 13) % vocab.max(1)) as TokenId)
                .collect();
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            streams.push(rx);
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            let id = *next;
            *next -= 1;
            self.add_request(NewRequest {
                id,
                request: GenerateRequest::new(prompt, params.clone()),
                seed: 0,
                tx,
                arrived: Instant::now(),
                guide: None,
                predicted_ttft: None,
            });
        }
        while self.st.sched.has_unfinished() {
            let t = Instant::now();
            self.step()?;
            if observe {
                self.cost.observe(self.shape, t.elapsed().as_secs_f64());
            }
        }
        self.finish_pending()?;
        for mut rx in streams {
            while let Ok(ev) = rx.try_recv() {
                if let crate::Event::Error(e) = ev {
                    return Err(crate::EngineError::Internal(format!(
                        "the cost calibration's request failed: {e}"
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_fit_the_cache_and_the_limits() {
        let p = Plan::new(1 << 20, 2048, 64, 4096).unwrap();
        assert_eq!(
            p,
            Plan {
                long: 256,
                batch: 8,
                short: 64
            }
        );
        // A small step budget, few sequences.
        let p = Plan::new(1 << 20, 100, 3, 4096).unwrap();
        assert_eq!(
            p,
            Plan {
                long: 100,
                batch: 3,
                short: 25
            }
        );
        // A cache of 400 tokens: a long prompt of 100, short ones as many as half holds.
        let p = Plan::new(400, 2048, 64, 4096).unwrap();
        assert_eq!(
            p,
            Plan {
                long: 100,
                batch: 4,
                short: 25
            }
        );
        // Too small to mean anything.
        assert_eq!(Plan::new(32, 2048, 64, 4096), None);
        assert_eq!(Plan::new(1 << 20, 2048, 1, 4096), None);
        assert_eq!(Plan::new(1 << 20, 2048, 64, 12), None);
    }
}
