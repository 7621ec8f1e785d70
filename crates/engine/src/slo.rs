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
//! Under `--scheduling slo`, [`latest_start`] gives the scheduler each request's slack.
//!
//! Invariants: nothing is refused before the model has seen enough steps to be trusted, nor a
//! best-effort request.

use crate::metrics::Metrics;
use crate::request::Slo;
use crate::requests::ReqState;
use crate::{EngineError, Result};
use ferrum_scheduler::{predict_first_token, CostModel, StepShape, NO_DEADLINE};
use std::time::{Duration, Instant};

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
/// cannot meet.
pub(crate) fn admit(m: &Metrics, prompt_len: usize, priority: i32, slo: &Slo) -> Result<()> {
    let Some(ttft) = slo.ttft else {
        return Ok(());
    };
    if slo.best_effort || !m.cost_ready {
        return Ok(());
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
    if alone > target {
        return Err(EngineError::Request(format!(
            "a time-to-first-token target of {} ms cannot be met for a {prompt_len}-token \
             prompt: its prefill alone is predicted to take {:.0} ms on this engine",
            ttft.as_millis(),
            alone * 1e3
        )));
    }
    let ahead = tokens_ahead(m, priority);
    let predicted = predict(ahead);
    if predicted > target {
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
    Ok(())
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
}
