//! Admission by prediction: a request with a time-to-first-token target is refused when it is
//! submitted if the step cost model ([`ferrum_scheduler::CostModel`], fitted from the engine's
//! own steps) predicts its first token after the target, given the prefill work ahead of it
//! and the running decodes (a snapshot the engine publishes each step). Refusing costs no
//! compute and tells the client when to come back, instead of failing it late.
//!
//! The prediction ([`ferrum_scheduler::predict_first_token`]) pushes the prefill tokens ahead
//! and the request's own through steps of the token budget shared with the decodes. Under a
//! policy that admits strictly by priority (`priority`, `slo`), only the work of running
//! sequences and of waiting ones of the request's priority or better is ahead of it. The
//! retry time is the excess: once the work ahead has gone down by that much, the target can be
//! met (if nothing arrives meanwhile). A target that the request's own prefill cannot meet even
//! on an idle engine is the client's to mend (a 400), not a matter of waiting.
//!
//! The step model predicts steps, not first tokens: a request also waits for the step running
//! when it arrives, and behind requests that arrive after it and go first (a better priority,
//! less slack). So admission keeps an out-of-sample record of itself ([`FirstTokenRecord`]):
//! for each admitted request with a target, the first token it predicted and the one observed;
//! the median ratio over recent predictions near their targets is published
//! (`ferrum_ttft_observed_over_predicted`). It is not used to decide: scaling the prediction by
//! it was measured (`docs/benchmarks.md`) to refuse more requests without fewer late ones, the
//! misses coming from bursts that arrive after admission, which no ratio at admission foresees.
//!
//! Under `--scheduling slo`, [`latest_start`] gives the scheduler each request's slack.
//!
//! Invariants: nothing is refused before the model has seen enough steps to be trusted, nor a
//! best-effort request; the record's ratio is 1 until it holds [`RECORD_MIN`] observations.

use crate::metrics::Metrics;
use crate::request::Slo;
use crate::requests::ReqState;
use crate::{EngineError, Result};
use ferrum_scheduler::{predict_first_token, CostModel, StepShape, NO_DEADLINE};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Observations kept by [`FirstTokenRecord`] (the most recent).
const RECORD_LEN: usize = 64;
/// Observations [`FirstTokenRecord`] needs before its ratio departs from 1.
const RECORD_MIN: usize = 8;
/// The ratio's bounds: a record this far off says the model is, not the queue.
const RATIO_RANGE: (f64, f64) = (0.5, 8.0);

/// Admission's record of its first-token predictions against what followed (see the module
/// docs): `(predicted, observed, target)` seconds of the last [`RECORD_LEN`] admitted requests,
/// and their ratio, computed when one comes (the engine reads it every step).
#[derive(Debug, Clone)]
pub(crate) struct FirstTokenRecord {
    seen: VecDeque<(f64, f64, f64)>,
    total: u64,
    ratio: f64,
}

impl Default for FirstTokenRecord {
    fn default() -> Self {
        FirstTokenRecord {
            seen: VecDeque::new(),
            total: 0,
            ratio: 1.0,
        }
    }
}

impl FirstTokenRecord {
    /// Records an admitted request's predicted and observed first token, and its target.
    /// Non-finite or non-positive values are ignored.
    pub(crate) fn observe(&mut self, predicted: f64, observed: f64, target: f64) {
        let good = |x: f64| x > 0.0 && x.is_finite();
        if !(good(predicted) && good(observed) && good(target)) {
            return;
        }
        if self.seen.len() == RECORD_LEN {
            self.seen.pop_front();
        }
        self.seen.push_back((predicted, observed, target));
        self.total += 1;
        self.ratio = self.median_ratio();
    }

    /// Observations recorded so far.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// The median of observed over predicted, over the recent predictions of at least a
    /// quarter of their target (where a target is at stake; short predictions' fixed
    /// overheads would overstate it), or over all when fewer than [`RECORD_MIN`] are; 1 with
    /// fewer than [`RECORD_MIN`] in all; within [`RATIO_RANGE`].
    pub(crate) fn ratio(&self) -> f64 {
        self.ratio
    }

    /// [`FirstTokenRecord::ratio`], computed from the record.
    fn median_ratio(&self) -> f64 {
        if self.seen.len() < RECORD_MIN {
            return 1.0;
        }
        let ratio = |&(p, o, _): &(f64, f64, f64)| o / p;
        let mut near: Vec<f64> = self
            .seen
            .iter()
            .filter(|(p, _, t)| *p >= t / 4.0)
            .map(ratio)
            .collect();
        if near.len() < RECORD_MIN {
            near = self.seen.iter().map(ratio).collect();
        }
        near.sort_by(f64::total_cmp);
        let n = near.len();
        let median = if n % 2 == 1 {
            near[n / 2]
        } else {
            (near[n / 2 - 1] + near[n / 2]) / 2.0
        };
        median.clamp(RATIO_RANGE.0, RATIO_RANGE.1)
    }
}

/// The latest start (microseconds since `epoch`) at which a request still meets its
/// first-token deadline: the deadline less its own predicted prefill. [`NO_DEADLINE`] without
/// a target; 0 when it is already late.
pub(crate) fn latest_start(epoch: Instant, r: &ReqState, cost: &CostModel) -> u64 {
    let Some(ttft) = r.request.slo.and_then(|s| s.ttft) else {
        return NO_DEADLINE;
    };
    let own = cost.predict(StepShape {
        prefill_tokens: r.request.prompt.len(),
        ..StepShape::default()
    });
    let deadline = (r.arrived + ttft).saturating_duration_since(epoch);
    let start = deadline.as_secs_f64() - own;
    if start <= 0.0 {
        0
    } else {
        (start * 1e6) as u64
    }
}

/// Prefill tokens a new request of `priority` waits behind, by the snapshot `m`.
fn tokens_ahead(m: &Metrics, priority: i32) -> usize {
    if m.priority_first {
        m.pending_prefill_by_priority
            .iter()
            .filter(|(p, _)| *p <= priority)
            .map(|(_, n)| n)
            .sum()
    } else {
        m.pending_prefill_tokens
    }
}

/// Refuses a request of `priority` whose first-token target the snapshot `m` predicts it
/// cannot meet. Admitted, it gives the prediction and the target, in seconds, for the record
/// (`None` without a target or a trained model).
pub(crate) fn admit(
    m: &Metrics,
    prompt_len: usize,
    priority: i32,
    slo: &Slo,
) -> Result<Option<(f64, f64)>> {
    let Some(ttft) = slo.ttft else {
        return Ok(None);
    };
    if !m.cost_ready {
        return Ok(None);
    }
    let model = CostModel::new(m.cost);
    let target = ttft.as_secs_f64();
    let predict = |ahead| {
        predict_first_token(
            &model,
            ahead,
            prompt_len,
            m.max_num_batched_tokens,
            m.decoding,
            m.kv_blocks_read,
        )
    };
    let alone = predict_first_token(&model, 0, prompt_len, m.max_num_batched_tokens, 0, 0);
    if alone > target && !slo.best_effort {
        return Err(EngineError::Request(format!(
            "a time-to-first-token target of {} ms cannot be met for a {prompt_len}-token \
             prompt: its prefill alone is predicted to take {:.0} ms on this engine",
            ttft.as_millis(),
            alone * 1e3
        )));
    }
    let ahead = tokens_ahead(m, priority);
    let predicted = predict(ahead);
    if predicted > target && !slo.best_effort {
        // The target is met once the work ahead has gone down by the excess (if nothing
        // arrives meanwhile).
        let excess = predicted - target;
        return Err(EngineError::Unmeetable {
            msg: format!(
                "the first token is predicted after {:.0} ms ({} prompt tokens queued ahead), \
                 past the target of {} ms; retry in {:.1} s",
                predicted * 1e3,
                ahead,
                ttft.as_millis(),
                excess
            ),
            retry_after: Duration::from_secs_f64(excess),
        });
    }
    Ok(Some((predicted, target)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a fake cost (1 ms a prefill token, 10 ms a step), a budget of 100: the queue ahead
    /// (under a priority-first policy, only work of the request's priority or better) decides; the retry time is the excess; an untrained model or a best-effort request is
    /// never refused; a target the prompt alone cannot meet is the client's error.
    #[test]
    fn refusals_follow_the_predicted_first_token() {
        let m = Metrics {
            cost: [0.01, 0.001, 0.0, 0.0],
            cost_ready: true,
            max_num_batched_tokens: 100,
            pending_prefill_tokens: 900,
            ..Metrics::default()
        };
        let slo = |ms| Slo {
            ttft: Some(Duration::from_millis(ms)),
            ..Slo::default()
        };
        // 1000 tokens: 10 steps of 110 ms.
        assert!(admit(&m, 100, 0, &slo(1200)).is_ok());
        match admit(&m, 100, 0, &slo(600)) {
            Err(EngineError::Unmeetable { retry_after, msg }) => {
                assert!((retry_after.as_secs_f64() - 0.5).abs() < 1e-6, "{msg}");
                assert!(msg.contains("900 prompt tokens queued ahead"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        assert!(admit(
            &m,
            100,
            0,
            &Slo {
                best_effort: true,
                ..slo(600)
            }
        )
        .is_ok());
        assert!(admit(
            &Metrics {
                cost_ready: false,
                ..m.clone()
            },
            100,
            0,
            &slo(600)
        )
        .is_ok());
        assert!(matches!(
            admit(&m, 1000, 0, &slo(500)),
            Err(EngineError::Request(msg)) if msg.contains("alone")
        ));
        // A TPOT target alone refuses nothing at submission.
        let tpot = Slo {
            tpot: Some(Duration::from_millis(1)),
            ..Slo::default()
        };
        assert!(admit(&m, 1000, 0, &tpot).is_ok());
        // Strictly by priority: of the 900 tokens, 600 (running or waiting) are of priority 1
        // and yield to a request of priority 0; priority 0's 300 are ahead of it.
        let by = Metrics {
            pending_prefill_by_priority: vec![(0, 300), (1, 600)],
            priority_first: true,
            ..m.clone()
        };
        // 400 tokens: 4 steps of 110 ms.
        assert!(admit(&by, 100, 0, &slo(600)).is_ok());
        assert!(
            admit(&by, 100, 1, &slo(600)).is_err(),
            "its own priority waits behind all"
        );
        assert!(admit(
            &Metrics {
                priority_first: false,
                ..by
            },
            100,
            0,
            &slo(600)
        )
        .is_err());
    }

    /// The record's ratio is 1 until it holds `RECORD_MIN` observations, then the median
    /// ratio of the predictions near their targets (all of them while too few are), within
    /// its bounds, over the last `RECORD_LEN`; bad values are ignored.
    #[test]
    fn the_first_token_record_gives_the_median_ratio_near_the_targets() {
        let mut r = FirstTokenRecord::default();
        for _ in 0..RECORD_MIN - 1 {
            r.observe(0.5, 1.0, 1.0);
        }
        r.observe(f64::NAN, 1.0, 1.0);
        r.observe(0.5, -1.0, 1.0);
        assert_eq!((r.ratio(), r.total()), (1.0, RECORD_MIN as u64 - 1));
        r.observe(0.5, 1.5, 1.0);
        // Seven ratios of 2, one of 3.
        assert_eq!(r.ratio(), 2.0);
        // Short predictions (under a quarter of the target) do not count once enough long
        // ones do: fixed overheads would overstate the ratio where refusals are decided.
        for _ in 0..RECORD_MIN * 2 {
            r.observe(0.01, 0.1, 1.0);
        }
        assert_eq!(r.ratio(), 2.0);
        // Too few long ones: all count.
        let mut short = FirstTokenRecord::default();
        for i in 0..RECORD_MIN {
            short.observe(0.1, 0.1 * (1.0 + i as f64 / 10.0), 1.0);
        }
        assert!((short.ratio() - 1.35).abs() < 1e-9, "{}", short.ratio());
        // The last RECORD_LEN only, and bounded.
        for _ in 0..RECORD_LEN {
            r.observe(0.5, 50.0, 1.0);
        }
        assert_eq!(r.ratio(), RATIO_RANGE.1);
        for _ in 0..RECORD_LEN {
            r.observe(0.5, 0.1, 1.0);
        }
        assert_eq!(r.ratio(), RATIO_RANGE.0);
    }

    /// Admission gives the record its prediction and the target, a best-effort request's too
    /// (never refused); nothing without a target or a trained model.
    #[test]
    fn admission_gives_the_record_its_prediction() {
        let m = Metrics {
            cost: [0.01, 0.001, 0.0, 0.0],
            cost_ready: true,
            max_num_batched_tokens: 100,
            pending_prefill_tokens: 400,
            ..Metrics::default()
        };
        let slo = Slo {
            ttft: Some(Duration::from_millis(800)),
            ..Slo::default()
        };
        // 500 tokens: 5 steps of 110 ms.
        let got = admit(&m, 100, 0, &slo).unwrap().unwrap();
        assert!(
            (got.0 - 0.55).abs() < 1e-9 && (got.1 - 0.8).abs() < 1e-9,
            "{got:?}"
        );
        let late = Metrics {
            pending_prefill_tokens: 900,
            ..m.clone()
        };
        assert!(admit(&late, 100, 0, &slo).is_err());
        let best = Slo {
            best_effort: true,
            ..slo
        };
        let got = admit(&late, 100, 0, &best).unwrap().unwrap();
        assert!((got.0 - 1.1).abs() < 1e-9, "{got:?}");
        assert_eq!(admit(&m, 100, 0, &Slo::default()).unwrap(), None);
        let untrained = Metrics {
            cost_ready: false,
            ..m
        };
        assert_eq!(admit(&untrained, 100, 0, &slo).unwrap(), None);
    }
}
